#!/bin/bash
# lab: guests=1 timeout=1200 gobuild=./cmd/jbmtperf
#
# The pin cache's effect, in one boot, over loopback: cmd/jbmtperf -t lat
# (one Peer.Get or Peer.Put at a time, 8 B to 256 KiB, the same buffers
# every time) and -t bw (64 KiB to 4 MiB, 128 MiB per size) with the
# module's jbmt_pin_cache on and off, alternated, and perftest's
# ib_read_lat and ib_write_bw at the same sizes (the anchor: memory pinned
# and registered once). With the cache on, both sides find each section's
# pages already pinned after the first transfer; off, every section is
# pinned anew. Two repetitions. Under TCG only the ratios mean something
# (docs/benchmarks.md).
set -euo pipefail
source "$LAB_DIR/test/softroce/bench/lib/perftest-bw-loopback.sh"
param=/sys/module/rdmaplus/parameters/jbmt_pin_cache
plat() {
	local s=$1
	ib_read_lat -F -d "$LAB_DEVICE" -x 1 -s "$s" -n 500 >/tmp/lat.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	ib_read_lat -F -d "$LAB_DEVICE" -x 1 -s "$s" -n 500 127.0.0.1 >/tmp/lat.cli 2>&1 ||
		{ cat /tmp/lat.cli; lab_fail "ib_read_lat client failed"; }
	wait $srv || { cat /tmp/lat.srv; lab_fail "ib_read_lat server failed"; }
	awk -v s="$s" '$1 == s && $2 == 500 { print $5, $8 }' /tmp/lat.cli | tail -1
}
stat() { cat /sys/kernel/rdmaplus/jbmt/"$1"; }
for rep in 1 2; do
	for cache in Y N; do
		echo "$cache" >"$param"
		h0=$(stat pin_cache_hits) m0=$(stat pin_cache_misses)
		echo "# repetition $rep: jbmtperf, pin cache $cache"
		"$LAB_BIN/jbmtperf" -t lat -addr "$LAB_ADDR" -min 8 -max $((256 << 10)) -n 500
		"$LAB_BIN/jbmtperf" -t bw -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((128 << 20))
		echo "# pin cache $cache: $(($(stat pin_cache_hits) - h0)) hits, $(($(stat pin_cache_misses) - m0)) misses"
	done
	echo "# repetition $rep: perftest ib_read_lat (t_typical_us p99_us), ib_write_bw (MB/s)"
	for s in 8 4096 32768 262144; do
		echo "read $s $(plat "$s")"
	done
	for s in 65536 262144 1048576 4194304; do
		v=$(write_bw_loopback "$s" $(((128 << 20) / s))) || lab_fail "ib_write_bw -s $s failed"
		echo "write $s $v"
	done
done
echo Y >"$param"
