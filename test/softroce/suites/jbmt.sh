#!/bin/bash
# lab: guests=1 timeout=180
# lab: gotest=./pkg/jbmt
#
# JBMT on one guest: 1 GiB and 4 KiB registered by a process without
# CAP_IPC_LOCK under a 64 KiB memlock limit pin nothing (the kernel's
# FOLL_PIN counters) and charge nothing; every bad argument and token
# refused (another file's token answers as none), the per-user cap, and
# every region revoked when its Service closes. Transfers over the guest's
# own connection: puts and gets at sizes around page and section
# boundaries with every byte checked, each refusal (bad or revoked token,
# rights, range, unmapped pages here or there) its own error with the
# connection kept, 16 MiB moved under a 64 KiB memlock limit, a cancelled
# get, the buffer unmapped under a get (ErrFault), a getter killed with
# SIGKILL mid-transfer, untouched memory faulted in by the deferred path,
# sections capped at 1 and 5 pages (jbmt_section_pages), a pin budget of
# one page (and a process's share) never exceeded with 16 transfers at
# once, and no page left pinned.
set -euo pipefail
lab_gotest jbmt -test.v -test.run 'TestLab' -test.timeout 150s
