#!/bin/bash
# lab: guests=1 timeout=900 gobuild=./cmd/jbmtperf
#
# JBMT under a pin budget (cmd/jbmtperf -t sweep): gets of 256 KiB over
# loopback by 1, 4 and 16 services (each its own file, as processes would
# have) for 2 s at each budget from 1 to 1024 pages: aggregate MB/s,
# Jain's fairness index over the services' bytes, and the NACKs and
# budget waits the module counted. At one page every section is 4 KiB
# and operations take turns; from 64 pages on, a 256 KiB get fits whole.
set -euo pipefail
"$LAB_BIN/jbmtperf" -t sweep -addr "$LAB_ADDR" -max $((256 << 10)) -budgets 1,4,16,64,256,1024 -procs 1,4,16 -dur 2s
