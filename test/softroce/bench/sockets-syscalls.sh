#!/bin/bash
# lab: guests=2 timeout=900 make=sockpreload gobuild=./cmd/rvmad
#
# Sockets over RDMA: system calls and wake-ups per request, which do not
# depend on TCG (docs/benchmarks.md). The same unmodified program (bulk,
# cmd/sockpreload/test/bulk.c) between the two guests over plain TCP,
# under rsocket's preload library (librspreload.so) and under ours, two
# rounds each: 2000 ping-pongs of 64 B and 1000 of 4 KiB. System calls:
# strace -c -f on the client, and attached to the server for the run;
# wake-ups: the voluntary context switches of every thread, the client's
# from GNU time (a run without strace), the server's from /proc before
# and after. Each figure is per round trip, connection setup included.
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
sockets_need "$RSOCKET"
[ -d "/sys/class/infiniband/${LAB_DEVICE:-none}" ] || lab_fail "no RDMA device"
sockets_begin
modes="tcp rsocket ours"
tests="lat64:2000:64 lat4k:1000:4096"

# vcsw PID: voluntary context switches of all PID's threads so far.
vcsw() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches/ { s += $2 } END { print s + 0 }'; }
# calls FILE: the total of strace -c's summary.
calls() { awk '$NF == "total" { print $4 }' "$1"; }

if [ "$LAB_ROLE" = server ]; then
	bulk_servers $modes
	k=0
	for round in 1 2; do
		for m in $modes; do
			for t in $tests; do
				k=$((k + 1))
				# a run with strace attached, then one without
				strace -f -c -p "${BULK_PID[$m]}" -o /tmp/sst.$k 2>/dev/null &
				st=$!
				sleep 1
				lab_signal traced.$k
				lab_wait ran.$k 300
				kill -INT $st
				wait $st 2>/dev/null || true
				echo "$(calls /tmp/sst.$k)" >"$LAB_SHARED/srv-calls.$k"
				v0=$(vcsw "${BULK_PID[$m]}")
				lab_signal plain.$k
				lab_wait ran-plain.$k 300
				echo $(($(vcsw "${BULK_PID[$m]}") - v0)) >"$LAB_SHARED/srv-wake.$k"
				lab_signal counted.$k
			done
		done
	done
	lab_wait bench-done 300
else
	peer=$(lab_peer 1)
	: >/tmp/results
	k=0
	for round in 1 2; do
		for m in $modes; do
			for t in $tests; do
				IFS=: read -r name rounds size <<<"$t"
				k=$((k + 1))
				args=(client -p "$(mode_port $m)" -w 1500 -n 0 -r "$rounds" -s "$size" "$peer")
				lab_wait traced.$k 300
				strace -f -c -o /tmp/st.$k -E LD_PRELOAD="$(mode_preload $m)" -E RDMAPLUS_SOCKETS_ATTACH_MS=0 \
					timeout 300 "$BULK" "${args[@]}" >/tmp/out.$k 2>&1 ||
					{ cat /tmp/out.$k; lab_fail "$m $name round $round failed under strace"; }
				lab_signal ran.$k
				lab_wait plain.$k 300
				LD_PRELOAD=$(mode_preload $m) RDMAPLUS_SOCKETS_ATTACH_MS=0 /usr/bin/time -f "%w" -o /tmp/time.$k \
					timeout 300 "$BULK" "${args[@]}" >/tmp/out.$k 2>&1 ||
					{ cat /tmp/out.$k; lab_fail "$m $name round $round failed"; }
				lab_signal ran-plain.$k
				lab_wait counted.$k 120
				cc=$(calls /tmp/st.$k) sc=$(cat "$LAB_SHARED/srv-calls.$k")
				cw=$(tail -1 /tmp/time.$k) sw=$(cat "$LAB_SHARED/srv-wake.$k")
				line=$(awk -v m=$m -v n=$name -v r="$rounds" -v cc="$cc" -v sc="$sc" -v cw="$cw" -v sw="$sw" \
					'BEGIN { printf "%s %s %.2f %.2f %.2f %.2f", m, n, cc / r, sc / r, cw / r, sw / r }')
				echo "round $round: $line (client calls, server calls, client wake-ups, server wake-ups per round trip)"
				echo "$line" >>/tmp/results
			done
		done
	done
	lab_signal bench-done
	echo
	for t in $tests; do
		name=${t%%:*}
		for m in $modes; do
			awk -v m=$m -v n=$name '$1 == m && $2 == n { c += $3; s += $4; cw += $5; sw += $6; k++ }
				END { if (k) printf "mean of %d, %s %s: system calls per round trip client %.2f server %.2f; wake-ups client %.2f server %.2f\n", k, m, n, c / k, s / k, cw / k, sw / k }' /tmp/results
		done
	done
fi
echo "PASS sockets-syscalls (guest $LAB_INDEX)"
