#!/bin/bash
# lab: guests=2 smp=1 timeout=1800 gobuild=./cmd/rdmaperf
#
# Figure 4's (a)/(c) between two guests of one vCPU each, measured in one
# pair of processes: rdmaperf -ab alternates blocks of the RVMA put
# ping-pong (a) with blocks of write_lat (c) on a QP between the same two
# processes, so that each ratio compares moments a fraction of a second
# apart. Separate runs in one boot drift by more than the difference
# measured (write_lat alone: 494 to 961 usec at 8 B in one boot).
# Prints, per size and repetition, on guest 2:
#   CLI rdmaperf-ab rvma_lat <bytes>: # ab: <pairs> pairs of <n> iterations:
#     (a)/(c) median, quartiles; t_typical medians of (a) and (c)
set -euo pipefail
REPS=${REPS:-2}
SIZES=${SIZES:-"8 4096"}

source "$LAB_DIR/test/softroce/bench/lib/rvma-pair.sh"

for rep in $(seq "$REPS"); do
	for s in $SIZES; do
		rdmaperf rdmaperf-ab rvma_lat "$s" -ab 40 -n 8000
	done
done
