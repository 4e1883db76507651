#!/bin/bash
# lab: guests=4 timeout=1500 gobuild=./test/softroce/bench/rvmahalo
#
# Halo exchange on a ring of four guests (each exchanges a face with both
# neighbours every step): RVMA puts into parity mailboxes with byte
# thresholds and each neighbour's share promised (WindowOptions.Share),
# waiting with Posted.Wait (rvma) and with Posted.Spin (rvma-spin), and
# into one mailbox per parity and neighbour (rvma-peer), against the same
# exchange on plain verbs (buffers registered and advertised first, then
# per step an RDMA WRITE plus a 1-byte SEND per neighbour), its CQs spun
# (rdma) or waited on through a completion channel (rdma-wait, the
# counterpart of Posted.Wait). All run in this boot,
# alternating, REPS times per face size. HALO_FLAGS go to every run
# (HALO_FLAGS=-share=false: senders told of every epoch).
# Every guest prints
#   HALO <mode> <guests> <face bytes> <steps> <steps/s> <setup µs>
# and guest 1's lines are the ones recorded in docs/benchmarks.md.
set -euo pipefail
REPS=${REPS:-3}
FACES=${FACES:-"1024 16384"}
STEPS=${STEPS:-200}
k=0
for rep in $(seq "$REPS"); do
	for f in $FACES; do
		for mode in ${MODES:-rvma rvma-spin rvma-peer rdma rdma-wait}; do
			k=$((k + 1))
			# Fresh barrier names per run: the program's barriers are
			# files that stay for the whole boot.
			"$LAB_BIN/rvmahalo" -run "$k" -mode "$mode" -face "$f" -steps "$STEPS" -timeout 10m ${HALO_FLAGS:-}
		done
	done
done
