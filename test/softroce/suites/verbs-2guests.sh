#!/bin/bash
# lab: guests=2 timeout=300
# lab: gotest=./pkg/verbs
#
# pkg/verbs between two guests: every RC operation with the bytes checked
# on both sides, UD datagrams both ways, rdma_cm across the wire, and a peer
# that vanishes mid-stream (retry-exceeded completion, no hang).
set -euo pipefail
lab_gotest verbs -test.v -test.run 'TestTwoGuests' -test.timeout 280s
