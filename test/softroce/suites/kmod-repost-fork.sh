#!/bin/bash
# lab: guests=2 smp=2 timeout=180
# lab: gotest=./pkg/kmod
#
# The module under a fork storm: guest 2 streams RDMA WRITEs into a region
# guest 1's process gates with a counted mailbox, while one thread of that
# process re-posts a buffer there and another forks with some 4000
# descriptors open, on the other vCPU. A uverbs file check under the lock
# the data path takes once froze the guest silently here (both vCPUs
# spinning with interrupts off); every re-post, fork and write must finish.
set -euo pipefail
lab_gotest kmod -test.v -test.run '^TestTwoGuestsRepostFork$' -test.timeout 150s
