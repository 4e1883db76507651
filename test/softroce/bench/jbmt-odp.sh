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
source "$LAB_DIR/test/softroce/bench/lib/perftest-bw-loopback.sh"
for rep in 1 2; do
	echo "# repetition $rep: jbmtperf -t bw (blocking)"
	"$LAB_BIN/jbmtperf" -t bw -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((64 << 20))
	echo "# repetition $rep: jbmtperf -t async (window 8)"
	"$LAB_BIN/jbmtperf" -t async -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((64 << 20)) -window 8 -n 20
	echo "# repetition $rep: ib_write_bw pinned, then --odp (MB/s)"
	for s in 65536 262144 1048576 4194304; do
		n=$(((64 << 20) / s))
		pinned=$(write_bw_loopback "$s" "$n" -m 4096) || pinned=failed
		odp=$(write_bw_loopback "$s" "$n" -m 4096 --odp) || odp=failed
		echo "write $s $pinned odp $odp"
	done
done
