#!/bin/bash
# lab: guests=2 timeout=180
# lab: gotest=./pkg/jbmt
#
# JBMT connections between two guests: guest 2 dials guest 1's service
# (kernel rdma_cm, the module's jbmt_port); the connection is made once
# and shared; a port nothing listens on is refused, an address no host
# has fails within the caller's context, the host's cap on connections
# holds; guest 1's device deleted under the connection (both sides see it
# go down) and added again (a new connection). Transfers between the
# guests: 8 MiB got and 4 MiB put, every byte checked; guest 1's device
# deleted during gets (they fail with ErrPeerGone, nothing stays pinned)
# and added again (the same token serves a new connection); guest 1
# serving at a pin budget of one page (NOPIN and retries, its high-water
# mark one page) to 16 transfers at once.
set -euo pipefail
lab_gotest jbmt -test.v -test.run 'TestTwoGuests' -test.timeout 150s
