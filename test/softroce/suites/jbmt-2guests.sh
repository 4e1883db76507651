#!/bin/bash
# lab: guests=2 timeout=270
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
# mark one page) to 16 transfers at once. Guest 1's link down for 10 s
# (ip link set eth0 down) while guest 2 has gets and a put in flight:
# each fails with ErrPeerGone within 7 s (the QP's ACK timeout and
# retries after the module's probe; 3.8 s measured on 6.1, 4.2 s on
# 6.12), nothing stays pinned, the connection is down on both, guest 1
# sends no connection manager message while its link is down (rxe would
# fail its QP1 for good), and the DREQ or DREP that ends the connection
# that went once it is back; a new Dial over the same device connects and
# gets 8 MiB, every byte checked.
set -euo pipefail
lab_gotest jbmt -test.v -test.run 'TestTwoGuests' -test.timeout 240s
