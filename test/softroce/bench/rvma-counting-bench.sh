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
P="$LAB_BIN/rdmaperf"
REPS=2
LAT_SIZES="8 4096 65536"
BW_SIZES="262144"
server=$(lab_peer 1)

iters() { # size test: a one-way trip costs about 1 ms, TCG moves ~15 MB/s between guests
	if [ "${2%_bw}" != "$2" ]; then
		echo $(( $1 >= 1048576 ? 160 : $1 >= 262144 ? 320 : 640 ))
	else
		echo $(( $1 >= 1048576 ? 30 : $1 >= 262144 ? 60 : $1 >= 32768 ? 200 : 500 ))
	fi
}

perftest() { # test size
	local t=$1 s=$2 n
	n=$(iters "$s" "$t")
	lab_pair perftest 18515 "$t" "$s" ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" -- ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" "$server"
}

rdmaperf() { # name test size [flags]
	local name=$1 t=$2 s=$3 n
	shift 3
	n=$(iters "$s" "$t")
	lab_pair "$name" 18516 "$t" "$s" "$P" -d "$LAB_DEVICE" -timeout 10m -- "$P" -d "$LAB_DEVICE" -t "$t" -s "$s" -n "$n" -timeout 10m "$@" "$server"
}

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
