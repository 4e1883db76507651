#!/bin/bash
# lab: guests=2 timeout=240
# lab: gotest=./pkg/activeaccess/perftest
#
# perftest as an Active Access source: unmodified ib_write_bw and
# ib_read_bw on guest 2 run against a target on guest 1 that answers
# perftest's side channel (pkg/activeaccess/perftest); every byte they
# write or read reaches the handler once, with its data (W=0 keeps writes
# out of memory; reads are logged with the data served), and the module
# refuses, loses and skips nothing. A client that fills a log whose handler
# is stuck fails with a completion error (the module refuses the write that
# does not fit) and the handler gets exactly the writes that were logged.
set -euo pipefail
lab_gotest perftest -test.v -test.run '^TestLabPerftest' -test.timeout 200s
