#!/bin/bash
# lab: guests=1 timeout=900 gobuild=./cmd/jbmtperf
#
# Asynchronous JBMT gets over loopback (cmd/jbmtperf -t async): bandwidth
# with 8 gets in flight, 64 KiB to 4 MiB each, and where one get's time
# goes (queued to a kernel worker, the first section's round trip, the
# rest, the caller's wake-up; medians of 100, from the completions'
# times), beside the blocking gets of jbmtperf -t bw and perftest's
# ib_write_bw (the anchor) in the same boot. Under TCG only ratios mean
# something (docs/benchmarks.md).
set -euo pipefail
source "$LAB_DIR/test/softroce/bench/lib/write-bw-loopback.sh"
for rep in 1 2; do
	echo "# repetition $rep: jbmtperf -t async (window 8)"
	"$LAB_BIN/jbmtperf" -t async -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((128 << 20)) -window 8 -n 100
	echo "# repetition $rep: jbmtperf -t bw (blocking, one at a time)"
	"$LAB_BIN/jbmtperf" -t bw -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((128 << 20))
	echo "# repetition $rep: ib_write_bw (MB/s)"
	for s in 65536 262144 1048576 4194304; do
		v=$(write_bw_loopback "$s" $(((128 << 20) / s))) || lab_fail "ib_write_bw -s $s failed"
		echo "write $s $v"
	done
done
