#!/bin/bash
# lab: guests=2 timeout=45
# lab: expect-fail="(?m)^selftest-hang/g2: no result within the 45s deadline \(hung\); killed$"
#
# The lab's self-test: a guest that never finishes is killed at the
# deadline, the run fails naming it, and no qemu is left behind.
[ "$LAB_INDEX" = 2 ] && exec sleep 3600
exit 0
