#!/bin/bash
# lab: guests=1 timeout=900 gobuild=./cmd/jbmtperf
#
# JBMT transfer latency against RDMA READ and WRITE between pinned buffers,
# in one boot, over loopback: cmd/jbmtperf -t lat (one Peer.Get or
# Peer.Put at a time, 8 B to 512 KiB, page-aligned buffers, nothing
# pinned beforehand: each section is pinned on both sides, registered and
# revoked as it moves; median and 99th percentile) and perftest's
# ib_read_lat and ib_write_lat at the same sizes (the anchor: t_typical
# and the 99th percentile). Two repetitions, alternated. Under TCG only the
# ratio means something (docs/benchmarks.md).
set -euo pipefail
plat() {
	local t=$1 s=$2
	$t -F -d "$LAB_DEVICE" -x 1 -s "$s" -n 500 >/tmp/lat.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	$t -F -d "$LAB_DEVICE" -x 1 -s "$s" -n 500 127.0.0.1 >/tmp/lat.cli 2>&1 ||
		{ cat /tmp/lat.cli; lab_fail "$t client failed"; }
	wait $srv || { cat /tmp/lat.srv; lab_fail "$t server failed"; }
	awk -v s="$s" '$1 == s && $2 == 500 { print $5, $8 }' /tmp/lat.cli | tail -1
}
for rep in 1 2; do
	echo "# repetition $rep: jbmtperf"
	"$LAB_BIN/jbmtperf" -t lat -addr "$LAB_ADDR" -min 8 -max $((512 << 10)) -n 500
	echo "# repetition $rep: perftest (t_typical_us p99_us)"
	for s in 8 64 512 4096 32768 262144; do
		echo "read $s $(plat ib_read_lat "$s")"
		echo "write $s $(plat ib_write_lat "$s")"
	done
done
