#!/bin/bash
# lab: guests=2 timeout=180
# lab: gotest=./pkg/kmod
#
# Active Access across two guests: guest 2 issues plain RDMA WRITEs and
# READs to guest 1's memory, whose module makes them active (W=0 with the
# data logged, reads logged with the data served, a plain page untouched by
# the hooks); every log entry names guest 1's QP and guest 2's QP.
set -euo pipefail
lab_gotest kmod -test.v -test.run '^TestTwoGuests(Transparent|NestedHooks)$' -test.timeout 150s
