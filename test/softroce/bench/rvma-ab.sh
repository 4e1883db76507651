#!/bin/bash
# lab: guests=2 smp=1 timeout=1800 gobuild=./cmd/rdmaperf
#
# Figure 4's ratios between two guests of one vCPU each, measured in one
# pair of processes: in each round, rdmaperf -ab runs a block of the RVMA
# put ping-pong (a), then blocks as long of (b1) WRITE + SEND behind it,
# (b2) the SEND after the WRITE's completion and (c) write_lat on a QP
# between the same two processes, so that each ratio compares moments a
# fraction of a second apart. Separate runs in one boot drift by more than
# the differences measured (write_lat alone: 494 to 961 usec at 8 B in one
# boot). Prints, per size and repetition, on guest 2:
#   CLI rdmaperf-ab rvma_lat <bytes>: # ab: (a)/(b1), (a)/(b2), (a)/(c):
#     median and quartiles of the rounds' ratios; t_typical medians
set -euo pipefail
REPS=${REPS:-2}
SIZES=${SIZES:-"8 4096"}

source "$LAB_DIR/test/softroce/bench/lib/rvma-pair.sh"

# 30 rounds of four blocks; a block of 200 iterations up to 4 KiB, fewer
# for larger sizes so that each size takes about two minutes between
# guests (SIZES="8 512 4096 32768 262144 1048576" covers Figure 4).
abIters() { # size
	echo $(( $1 >= 1048576 ? 300 : $1 >= 262144 ? 1200 : $1 >= 32768 ? 3000 : 6000 ))
}

for rep in $(seq "$REPS"); do
	for s in $SIZES; do
		rdmaperf rdmaperf-ab rvma_lat "$s" -ab 30 -n "$(abIters "$s")"
	done
done
