#!/bin/bash
# lab: guests=1 timeout=3000 gobuild=./cmd/rdmaperf
#
# RVMA against RDMA in one boot: the paper's Figure 4 on our stack, sizes
# 8 B to 1 MiB, time from put start until the receiving application sees
# the completion (half a ping-pong round trip, t_typical):
#   rvma_lat             (a)  an RVMA put; the receiver spins on its buffer's completion
#   rvma_lat -guard none (a') the same without unbinding a completed buffer first
#                             (late bytes counted, not refused: the price of the guarantee)
#   write_send_lat       (b1) RDMA WRITE + a 1-byte SEND posted right behind it
#   write_wait_send_lat  (b2) RDMA WRITE, the SEND posted after the WRITE's completion
#   write_lat            (c)  RDMA WRITE, the receiver spinning on the last byte
#   write_imm_lat        RDMA WRITE WITH IMMEDIATE, the receiver spinning on its CQ: the
#                        transport under RVMA's puts, with none of RVMA's work
# then the paper's Figure 6: setup_lat, what RDMA pays per new buffer before
# the first WRITE (register it, send its address and key, get the answer),
# against which (c) and (b2) give the exchanges needed to amortise it
# all through cmd/rdmaperf's Go loops, with perftest's ib_write_lat beside
# them; then streaming bandwidth, 64 KiB to 1 MiB: rvma_bw against
# write_bw and ib_write_bw; then Endpoint.Get of a kept epoch
# (rvma_get_lat) against one RDMA READ of the same size (read_lat,
# ib_read_lat).
#
# Loopback on rxe0, server pinned to CPU 0 and client to CPU 1, as in
# verbs-bench.sh: between two TCG guests a one-way trip costs 0.6 to
# 1.1 ms of virtio and network stack under TCG, which hides the
# protocols' own costs; rvma-guests-bench.sh runs the same comparisons there.
# The tools run interleaved, size by size, REPS times; every result is
# printed as
#   BENCH <tool> <test> <bytes> <t_typical usec | MB/s>
# which cmd/rdmaperf/benchtable turns into tables (medians).
set -euo pipefail
P="$LAB_BIN/rdmaperf"
REPS=${REPS:-3}
LAT_SIZES=${LAT_SIZES:-"8 64 512 4096 32768 262144 1048576"}
BW_SIZES=${BW_SIZES:-"65536 262144 1048576"}
GET_SIZES=${GET_SIZES:-"4096 65536 1048576"}

iters() { # size test: fewer iterations for large messages (TCG moves ~30 MB/s)
	if [ "${2%_bw}" != "$2" ]; then
		echo $(( $1 >= 1048576 ? 160 : $1 >= 262144 ? 320 : 640 ))
	else
		echo $(( $1 >= 1048576 ? 40 : $1 >= 262144 ? 100 : $1 >= 32768 ? 400 : 1000 ))
	fi
}

perftest() { # test size
	local t=$1 s=$2 n
	n=$(iters "$s" "$t")
	taskset -c 0 ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" >/tmp/pt.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	taskset -c 1 ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" 127.0.0.1 >/tmp/pt.cli 2>&1 || { cat /tmp/pt.cli /tmp/pt.srv; lab_fail "ib_$t -s $s failed"; }
	wait $srv || { cat /tmp/pt.srv; lab_fail "ib_$t server -s $s failed"; }
	lab_bench perftest "$t" "$s" /tmp/pt.cli
}

rdmaperf() { # name test size [flags]
	local name=$1 t=$2 s=$3 n
	shift 3
	n=$(iters "$s" "$t")
	taskset -c 0 "$P" -d "$LAB_DEVICE" -timeout 10m >/tmp/rp.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18516
	taskset -c 1 "$P" -d "$LAB_DEVICE" -t "$t" -s "$s" -n "$n" -timeout 10m "$@" 127.0.0.1 >/tmp/rp.cli 2>&1 || { cat /tmp/rp.cli /tmp/rp.srv; lab_fail "rdmaperf $t -s $s $* failed"; }
	wait $srv || { cat /tmp/rp.srv; lab_fail "rdmaperf $t server failed"; }
	lab_bench "$name" "$t" "$s" /tmp/rp.cli
}

nproc
for rep in $(seq "$REPS"); do
	for s in $LAT_SIZES; do
		perftest write_lat "$s"
		rdmaperf rdmaperf rvma_lat "$s"
		rdmaperf rdmaperf-guardnone rvma_lat "$s" -guard none
		rdmaperf rdmaperf write_send_lat "$s"
		rdmaperf rdmaperf write_wait_send_lat "$s"
		rdmaperf rdmaperf write_lat "$s"
		rdmaperf rdmaperf write_imm_lat "$s"
		rdmaperf rdmaperf setup_lat "$s"
	done
	for s in $BW_SIZES; do
		perftest write_bw "$s"
		rdmaperf rdmaperf write_bw "$s"
		rdmaperf rdmaperf rvma_bw "$s"
	done
	for s in $GET_SIZES; do
		perftest read_lat "$s"
		rdmaperf rdmaperf read_lat "$s"
		rdmaperf rdmaperf rvma_get_lat "$s"
	done
	echo "== repetition $rep done"
done
