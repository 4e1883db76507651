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
wbw() {
	local s=$1 n=$2
	ib_write_bw -F -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" >/tmp/bw.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	ib_write_bw -F -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" 127.0.0.1 >/tmp/bw.cli 2>&1 ||
		{ cat /tmp/bw.cli; lab_fail "ib_write_bw client failed"; }
	wait $srv || { cat /tmp/bw.srv; lab_fail "ib_write_bw server failed"; }
	awk -v s="$s" -v n="$n" '{ for (i = 1; i < NF - 2; i++) if ($i == s && $(i + 1) == n && $(i + 3) ~ /^[0-9.]+$/) print $(i + 3) }' /tmp/bw.cli | tail -1
}
for rep in 1 2; do
	echo "# repetition $rep: jbmtperf -t async (window 8)"
	"$LAB_BIN/jbmtperf" -t async -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((128 << 20)) -window 8 -n 100
	echo "# repetition $rep: jbmtperf -t bw (blocking, one at a time)"
	"$LAB_BIN/jbmtperf" -t bw -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((128 << 20))
	echo "# repetition $rep: ib_write_bw (MB/s)"
	for s in 65536 262144 1048576 4194304; do
		echo "write $s $(wbw "$s" $(((128 << 20) / s)))"
	done
done
