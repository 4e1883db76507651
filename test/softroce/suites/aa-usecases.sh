#!/bin/bash
# lab: guests=2 timeout=300
# lab: gotest=./pkg/activeaccess/counter,./pkg/activeaccess/getlog,./pkg/activeaccess/checkpoint
#
# The Active Access use cases of sections 4.2-4.4 of the paper, between two
# guests (guest 1 the target, guest 2 the sources), each in the transparent
# and the library-mediated mode:
# access counter: two sources make known numbers of puts and gets to known
# pages, the per-page counts are exact (plain RDMA counted too when
# transparent); logging of gets: a reader process is killed, a new one
# recovers its log from the target and replays every get byte-identical
# while the memory has changed; incremental checkpointing: remote puts and
# local stores between checkpoints, each checkpoint saves exactly the pages
# changed, and restoring the chain is byte-identical.
set -euo pipefail
lab_gotest counter -test.v -test.run '^TestLab' -test.timeout 120s
lab_gotest getlog -test.v -test.run '^TestLab' -test.timeout 120s
lab_gotest checkpoint -test.v -test.run '^TestLab' -test.timeout 120s
