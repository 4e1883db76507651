#!/bin/bash
# lab: guests=1 timeout=60
# lab: expect-fail="(?m)^selftest-warn: kernel WARNING: .*lab_warn"
#
# The lab's self-test: a kernel WARNING in a guest fails the run even though
# the command itself succeeds.
insmod "$LAB_SELFTEST_KMODS/lab_warn.ko" || true
exit 0
