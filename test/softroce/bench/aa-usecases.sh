#!/bin/bash
# lab: guests=2 smp=1 timeout=900 gobuild=./test/softroce/bench/aa-usecase-bench
#
# The Active Access use cases' costs, in one boot of two guests (guest 1 the
# target, guest 2 the source), by test/softroce/bench/aa-usecase-bench:
#
# get-logging overhead: one source's gets per second (8-byte gets as in the
# paper's section 5.2.3, and 4 KiB gets) on three regions of the target:
# plain pages (no logging), pages whose gets are logged with their data
# (RLD) by a handler that only counts them (the module's copy and the
# runtime's reading), and RLD pages of pkg/activeaccess/getlog (also the
# records written to files); 25 short rounds in this boot, the order
# rotating, one vCPU per guest so the two guests do not share a core. The
# figures are the medians of the per-round ratios to the plain pages
# (paper: 1-5% overhead; target: at most 10%).
#
# log throughput: entries per second that one handler goroutine drains from
# a backlog: guest 2 fills two logs (one polling domain, one eventfd domain,
# 15000 metadata entries each from 8-byte puts) while their handlers are
# held, then the target releases them chunk by chunk (10 chunks of 1500,
# alternating the domains) and times each chunk; the medians.
#
# Every figure is a line "FIGURE <name> <value> <unit>", kept in
# $LAB_OUT/aa-usecases.txt.
set -euo pipefail
out="$LAB_OUT/aa-usecases.txt"
: >"$out"
run() { lab_tee "$out" "$LAB_BIN/aa-usecase-bench" "$@"; }
run getlog -size 8 -gets ${GETLOG_GETS:-400} -rounds ${GETLOG_ROUNDS:-25}
run getlog -size 4096 -gets ${GETLOG_GETS_4K:-200} -rounds ${GETLOG_ROUNDS:-25}
run drain -entries ${DRAIN_ENTRIES:-30000}
echo "== figures (guest $LAB_INDEX)"
grep '^FIGURE' "$out" || echo "(none here: the other guest printed them)"
