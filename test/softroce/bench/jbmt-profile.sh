#!/bin/bash
# lab: guests=1 timeout=600 gobuild=./cmd/jbmtperf
#
# Where the CPU goes while eight 64 KiB JBMT gets are in flight over
# loopback (cmd/jbmtperf -t async -window 8), beside perftest's
# ib_write_bw of 64 KiB (the anchor of bench/jbmt-async.sh) and beside
# the same gets with jbmtperf held on one vCPU (taskset -c 1): perf
# samples both vCPUs (cpu-clock, 4 s in the middle of each run) and the
# script prints, per run, its MB/s, the samples per CPU and command, the
# hottest functions, and the samples grouped: idle (native_safe_halt),
# the data's own work (memcpy_erms, memset_erms: the kernel zeroes every
# skb it allocates, crc32_body: rxe's ICRC), and softirq entries spinning
# on a tasklet that runs on the other vCPU (rxe of 6.1 runs its tasks in
# tasklets: tasklet_action_common and handle_softirqs themselves,
# run_ksoftirqd, rcu_softirq_qs, tasklet_action, smpboot_thread_fn).
# Needs perf in the guests: add `perf` to test/softroce/guest/tools for the
# run (docs/lab.md, "Adding a tool"); without it the script says so and
# ends. Sampling slows every run a little; compare shares, and MB/s only
# between the runs of one boot.
set -euo pipefail
source "$LAB_DIR/test/softroce/bench/lib/perftest-bw-loopback.sh"
if ! command -v perf >/dev/null; then
	echo "# perf is not in the guest: add it to test/softroce/guest/tools to profile"
	exit 0
fi
echo 0 >/proc/sys/kernel/kptr_restrict
echo -1 >/proc/sys/kernel/perf_event_paranoid
O=$LAB_OUT
# profile TAG: 4 s of samples of both vCPUs, reports in $O/TAG.*
profile() {
	perf record -a -e cpu-clock -F 1999 -o "/tmp/$1.data" -- sleep 4 >/dev/null 2>&1
	perf report -i "/tmp/$1.data" --no-children --sort sym --stdio 2>/dev/null |
		awk '!/^#/ && NF' >"$O/$1.sym"
	perf report -i "/tmp/$1.data" --no-children --sort cpu,comm --stdio 2>/dev/null |
		awk '!/^#/ && NF' >"$O/$1.comm"
}
# report TAG MB/s
report() {
	echo "=== $1: $2 MB/s; samples by CPU and command (%)"
	awk '$1 + 0 >= 0.5' "$O/$1.comm"
	echo "--- hottest functions (% of both vCPUs' samples)"
	awk 'NR <= 15' "$O/$1.sym"
	awk -v tag="$1" '{
		p = $1 + 0; f = $3
		if (f == "native_safe_halt") idle += p
		else if (f == "memcpy_erms" || f == "memset_erms" || f == "crc32_body") data += p
		else if (f == "tasklet_action_common.constprop.0" || f == "handle_softirqs" || f == "run_ksoftirqd" || f == "rcu_softirq_qs" || f == "tasklet_action" || f == "smpboot_thread_fn") spin += p
		else rest += p
	} END {
		printf "--- %s grouped: idle %.1f, data %.1f, tasklet spin %.1f, the rest %.1f\n", tag, idle, data, spin, rest
	}' "$O/$1.sym"
}
# the anchor: 6144 writes of 64 KiB (about 7 s), sampled from the 2nd second
write_bw_loopback 65536 6144 >/tmp/wbw.mbs &
w=$!
sleep 2
profile write_bw
wait $w
# the gets: 384 MiB in 64 KiB gets, 8 in flight, free and on one vCPU
for m in free cpu1; do
	pin=()
	[ $m = cpu1 ] && pin=(busybox taskset -c 1)
	"${pin[@]}" "$LAB_BIN/jbmtperf" -t async -addr "$LAB_ADDR" -min 65536 -max 65536 \
		-bytes $((384 << 20)) -window 8 -n 1 >"/tmp/jbmt.$m" &
	j=$!
	sleep 3
	profile "aget_$m"
	wait $j
done
report write_bw "$(cat /tmp/wbw.mbs)"
for m in free cpu1; do
	report "aget_$m" "$(awk '$1 == "aget" { print $4 }' "/tmp/jbmt.$m")"
done
