#!/bin/bash
# lab: guests=1 timeout=1200 gobuild=./cmd/jbmtperf
#
# Asynchronous JBMT gets over loopback (cmd/jbmtperf -t async): bandwidth
# with 8 gets in flight, 64 KiB to 4 MiB each, with sections of 256 KiB
# (the default), 64 KiB and 16 KiB (jbmt_section_pages 64, 16, 4), and
# where one get's time goes (queued to a kernel worker, the first
# section's round trip, the rest, the caller's wake-up; medians of 100,
# from the completions' times); beside them the blocking gets of
# jbmtperf -t bw and the anchors in the same boot: perftest's ib_write_bw
# (the fastest transfer between pinned buffers) and ib_read_bw (the same
# direction as a get: the initiator pulls). Two repetitions, alternated.
# Under TCG only ratios mean something (docs/benchmarks.md).
set -euo pipefail
source "$LAB_DIR/test/softroce/bench/lib/perftest-bw-loopback.sh"
sect=/sys/module/rdmaplus/parameters/jbmt_section_pages
for rep in 1 2; do
	for pages in 64 16 4; do
		echo "# repetition $rep: jbmtperf -t async (window 8), sections of $pages pages"
		echo "$pages" >"$sect"
		"$LAB_BIN/jbmtperf" -t async -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((128 << 20)) -window 8 -n 100
	done
	echo 64 >"$sect"
	echo "# repetition $rep: jbmtperf -t bw (blocking, one at a time)"
	"$LAB_BIN/jbmtperf" -t bw -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((128 << 20))
	echo "# repetition $rep: ib_write_bw and ib_read_bw (MB/s)"
	for s in 65536 262144 1048576 4194304; do
		v=$(write_bw_loopback "$s" $(((128 << 20) / s))) || lab_fail "ib_write_bw -s $s failed"
		echo "write $s $v"
		v=$(read_bw_loopback "$s" $(((128 << 20) / s))) || lab_fail "ib_read_bw -s $s failed"
		echo "read $s $v"
	done
done
