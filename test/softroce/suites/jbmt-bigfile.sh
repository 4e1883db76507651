#!/bin/bash
# lab: guests=2 mem=384 timeout=420 gobuild=./cmd/jbmtcat
#
# cmd/jbmtcat serves a file larger than its guest's memory: guest 1, with
# 384 MiB, maps a 400 MiB file of the run's share (9p; its pages come and
# go through the page cache) read-only and registers it, pinning nothing;
# guest 2 reads it whole with gets of 4 MiB and checks its sha256 against
# guest 1's. Each get pins, on guest 1, only the pages it moves, faulted in
# from the share by a work item.
set -euo pipefail
img="$LAB_SHARED/jbmt-big.img"
size=$((400 << 20))
if [ "$LAB_ROLE" = server ]; then
	mem=$(awk '/^MemTotal/ { print $2 * 1024 }' /proc/meminfo)
	[ "$size" -gt "$mem" ] || lab_fail "the file ($size bytes) is not larger than the guest's memory ($mem)"
	head -c "$size" /dev/urandom >"$img"
	sha256sum "$img" | cut -d' ' -f1 >"$LAB_SHARED/jbmt-big.sha256"
	"$LAB_BIN/jbmtcat" -serve "$img" >/tmp/jbmtcat.log 2>&1 &
	jc=$!
	for _ in $(seq 200); do grep -qs '^token' /tmp/jbmtcat.log && break; sleep 0.05; done
	grep -qs '^token' /tmp/jbmtcat.log || { cat /tmp/jbmtcat.log; lab_fail "jbmtcat -serve printed no token"; }
	cp /tmp/jbmtcat.log "$LAB_SHARED/jbmt-big.token"
	echo "guest 1: serving $size bytes with $((mem >> 20)) MiB of memory; pages pinned: $(cat /sys/kernel/rdmaplus/jbmt/pinned_pages)"
	lab_signal big-ready
	lab_wait big-done 360
	d=$(cat /sys/kernel/rdmaplus/jbmt/sections_deferred)
	echo "guest 1: sections served $(cat /sys/kernel/rdmaplus/jbmt/sections_served), of which from work items (faults) $d; pages pinned now $(cat /sys/kernel/rdmaplus/jbmt/served_pinned_pages)"
	[ "$d" -gt 0 ] || lab_fail "no section needed a fault: was the file resident?"
	kill "$jc"
	wait "$jc" || true
	rm -f "$img"
else
	lab_wait big-ready 240
	read -r _ tok _ sz <"$LAB_SHARED/jbmt-big.token"
	[ "$sz" = "$size" ] || lab_fail "jbmtcat serves $sz bytes, want $size"
	start=$(date +%s.%N)
	got=$("$LAB_BIN/jbmtcat" -get "$(lab_peer 1)" -token "$tok" -size "$sz" | sha256sum | cut -d' ' -f1)
	end=$(date +%s.%N)
	[ "$got" = "$(cat "$LAB_SHARED/jbmt-big.sha256")" ] || lab_fail "the file read with JBMT differs (sha256 $got)"
	awk -v s="$start" -v e="$end" -v n="$sz" 'BEGIN { printf "guest 2: sha256 matches guest 1: %d bytes in %.1f s (%.1f MB/s)\n", n, e - s, n / (e - s) / 1e6 }'
	lab_signal big-done
fi
