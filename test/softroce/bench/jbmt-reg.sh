#!/bin/bash
# lab: guests=1 timeout=900 gobuild=./cmd/jbmtperf
#
# JBMT registration against RDMA's own, in one process (cmd/jbmtperf -t
# reg): jbmt.Register of a fresh buffer from 4 KiB to 1 GiB (twice the
# guest's RAM is not needed: nothing is touched or pinned) against
# ibv_reg_mr of the same memory, pinned, up to 256 MiB, and with
# IBV_ACCESS_ON_DEMAND on a 7.x guest. Medians of 20 per size; the last
# line gives each kind's largest/smallest ratio (the paper: flat, 1.32 µs
# and 0.25 µs at every size; the target: within 2x of 4 KiB at every size).
set -euo pipefail
for rep in 1 2; do
	echo "# repetition $rep"
	"$LAB_BIN/jbmtperf" -d "$LAB_DEVICE" -t reg -min 4096 -max $((1 << 30)) -pinned-max $((256 << 20)) -n 20
done
