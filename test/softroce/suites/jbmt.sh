#!/bin/bash
# lab: guests=1 timeout=180
# lab: gotest=./pkg/jbmt
#
# JBMT registration on one guest: 1 GiB and 4 KiB registered by a process
# without CAP_IPC_LOCK under a 64 KiB memlock limit pin nothing (the
# kernel's FOLL_PIN counters) and charge nothing; every bad argument and
# token refused (another file's token answers as none), the per-user cap,
# and every region revoked when its Service closes.
set -euo pipefail
lab_gotest jbmt -test.v -test.run 'TestLab' -test.timeout 150s
