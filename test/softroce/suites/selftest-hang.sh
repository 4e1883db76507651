#!/bin/bash
# lab: guests=2 timeout=45
# lab: expect-fail="(?m)^selftest-hang/g2: no result within the 45s deadline \(hung\); killed; vCPUs over 1s \(vcpus.txt\): #0 .*idle"
#
# The lab's self-test: a guest that never finishes is killed at the
# deadline, the run fails naming it and saying what its vCPU did (idle:
# the command sleeps, so its vCPU is halted), and no qemu is left behind.
[ "$LAB_INDEX" = 2 ] && exec sleep 3600
exit 0
