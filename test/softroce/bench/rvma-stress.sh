#!/bin/bash
# lab: guests=2 timeout=900
# lab: gotest=./pkg/rvma
#
# A stress run of pkg/rvma between two guests (TestLabStressGuests): 25
# rounds of TestLabGuests' ordering traffic, about 1.2 GB with every byte
# checked, each buffer re-posted for 75 or 50 generations; once with the
# kernel module counting, once with the library counting. About 40 s each.
set -euo pipefail
lab_gotest rvma -test.v -test.run '^TestLabStressGuests$' -test.timeout 400s -rvma.counting=module -rvma.rounds=25
lab_gotest rvma -test.v -test.run '^TestLabStressGuests$' -test.timeout 400s -rvma.counting=library -rvma.rounds=25
