#!/bin/bash
# lab: guests=3 timeout=300
# lab: gotest=./pkg/activeaccess/dht
#
# pkg/activeaccess/dht, the paper's distributed hash table (section 4.1)
# between three guests: guest 1 the target, guests 2 and 3 the sources.
# For the Active Access table (transparent and library-mediated, handler
# on the eventfd and polling), the RMA-only table (Listing 2: remote
# compare-and-swap and fetch-and-add) and the active-message table: both
# sources insert their halves of a random workload at 5% and 25%
# collisions; the target finds every key exactly once with its value in a
# sound volume; the sources look their keys up, delete a quarter, and the
# deleted keys are gone. A full overflow heap gives ErrFull for exactly
# the inserts that did not fit; malformed active puts are rejected; a
# target killed under a working source makes it fail with
# ErrDisconnected, promptly.
set -euo pipefail
# The tests quote the last disconnect-related CM events when they fail,
# and a failing run keeps the whole CM trace in the guest's output. The
# events of ib_cm are the system "ib_cma", rdma_cm's "rdma_cma".
T=/sys/kernel/tracing
if grep -qs " $T tracefs " /proc/mounts || mount -t tracefs nodev $T 2>/dev/null; then
	echo 8192 >$T/buffer_size_kb || true
	echo 1 >$T/events/ib_cma/enable || true
	echo 1 >$T/events/rdma_cma/enable || true
fi
lab_gotest dht -test.v -test.run '^TestLab' -test.timeout 280s || {
	cp $T/trace "$LAB_OUT/cm-trace.txt" 2>/dev/null || true
	exit 1
}
