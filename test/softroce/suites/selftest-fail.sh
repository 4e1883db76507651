#!/bin/bash
# lab: guests=2 timeout=60
# lab: expect-fail="(?m)^selftest-fail/g2: command exited with status 3$"
#
# The lab's self-test: a guest command that fails must fail the run, name
# the guest and its exit status, and leave no qemu behind. Guest 1 passes.
[ "$LAB_INDEX" = 2 ] && exit 3
exit 0
