#!/bin/bash
# lab: guests=1 timeout=420
# lab: gotest=./pkg/kmod
#
# Active Access, kernel side, on one guest in loopback on rxe0: domains
# and mapped logs, W/R/WL/WLD/RL/RLD on writes, reads and atomics (bytes
# checked), a full log refusing writes, a flood with and without credits,
# eventfd/poll notification, local transfers left alone, deregistration,
# misuse (also raw: other files' domain ids, bad eventfds and mmaps,
# wrong sizes), atomics refused on R=0 pages and full logs, two
# concurrent sources into one log, isolation between processes and
# teardown on kill -9. Counted mailboxes (RVMA, TestLabMailbox*) on the
# same hooks: bytes and ops windows through memory windows and rkeys,
# in-order publication, late and straddling writes refused, keyed buffers
# refusing other keys (one and several packets), windows with a mailbox
# key (the module translating generation and offset into the buffer,
# guarded regions refusing everything else), END, READs
# untouched, every validation error (raw too), the range limit, and
# teardown on close and on deregistration.
set -euo pipefail
lab_gotest kmod -test.v -test.run 'TestLab' -test.timeout 400s
