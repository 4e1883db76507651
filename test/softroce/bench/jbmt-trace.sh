#!/bin/bash
# lab: guests=1 timeout=600 gobuild=./cmd/jbmtperf
#
# Where a small blocking get's CPU goes, over loopback on the lab's one
# vCPU (where everything a get needs runs in turn): the kernel's
# function_graph tracer times the ioctl (rdmaplus_jbmt_op), rxe's
# requester (which in loopback also runs the receiving side: the
# responder, its completions) and the completion work (ib_cq_poll_work:
# the service's handlers) while cmd/jbmtperf -t lat makes 50 gets and 50
# puts of 4 KiB, after 200 of each untraced. Tracing slows everything (a
# traced get takes two to three times an untraced one): only the shares
# mean something. Per function: calls, mean and total µs.
set -euo pipefail
T=/sys/kernel/tracing
[ -e $T/trace ] || mount -t tracefs nodev $T
"$LAB_BIN/jbmtperf" -t lat -addr "$LAB_ADDR" -min 4096 -max 4096 -n 200
for f in rdmaplus_jbmt_op rxe_requester ib_cq_poll_work; do
	echo "$f" >>$T/set_graph_function
done
echo 1 >$T/max_graph_depth
echo function_graph >$T/current_tracer
echo 1 >$T/tracing_on
"$LAB_BIN/jbmtperf" -t lat -addr "$LAB_ADDR" -min 4096 -max 4096 -n 50
echo 0 >$T/tracing_on
awk '
/ us / && (/\(\);/ || /\} \/\*/) {
	d = ""
	for (i = 1; i < NF; i++)
		if ($(i + 1) == "us")
			d = $i
	f = $0
	if (/\} \/\*/) {
		sub(/.*\/\* /, "", f)
		sub(/ .*/, "", f)
	} else {
		sub(/.*\|  /, "", f)
		sub(/[ (].*/, "", f)
	}
	if (d != "") {
		n[f]++
		s[f] += d
	}
}
END {
	for (f in n)
		printf "%-22s %6d calls %9.1f us mean %11.1f us total\n", f, n[f], s[f] / n[f], s[f]
}' $T/trace
echo nop >$T/current_tracer
