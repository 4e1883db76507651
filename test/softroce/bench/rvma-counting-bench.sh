#!/bin/bash
# lab: guests=2 smp=1 timeout=3600 gobuild=./cmd/rdmaperf
#
# RVMA put latency and bandwidth between two one-vCPU guests with the
# kernel module counting puts (rvma_lat -counting module: plain WRITEs,
# the record written by the module, Posted.Spin polling it) against the
# library counting them (-counting library: WRITE WITH IMMEDIATE), next to
# (c) write_lat, write_imm_lat, (b1) write_send_lat, (b2)
# write_wait_send_lat and perftest, interleaved size by size, twice in
# one boot (about 12 minutes). Results are printed as
#   BENCH <tool> <test> <bytes> <t_typical usec | MB/s>
# on guest 2 (tool rdmaperf-module, rdmaperf-library, rdmaperf, perftest).
set -euo pipefail
REPS=2
LAT_SIZES="8 4096 65536"
BW_SIZES="262144"

source "$LAB_DIR/test/softroce/bench/lib/rvma-pair.sh"

for rep in $(seq "$REPS"); do
	for s in $LAT_SIZES; do
		rdmaperf rdmaperf-module rvma_lat "$s" -counting module
		rdmaperf rdmaperf-library rvma_lat "$s" -counting library
		rdmaperf rdmaperf write_lat "$s"
		rdmaperf rdmaperf write_imm_lat "$s"
		rdmaperf rdmaperf write_send_lat "$s"
		rdmaperf rdmaperf write_wait_send_lat "$s"
		perftest write_lat "$s"
	done
	for s in $BW_SIZES; do
		perftest write_bw "$s"
		rdmaperf rdmaperf-module rvma_bw "$s" -counting module
		rdmaperf rdmaperf-library rvma_bw "$s" -counting library
	done
	[ "$LAB_ROLE" = server ] || echo "== repetition $rep done"
done
