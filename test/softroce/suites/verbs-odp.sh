#!/bin/bash
# lab: guests=2 timeout=180 kernels=sid
# lab: gotest=./pkg/verbs
#
# On-demand paging (Linux 7.x rxe only): guest 1 registers a region with
# IBV_ACCESS_ON_DEMAND, which pins nothing; guest 2 RDMA-WRITEs into it
# and READs it back across pages never touched before.
set -euo pipefail
lab_gotest verbs -test.v -test.run '^TestODPTwoGuests$' -test.timeout 150s
