#!/bin/bash
# lab: guests=2 timeout=240 gobuild=./cmd/jbmtcat
#
# JBMT under traffic, its server going away: guest 2 reads a 64 MiB file
# from guest 1 with JBMT gets, again and again, starting over at once
# whatever the error. Guest 1 kills its server (its regions go under the
# gets: EFAULT while the process exits, then ESTALE) and unloads the
# module under the requests still coming (its connections go down): every
# read of guest 2 ends, none hangs, a new connection is refused while
# nothing listens, and after guest 1 loads the module again a new server
# is read whole. Neither kernel reports anything (the lab checks).
set -euo pipefail
ko=$(echo "$LAB_KMODS" | tr ' ' '\n' | grep '/rdmaplus.ko$')
size=$((64 << 20))
serve() { # serve -> token file, pid in $jc
	"$LAB_BIN/jbmtcat" -serve /tmp/jbmt.img >/tmp/jbmtcat.log 2>&1 &
	jc=$!
	for _ in $(seq 200); do grep -qs '^token' /tmp/jbmtcat.log && break; sleep 0.05; done
	grep -qs '^token' /tmp/jbmtcat.log || { cat /tmp/jbmtcat.log; lab_fail "jbmtcat -serve printed no token"; }
	cp /tmp/jbmtcat.log "$LAB_SHARED/jbmt-unload.token.$1"
}
if [ "$LAB_ROLE" = server ]; then
	head -c "$size" /dev/urandom >/tmp/jbmt.img
	sha256sum /tmp/jbmt.img | cut -d' ' -f1 >"$LAB_SHARED/jbmt-unload.sha256"
	serve 1
	lab_signal unload-ready
	lab_wait unload-reading 60
	sleep 1
	kill -9 "$jc"
	wait "$jc" || true
	echo "guest 1: server killed under the gets"
	sleep 0.5
	t0=$(date +%s.%N)
	timeout 30 rmmod rdmaplus || lab_fail "rmmod rdmaplus under traffic failed or hung"
	echo "guest 1: module unloaded under traffic in $(awk -v s="$t0" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }') s"
	lab_signal unload-gone
	lab_wait unload-refused 60
	insmod "$ko" || lab_fail "insmod rdmaplus failed"
	serve 2
	lab_signal unload-back
	lab_wait unload-done 120
	kill "$jc"
	wait "$jc" || true
else
	lab_wait unload-ready 60
	read -r _ tok _ sz <"$LAB_SHARED/jbmt-unload.token.1"
	want=$(cat "$LAB_SHARED/jbmt-unload.sha256")
	got=$("$LAB_BIN/jbmtcat" -get "$(lab_peer 1)" -token "$tok" -size "$sz" | sha256sum | cut -d' ' -f1)
	[ "$got" = "$want" ] || lab_fail "the first read differs (sha256 $got)"
	(
		n=0
		while [ ! -e /tmp/reader.stop ]; do
			n=$((n + 1))
			rc=0
			timeout 30 "$LAB_BIN/jbmtcat" -get "$(lab_peer 1)" -token "$tok" -size "$sz" \
				>/dev/null 2>>/tmp/reader.err || rc=$?
			[ "$rc" != 124 ] || { echo "read $n hung" >>/tmp/reader.err; exit 1; }
		done
		echo "$n reads" >>/tmp/reader.err
	) &
	reader=$!
	lab_signal unload-reading
	lab_wait unload-gone 60
	sleep 2
	touch /tmp/reader.stop
	wait "$reader" || { cat /tmp/reader.err; lab_fail "a read hung with guest 1's server and module going"; }
	echo "guest 2: the reads, how they ended:"
	sed 's/^/  /' /tmp/reader.err | sort | uniq -c | sort -rn | head -8
	if timeout 30 "$LAB_BIN/jbmtcat" -get "$(lab_peer 1)" -token "$tok" -size "$sz" >/dev/null 2>/tmp/refused.err; then
		lab_fail "a read succeeded with nothing serving"
	fi
	echo "guest 2: with guest 1's module gone: $(tail -1 /tmp/refused.err)"
	lab_signal unload-refused
	lab_wait unload-back 60
	read -r _ tok _ sz <"$LAB_SHARED/jbmt-unload.token.2"
	got=$("$LAB_BIN/jbmtcat" -get "$(lab_peer 1)" -token "$tok" -size "$sz" | sha256sum | cut -d' ' -f1)
	[ "$got" = "$want" ] || lab_fail "the read after the module came back differs (sha256 $got)"
	echo "guest 2: read whole again after guest 1 loaded the module again"
	lab_signal unload-done
fi
