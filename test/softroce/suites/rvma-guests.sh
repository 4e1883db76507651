#!/bin/bash
# lab: guests=3 timeout=380
# lab: gotest=./pkg/rvma
#
# pkg/rvma between guests: guest 1 receives, guests 2 and 3 send, each with
# an endpoint of four rdma_cm stripes. Epochs complete by byte count while
# the arrival order recorded at the receiver differs from the issue order,
# in windows counting bytes and counting operations; last-byte polling on
# the same striped traffic completes early, with bytes missing;
# two senders fill one epoch together; stale puts are refused by the NIC
# without touching a buffer already handed over (an error at the sender, a
# counter at the receiver, and a retry that lands in the next epoch); a
# sender that leaves mid-epoch leaves a partial buffer IncEpoch hands over;
# a receiver killed with SIGKILL fails the put waiting on it; puts in
# flight when the sender's stripe fails for a reason other than a refusal
# (some placed, their acknowledgments lost) fail with the link and are
# never placed twice. Twice: with
# the kernel module counting puts, then with the library counting them.
set -euo pipefail
lab_gotest rvma -test.v -test.run '^TestLabGuests$|^TestLabGuestsFlushInDoubt$' -test.timeout 180s -rvma.counting=module
lab_gotest rvma -test.v -test.run '^TestLabGuests$|^TestLabGuestsFlushInDoubt$' -test.timeout 180s -rvma.counting=library
