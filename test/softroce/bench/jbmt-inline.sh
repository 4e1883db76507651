#!/bin/bash
# lab: guests=1 timeout=900 gobuild=./cmd/jbmtperf
#
# Where small sections should stop carrying their data in the messages
# (the module parameter jbmt_inline_bytes), over loopback: one Peer.Get
# or Peer.Put at a time of 4 KiB and of 8 KiB (cmd/jbmtperf -t lat,
# medians and 99th percentiles of 500) with the threshold at 0 (every
# section registered and its data written by RDMA), 4096 and 8192, beside
# perftest's ib_read_lat and ib_write_lat at the same sizes (the anchor:
# t_typical and the 99th percentile). Three repetitions, alternated.
# Under TCG only ratios mean something (docs/benchmarks.md).
set -euo pipefail
param=/sys/module/rdmaplus/parameters/jbmt_inline_bytes
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
was=$(cat $param)
for rep in 1 2 3; do
	for th in 0 4096 8192; do
		echo "# repetition $rep: jbmt_inline_bytes $th"
		echo "$th" >$param
		for s in 4096 8192; do
			"$LAB_BIN/jbmtperf" -t lat -addr "$LAB_ADDR" -min "$s" -max "$s" -n 500 | grep -v '^op'
		done
	done
	echo "$was" >$param
	echo "# repetition $rep: perftest (t_typical_us p99_us)"
	for s in 4096 8192; do
		echo "read $s $(plat ib_read_lat "$s")"
		echo "write $s $(plat ib_write_lat "$s")"
	done
done
