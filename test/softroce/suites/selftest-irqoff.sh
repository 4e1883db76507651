#!/bin/bash
# lab: guests=1 smp=1 timeout=45
# lab: expect-fail="(?m)^selftest-irqoff: no result within the 45s deadline \(hung\); killed; vCPUs over 1s \(vcpus.txt\): #0 stuck with interrupts off \(RIP [0-9a-f]+ in module space\)$"
#
# The lab's self-test: a guest whose only vCPU spins with interrupts off
# (a kernel thread of lab_oops.ko) prints nothing, not even a lockup report;
# the lab must kill it at the deadline and say, from qemu's monitor, that
# its vCPU is stuck with interrupts off.
insmod "$LAB_SELFTEST_KMODS/lab_oops.ko" mode=irqoff
exec sleep 3600
