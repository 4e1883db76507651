#!/bin/bash
# lab: guests=1 timeout=840 gobuild=./cmd/jbmtperf
#
# JBMT transfer latency with the region's pages warm, cold and paged out,
# against RDMA READ and WRITE between pinned buffers, in one boot, over
# loopback, 1 B to 4 MiB: cmd/jbmtperf -t lat -state warm|cold|pageout
# (one Peer.Get or Peer.Put at a time; before each, outside the timed part,
# the region's pages are left in the pin cache, dropped from it and from
# memory, or swapped out to zram; every transfer checked byte for byte)
# and perftest's ib_read_lat and ib_write_lat at the same sizes (the
# anchor: t_typical and the 99th percentile; server on CPU 0, client on
# CPU 1, as elsewhere: ib_write_lat spins on memory, and unpinned its two
# spinning processes leave rxe a timer tick). Each size makes
# min(N, max(11, BYTES/size)) transfers, perftest as many iterations.
# Two repetitions, alternated. Under TCG only the ratios mean something
# (docs/benchmarks.md).
set -euo pipefail
SIZES="1 8 64 512 4096 32768 262144 2097152 4194304"
N=200
BYTES=$((64 << 20))
REPS=2
[ -e /sys/block/zram0 ] || lab_fail "no zram device: the guest kernel has no zram module (test/softroce/guest/modules)"
echo 1G >/sys/block/zram0/disksize
mkswap /dev/zram0 >/dev/null
swapon /dev/zram0
grep -q zram0 /proc/swaps || lab_fail "swap on zram0 is not on"
iters() { local n=$((BYTES / $1)); ((n < 11)) && n=11; ((n > N)) && n=$N; echo "$n"; }
plat() {
	local t=$1 s=$2 n
	n=$(iters "$s")
	taskset -c 0 $t -F -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" >/tmp/lat.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	taskset -c 1 $t -F -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" 127.0.0.1 >/tmp/lat.cli 2>&1 ||
		{ cat /tmp/lat.cli; lab_fail "$t client failed"; }
	wait $srv || { cat /tmp/lat.srv; lab_fail "$t server failed"; }
	awk -v s="$s" -v n="$n" '$1 == s && $2 == n { print $5, $8 }' /tmp/lat.cli | tail -1
}
for rep in $(seq "$REPS"); do
	for state in warm cold pageout; do
		echo "# repetition $rep: jbmtperf -state $state"
		"$LAB_BIN/jbmtperf" -t lat -addr "$LAB_ADDR" -state "$state" -sizes "${SIZES// /,}" -n "$N" -bytes "$BYTES"
	done
	echo "# repetition $rep: perftest (t_typical_us p99_us)"
	for s in $SIZES; do
		echo "read $s $(plat ib_read_lat "$s")"
		echo "write $s $(plat ib_write_lat "$s")"
	done
done
