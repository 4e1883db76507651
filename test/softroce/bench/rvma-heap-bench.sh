#!/bin/bash
# lab: guests=2 smp=1 timeout=2400 gobuild=./cmd/rdmaperf
#
# RVMA puts from and Gets into Go memory (rdmaperf -src heap: pkg/rvma
# copies through registered memory) against endpoint memory (zero copy),
# between two one-vCPU guests, three repetitions interleaved in one boot
# (about 12 minutes): rvma_lat at 8 B and 4 KiB, rvma_bw at 4 KiB,
# rvma_get_lat at 8 B and 4 KiB. If
# $LAB_BIN/rdmaperf-old exists (an older build, for an A/B), it runs its
# -src heap as well. Results are printed as
#   BENCH <tool> <test> <bytes> <t_typical usec | MB/s>
# on guest 2 (tool heap, endpoint, old-heap).
set -euo pipefail

source "$LAB_DIR/test/softroce/bench/lib/rvma-pair.sh"

NEW=$LAB_BIN/rdmaperf OLD=$LAB_BIN/rdmaperf-old
for rep in 1 2 3; do
	for spec in rvma_lat:8 rvma_lat:4096 rvma_bw:4096 rvma_get_lat:8 rvma_get_lat:4096; do
		t=${spec%:*} s=${spec#*:}
		if [ -x "$OLD" ]; then
			P=$OLD
			rdmaperf old-heap "$t" "$s" -src heap
		fi
		P=$NEW
		rdmaperf heap "$t" "$s" -src heap
		rdmaperf endpoint "$t" "$s"
	done
done
