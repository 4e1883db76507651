#!/bin/bash
# lab: guests=1 timeout=900 gobuild=./cmd/jbmtperf
#
# JBMT transfer bandwidth against RDMA WRITE between pinned buffers, in one
# boot, over loopback: cmd/jbmtperf -t bw (Peer.Get and Peer.Put of 64 KiB
# to 4 MiB between a Go buffer and a registered region, nothing pinned
# beforehand: every section is pinned on both sides, registered (FRWR) and
# revoked as it moves) and perftest's ib_write_bw at the same sizes (the
# anchor: memory pinned and registered once). Two repetitions, alternated.
# Under TCG only the ratio means something (docs/benchmarks.md).
set -euo pipefail
source "$LAB_DIR/test/softroce/bench/lib/perftest-bw-loopback.sh"
for rep in 1 2; do
	echo "# repetition $rep: jbmtperf"
	"$LAB_BIN/jbmtperf" -t bw -addr "$LAB_ADDR" -min 65536 -max $((4 << 20)) -bytes $((128 << 20))
	echo "# repetition $rep: ib_write_bw (MB/s)"
	for s in 65536 262144 1048576 4194304; do
		v=$(write_bw_loopback "$s" $(((128 << 20) / s))) || lab_fail "ib_write_bw -s $s failed"
		echo "write $s $v"
	done
done
