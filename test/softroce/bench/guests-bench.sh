#!/bin/bash
# lab: guests=2 smp=1 timeout=3600 gobuild=./cmd/rdmaperf
#
# The pkg/verbs comparisons between two guests (one vCPU each) instead of
# loopback (RVMA's are in rvma-guests-bench.sh): the server tool on guest
# 1, the client on guest 2, so rxe's responder and the receive completions
# run on the receiver's CPU, as on two hosts. In one boot, interleaved
# size by size, REPS times:
#   latency (t_typical, half a round trip): perftest ib_write_lat,
#     rdmaperf write_lat, read_lat and ib_read_lat, send_lat and
#     ib_send_lat
#   bandwidth (BW average): ib_write_bw, rdmaperf write_bw
# Every result is printed as
#   BENCH <tool> <test> <bytes> <t_typical usec | MB/s>
# on guest 2.
# A one-way trip between two TCG guests costs about 0.6 to 1.1 ms (the
# guests' network stacks and virtio under TCG; ICMP ping: 1.4 ms round
# trip at best), so small-message latency is dominated by it.
set -euo pipefail
P="$LAB_BIN/rdmaperf"
REPS=${REPS:-3}
LAT_SIZES=${LAT_SIZES:-"8 512 4096 32768 262144"}
BW_SIZES=${BW_SIZES:-"65536 262144 1048576"}
server=$(lab_peer 1)

iters() { # size test
	if [ "${2%_bw}" != "$2" ]; then
		echo $(( $1 >= 1048576 ? 160 : $1 >= 262144 ? 320 : 640 ))
	else
		echo $(( $1 >= 262144 ? 60 : $1 >= 32768 ? 200 : 500 ))
	fi
}

perftest() { # test size
	local t=$1 s=$2 n
	n=$(iters "$s" "$t")
	lab_pair perftest 18515 "$t" "$s" ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" -- ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" "$server"
}

rdmaperf() { # test size [flags]
	local t=$1 s=$2 n
	shift 2
	n=$(iters "$s" "$t")
	lab_pair rdmaperf 18516 "$t" "$s" "$P" -d "$LAB_DEVICE" -timeout 10m -- "$P" -d "$LAB_DEVICE" -t "$t" -s "$s" -n "$n" -timeout 10m "$@" "$server"
}

for rep in $(seq "$REPS"); do
	for s in $LAT_SIZES; do
		perftest write_lat "$s"
		rdmaperf write_lat "$s"
		perftest read_lat "$s"
		rdmaperf read_lat "$s"
		perftest send_lat "$s"
		rdmaperf send_lat "$s"
	done
	for s in $BW_SIZES; do
		perftest write_bw "$s"
		rdmaperf write_bw "$s"
	done
	[ "$LAB_ROLE" = server ] || echo "== repetition $rep done"
done
