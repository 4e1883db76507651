#!/bin/bash
# lab: guests=1 timeout=300
# lab: gotest=./pkg/verbs
#
# pkg/verbs on one guest: every operation in loopback on rxe0 with the
# bytes checked, atomics from several QPs, UD, SRQ and its limit event,
# memory windows, ODP refused, every misuse case, no fd/memory leak over
# 1000 open/close cycles, rdma_cm reject/accept/disconnect, and the
# package's runnable examples.
set -euo pipefail
lab_gotest verbs -test.v -test.run 'TestLoopback|TestExamples' -test.timeout 280s
