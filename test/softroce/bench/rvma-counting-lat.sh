#!/bin/bash
# lab: guests=2 smp=1 timeout=1800 gobuild=./cmd/rdmaperf
#
# RVMA put latency at 8 bytes between two one-vCPU guests, the kernel
# module counting (rvma_lat -counting module) against the library
# counting (-counting library) and (c) write_lat, interleaved six times
# in one boot (about 3 minutes): enough repetitions for medians under
# TCG's noise. -ctxsw adds each side's context switches, system calls,
# notices and buffer waits per iteration. Results are printed as
#   BENCH <tool> <test> <bytes> <t_typical usec>
# on guest 2 (tool rdmaperf-module, rdmaperf-library, rdmaperf).
set -euo pipefail
REPS=6

source "$LAB_DIR/test/softroce/bench/lib/rvma-pair.sh"

for rep in $(seq "$REPS"); do
	rdmaperf rdmaperf-module rvma_lat 8 -counting module -ctxsw
	rdmaperf rdmaperf-library rvma_lat 8 -counting library -ctxsw
	rdmaperf rdmaperf write_lat 8
done
