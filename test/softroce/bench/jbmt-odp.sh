#!/bin/bash
# lab: guests=1 timeout=900 gobuild=./cmd/jbmtperf kernels=sid
#
# JBMT against rxe's on-demand paging on a 7.x guest, in one boot over
# loopback: blocking and asynchronous JBMT gets (cmd/jbmtperf -t bw and
# -t async), perftest's ib_write_bw with its buffers pinned and
# registered, and the same with --odp (registered with
# IBV_ACCESS_ON_DEMAND: nothing pinned; rxe faults pages in as packets
# arrive). Path MTU 4096 (rxe's ODP copy in 7.2 and 7.3 places a packet
# right only if it starts on a page: docs/kmod.md). Two repetitions.
set -euo pipefail
wbw() {
	local s=$1 n=$2
	shift 2
	ib_write_bw -F -d "$LAB_DEVICE" -x 1 -m 4096 -s "$s" -n "$n" "$@" >/tmp/bw.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	ib_write_bw -F -d "$LAB_DEVICE" -x 1 -m 4096 -s "$s" -n "$n" "$@" 127.0.0.1 >/tmp/bw.cli 2>&1 ||
		{ cat /tmp/bw.cli; echo "ib_write_bw $* failed"; wait $srv || true; return 0; }
	wait $srv || { cat /tmp/bw.srv; echo "ib_write_bw server $* failed"; return 0; }
	awk -v s="$s" -v n="$n" '{ for (i = 1; i < NF - 2; i++) if ($i == s && $(i + 1) == n && $(i + 3) ~ /^[0-9.]+$/) print $(i + 3) }' /tmp/bw.cli | tail -1
}
for rep in 1 2; do
	echo "# repetition $rep: jbmtperf -t bw (blocking)"
	"$LAB_BIN/jbmtperf" -t bw -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((64 << 20))
	echo "# repetition $rep: jbmtperf -t async (window 8)"
	"$LAB_BIN/jbmtperf" -t async -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((64 << 20)) -window 8 -n 20
	echo "# repetition $rep: ib_write_bw pinned, then --odp (MB/s)"
	for s in 65536 262144 1048576 4194304; do
		echo "write $s $(wbw "$s" $(((64 << 20) / s))) odp $(wbw "$s" $(((64 << 20) / s)) --odp)"
	done
done
