#!/bin/bash
# lab: guests=1 timeout=60
# lab: expect-fail="(?m)^selftest-oom: kernel dd invoked oom-killer: "
#
# The lab's self-test: the kernel's OOM killer fails the run although the
# command succeeds. Enough dd, each reading 600 MiB into one buffer, to need
# more than the guest's memory (two more than fit; three with the default
# 1024 MiB); their oom_score_adj makes them the killer's victims rather than
# anything of the lab's.
n=$(($(awk '/^MemTotal:/ { print $2 }' /proc/meminfo) / (600 * 1024) + 2))
for _ in $(seq "$n"); do
	(echo 1000 > /proc/self/oom_score_adj; exec dd if=/dev/zero of=/dev/null bs=600M count=1 2>/dev/null) &
done
wait
exit 0
