#!/bin/bash
# lab: guests=2 smp=1 timeout=3600 gobuild=./cmd/rdmaperf
#
# RVMA against RDMA between two guests of one vCPU each (the tool servers
# on guest 1, the clients on guest 2), so that rxe's responder and the
# receive completions run on the receiver's CPU, as on two hosts. The same
# comparisons as rvma-bench.sh (loopback), in one boot, interleaved size by
# size, REPS times (one repetition takes about 4.5 minutes on an idle lab
# host; every tool starts and connects anew for each size, which costs
# seconds under TCG):
#   Figure 4, 8 B to 1 MiB (t_typical, half a round trip):
#     rvma_lat (a), rvma_lat -guard none (a'), write_send_lat (b1),
#     write_wait_send_lat (b2), write_lat (c), write_imm_lat (the
#     transport under RVMA's puts, with none of RVMA's work), perftest's
#     ib_write_lat
#   Figure 6: setup_lat (register a buffer, send its address and key, get
#     the answer)
#   streaming bandwidth, 64 KiB to 1 MiB: rvma_bw, write_bw, ib_write_bw
# Every result is printed as
#   BENCH <tool> <test> <bytes> <t_typical usec | MB/s>
# on guest 2, which cmd/rdmaperf/benchtable -rvma turns into tables.
set -euo pipefail
REPS=${REPS:-1}
LAT_SIZES=${LAT_SIZES:-"8 512 4096 32768 262144 1048576"}
BW_SIZES=${BW_SIZES:-"65536 262144 1048576"}

source "$LAB_DIR/test/softroce/bench/lib/rvma-pair.sh"

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
	[ "$LAB_ROLE" = server ] || echo "== repetition $rep done"
done
