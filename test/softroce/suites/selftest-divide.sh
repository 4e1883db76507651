#!/bin/bash
# lab: guests=1 timeout=60
# lab: expect-fail="(?m)^selftest-divide: kernel (Oops: )?divide error: 0000 \[#1\]"
#
# The lab's self-test: an oops in a kernel thread (a division by zero) fails
# the run although insmod and the command succeed and the guest goes on.
insmod "$LAB_SELFTEST_KMODS/lab_oops.ko" mode=divide
# Wait until the thread has run (the lab reads the kernel log as it comes),
# and pass: the verdict is the lab's.
for _ in $(seq 100); do
	dmesg | grep -q 'divide error:' && exit 0
	sleep 0.1
done
echo "no oops in the kernel log after 10s"
