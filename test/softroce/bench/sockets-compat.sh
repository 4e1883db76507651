#!/bin/bash
# lab: guests=2 timeout=1800 make=sockpreload gobuild=./cmd/rvmad
#
# Sockets over RDMA, the compatibility matrix (docs/sockets.md,
# "Compatibility matrix"): every scenario of the conformance program
# (cmd/sockpreload/test/conformance.c) between the two guests under three
# transports: plain TCP (no preload), rdma-core's rsocket preload library
# (librspreload.so) and ours (librdmaplus-sockets.so, with rvmad's broker
# on both guests). Each scenario runs alone (conformance client -x NAME)
# against a server started for it (conformance server -T -P: a thread per
# connection, so that a transport that does not follow fork still serves
# it, and a listener made without type flags, which rsocket's preload
# would leave on TCP); RDMAV_FORK_SAFE=1 on both sides under rsocket for
# the scenarios whose processes fork (fork, exec, posix_spawn, scm_rights,
# peer_killed), as rsocket's manual asks. A scenario passes when the
# client says "ok NAME" and exits 0 and the server's handlers reported no
# failure. Guest 2 counts rxe's packets around each run: a scenario that
# passed with no rxe packet went by TCP.
#
# Prints one line per scenario:
#   COMPAT NAME tcp=ok|FAIL rsocket=ok|FAIL(...) ours=ok|FAIL rxe=R/O
# (R, O: rxe packets under rsocket and ours), then each failure's reason.
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
trap 'jobs -p | xargs -r kill -9 2>/dev/null || true' EXIT
dir=$LAB_DIR/build/sockpreload
ours=$dir/librdmaplus-sockets.so
rs=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
prog=$dir/conformance
[ -x "$prog" ] && [ -f "$ours" ] || lab_fail "$dir: the shim or the conformance program is missing (make sockpreload)"
[ -f "$rs" ] || lab_fail "$rs missing from the guest"
[ -d "/sys/class/infiniband/${LAB_DEVICE:-none}" ] || lab_fail "no RDMA device"
rvmad_sockets_start /tmp/rvmad.log
modes=${COMPAT_MODES:-tcp rsocket ours}
mapfile -t scen < <("$prog" list)
forking=" fork exec posix_spawn scm_rights peer_killed "

# pre MODE SCENARIO: PRE=(env ...), the preload and environment of MODE
# ("${PRE[@]}" CMD &: env execs CMD, so $! is CMD's pid).
pre() {
	PRE=(env)
	case $1 in
	rsocket)
		PRE+=(LD_PRELOAD="$rs")
		case "$forking" in *" $2 "*) PRE+=(RDMAV_FORK_SAFE=1) ;; esac
		;;
	ours) PRE+=(LD_PRELOAD="$ours" RDMAPLUS_SOCKETS_ATTACH_MS=0 RDMAPLUS_SOCKETS_DEBUG=1) ;;
	esac
}

# listening PORT SECS: until a TCP socket listens on PORT (false after SECS).
listening() {
	local hex n=0
	hex=$(printf '%04X' "$1")
	until grep -q "^ *[0-9]*: [0-9A-F]*:$hex [0-9A-F]*:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
		n=$((n + 1))
		[ $n -le $(($2 * 20)) ] || return 1
		sleep 0.05
	done
}

if [ "$LAB_ROLE" = server ]; then
	k=0
	for m in $modes; do
		for s in "${scen[@]}"; do
			k=$((k + 1))
			p=$((7700 + k))
			pre "$m" "$s"
			"${PRE[@]}" "$prog" server -T -P -p $p "$LAB_ADDR" >/tmp/srv.$k 2>&1 &
			srv=$!
			if [ "$m" = rsocket ] && [ -z "$(case "$forking" in *" $s "*) echo f;; esac)" ]; then
				# An rsocket listener is rdma_cm's, with no kernel socket to wait for.
				sleep 1.5
			else
				listening $p 20 || echo "nothing listens on port $p for $m/$s"
			fi
			kill -0 $srv 2>/dev/null || echo "server for $m/$s exited at start: $(head -3 /tmp/srv.$k | tr '\n' ' ')"
			lab_signal ready.$k
			lab_wait done.$k 120
			for _ in $(seq 100); do kill -0 $srv 2>/dev/null || break; sleep 0.05; done
			kill -9 $srv 2>/dev/null && echo "server for $m/$s still ran after its client: killed" >>/tmp/srv.$k || true
			wait $srv 2>/dev/null || true
			grep -E '^FAIL server(/mode|/header|:)' /tmp/srv.$k >"$LAB_SHARED/srv.$k" || true
			grep -q 'killed$' /tmp/srv.$k && echo "FAIL server: still running after the client ended" >>"$LAB_SHARED/srv.$k"
			lab_signal srvdone.$k
		done
	done
	lab_wait compat-done 600
else
	peer=$(lab_peer 1)
	declare -A res rxe why
	k=0
	for m in $modes; do
		for s in "${scen[@]}"; do
			k=$((k + 1))
			p=$((7700 + k))
			lab_wait ready.$k 120
			p0=$(rxe_packets)
			rc=0
			pre "$m" "$s"
			timeout -s KILL 30 "${PRE[@]}" "$prog" client -p $p -r 7699 -x "$s" "$peer" >/tmp/cli.$k 2>&1 || rc=$?
			rxe[$m.$s]=$(($(rxe_packets) - p0))
			lab_signal done.$k
			lab_wait srvdone.$k 120
			if [ $rc -eq 0 ] && grep -qx "ok $s" /tmp/cli.$k && [ ! -s "$LAB_SHARED/srv.$k" ]; then
				res[$m.$s]=ok
			else
				res[$m.$s]=FAIL
				why[$m.$s]="$(grep -m1 -E '^FAIL' /tmp/cli.$k || echo "status $rc, no verdict: $(grep -v '^rdmaplus-sockets' /tmp/cli.$k | tail -1)") $(head -1 "$LAB_SHARED/srv.$k" 2>/dev/null)"
			fi
			echo "ran $m/$s: ${res[$m.$s]} (status $rc, rxe packets ${rxe[$m.$s]})"
		done
	done
	lab_signal compat-done
	echo
	for s in "${scen[@]}"; do
		line="COMPAT $s"
		for m in $modes; do line="$line $m=${res[$m.$s]}"; done
		line="$line rxe="
		for m in $modes; do [ "$m" = tcp ] || line="$line${rxe[$m.$s]}/"; done
		echo "${line%/}"
	done
	echo
	for s in "${scen[@]}"; do
		for m in $modes; do
			[ "${res[$m.$s]}" = ok ] || echo "WHY $m $s: ${why[$m.$s]}"
		done
	done
fi
