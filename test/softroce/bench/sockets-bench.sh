#!/bin/bash
# lab: guests=2 timeout=900 make=sockpreload gobuild=./cmd/rvmad
#
# Sockets over RDMA against its anchors, in one boot, interleaved: the
# same unmodified program (bulk, cmd/sockpreload/test/bulk.c) between the
# two guests over plain TCP, under rsocket's preload library
# (librspreload.so, rdma-core) and under ours (with rvmad's broker on both
# guests). Three rounds of each: 16 MiB each way (MB/s, both directions
# together), 2000 ping-pongs of 64 B and 1000 of 4 KiB (µs per round
# trip). Prints each figure, the medians and our ratios to rsocket and to
# TCP. Under TCG only the ratios mean something.
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
sockets_need "$RSOCKET"
sockets_begin
modes="tcp rsocket ours"

if [ "$LAB_ROLE" = server ]; then
	bulk_servers $modes
	lab_signal bench-ready
	lab_wait bench-done 800
	for m in $modes; do tail -3 /tmp/srv.$m; done
else
	wait_peer bench-ready
	: >/tmp/results
	for round in 1 2 3; do
		for m in $modes; do
			for t in "bw -n 16777216 -r 0" "lat64 -n 0 -r 2000 -s 64" "lat4k -n 0 -r 1000 -s 4096"; do
				set -- $t
				name=$1
				shift
				out=$(LD_PRELOAD=$(mode_preload $m) RDMAPLUS_SOCKETS_ATTACH_MS=0 timeout 300 "$BULK" client -p "$(mode_port $m)" -w 1500 "$@" "$peer") ||
					lab_fail "$m $name round $round failed: $out"
				case $name in
				bw) v=$(echo "$out" | sed -n 's/.*(\([0-9.]*\) MB\/s).*/\1/p') ;;
				*) v=$(echo "$out" | sed -n 's/.*: \([0-9.]*\) us each.*/\1/p') ;;
				esac
				echo "round $round $m $name $v"
				echo "$m $name $v" >>/tmp/results
			done
		done
	done
	lab_signal bench-done
	med() { awk -v m="$1" -v n="$2" '$1 == m && $2 == n { print $3 }' /tmp/results | sort -g | sed -n 2p; }
	for name in bw lat64 lat4k; do
		t=$(med tcp $name) r=$(med rsocket $name) o=$(med ours $name)
		unit=$([ $name = bw ] && echo MB/s || echo us)
		echo "median $name ($unit): tcp $t, rsocket $r, ours $o; ours/rsocket $(awk -v a="$o" -v b="$r" 'BEGIN { printf "%.2f", a / b }'), ours/tcp $(awk -v a="$o" -v b="$t" 'BEGIN { printf "%.2f", a / b }')"
	done
fi
echo "PASS sockets-bench (guest $LAB_INDEX)"
