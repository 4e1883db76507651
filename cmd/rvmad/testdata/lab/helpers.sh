# Helpers for the rvmad and sockets lab suites and benches
# (test/softroce/suites/rvmad*.sh, sockets-*.sh, test/softroce/bench/sockets-*.sh), sourced
# with: source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
#
#   rvmad_start LOG ARGS...      start "$LAB_BIN/rvmad serve ARGS" in the background, log to LOG; sets RVMAD_PID
#   rvmad_stop [PID]             SIGTERM rvmad, wait, fail unless it exits 0 within 15 s
#   rvmad_sockets_start LOG      start rvmad with its sockets broker (/run/rvmad/sockets.sock,
#                                pairing port 7473, metrics on 127.0.0.1:9470) and wait until
#                                the broker's socket exists; sets RVMAD_PID
#   rxe_packets                  packets $LAB_DEVICE sent and received so far (its hw_counters)
#   http_ok URL                  true when URL answers 200
#   wait_http URL [SECS]         wait until URL answers 200 (default 60 s)
#   scrape URL FILE              save the metrics at URL in FILE
#   metric FILE SERIES           the value of SERIES (name{labels} exactly as exposed), fails when absent
#   ge A B                       true when number A >= number B (floats, exponents)
#   delta FILE1 FILE2 SERIES     SERIES in FILE2 minus in FILE1, as an integer
#   equal_files FILE DIR F:M...  fail unless metric M in FILE equals the number in DIR/F, for each F:M
#   show_changes FILE1 FILE2 [S] print the series whose value changed among those whose
#                                name or labels contain S (default: device=" series)
#   tcp_segs                     TCP segments this guest received and sent so far (/proc/net/snmp)
#
# For the sockets suites and benches (test/softroce/suites/sockets-*.sh,
# test/softroce/bench/sockets-*.sh), whose programs run under the shim that
# make sockpreload builds into $SOCKPRELOAD:
#   SHIM, BULK                   the shim (librdmaplus-sockets.so) and bulk (cmd/sockpreload/test/bulk.c)
#   RSOCKET                      rdma-core's rsocket preload library (librspreload.so)
#   sockets_need FILE...         fail unless each FILE exists (the shim's: make sockpreload)
#   sockets_begin [SIGNAL]       kill the script's background jobs at its exit (with SIGNAL, default
#                                TERM), start rvmad with its sockets broker (rvmad_sockets_start
#                                /tmp/rvmad.log)
#   shim CMD...                  run CMD under the shim with its summaries (RDMAPLUS_SOCKETS_DEBUG=1)
#   wait_peer EVENT [SECS]       wait for EVENT (lab_wait, default 120 s), then set peer to guest 1's address
#   rxe_check NAME N MIN         print that rxe moved N packets for NAME, fail unless N >= MIN (not by RDMA)
#   by_rdma [-s RE] NAME MIN CMD...
#                                run CMD with its output in /tmp/out.NAME; fail (showing all of it)
#                                unless it exits 0, else show the lines that match RE (default: the
#                                last 8), and fail unless rxe moved MIN packets or more
#   mode_port MODE, mode_preload MODE
#                                for MODE tcp, rsocket or ours: bulk's port (7491 to 7493) and LD_PRELOAD
#   bulk_servers MODE...         start `bulk server` under each MODE (output /tmp/srv.MODE, pid in
#                                BULK_PID[MODE]) and wait until each serves
#
# For `make demo` (test/softroce/demo/demo.sh, with gobuild=./cmd/rvmad in its header):
#   rvmad_demo_begin             start rvmad on 127.0.0.1:9470 (sockets broker on) and take the "before" scrape
#   rvmad_demo_end               take the "after" scrape, show what moved, stop rvmad (exit 0)
#
# busybox wget -T (timeout) segfaults in Debian 12's busybox-static: never use it.

RVMAD=${RVMAD:-$LAB_BIN/rvmad}

rvmad_start() {
	local log=$1
	shift
	"$RVMAD" serve "$@" >"$log" 2>&1 &
	RVMAD_PID=$!
	echo "rvmad pid $RVMAD_PID: $RVMAD serve $*"
}

rvmad_stop() {
	local pid=${1:-$RVMAD_PID} n=0 rc
	kill -TERM "$pid"
	while kill -0 "$pid" 2>/dev/null; do
		n=$((n + 1))
		[ $n -le 300 ] || lab_fail "rvmad $pid still running 15 s after SIGTERM"
		sleep 0.05
	done
	rc=0
	wait "$pid" || rc=$?
	[ "$rc" -eq 0 ] || lab_fail "rvmad exited $rc after SIGTERM"
	echo "rvmad $pid exited 0 after SIGTERM"
}

rvmad_sockets_start() {
	local log=$1 n=0
	mkdir -p /run/rvmad
	cat >/tmp/rvmad-sockets.json <<-'JSON'
	{"listen": "127.0.0.1:9470", "sockets": {"enabled": true}}
	JSON
	rm -f /run/rvmad/sockets.sock
	rvmad_start "$log" -config /tmp/rvmad-sockets.json
	until [ -S /run/rvmad/sockets.sock ]; do
		n=$((n + 1))
		[ $n -le 300 ] || { cat "$log"; lab_fail "rvmad's sockets broker not up after 30 s"; }
		kill -0 "$RVMAD_PID" 2>/dev/null || { cat "$log"; lab_fail "rvmad exited at start"; }
		sleep 0.1
	done
}

rxe_packets() {
	local d=/sys/class/infiniband/$LAB_DEVICE/ports/1/hw_counters
	echo $(( $(cat "$d/sent_pkts") + $(cat "$d/rcvd_pkts") ))
}

http_ok() {
	wget -q -O /dev/null "$1" 2>/dev/null
}

wait_http() {
	local url=$1 secs=${2:-60} n=0
	until http_ok "$url"; do
		n=$((n + 1))
		[ $n -le $((secs * 10)) ] || { wget -q -O- "$url" 2>&1 || true; lab_fail "$url not 200 after ${secs}s"; }
		sleep 0.1
	done
}

scrape() {
	wget -q -O "$2" "$1" || lab_fail "scrape of $1 failed"
}

metric() {
	local v
	v=$(awk -v s="$2" '$1 == s { print $2; found = 1 } END { exit !found }' "$1") || lab_fail "$2 missing from $1"
	echo "$v"
}

ge() {
	awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 >= b + 0) }'
}

delta() {
	local a b
	a=$(metric "$1" "$3") b=$(metric "$2" "$3")
	awk -v a="$a" -v b="$b" 'BEGIN { printf "%.0f\n", b - a }'
}

equal_files() {
	local file=$1 dir=$2 pair f m got want
	shift 2
	for pair in "$@"; do
		f=${pair%%:*} m=${pair#*:}
		got=$(metric "$file" "$m") want=$(cat "$dir/$f")
		ge "$got" "$want" && ge "$want" "$got" || lab_fail "$m is $got, $dir/$f is $want"
	done
}

show_changes() {
	local match=${3:-device=\"}
	awk -v m="$match" 'FNR == NR { if (index($1, m)) before[$1] = $2; next }
	     index($1, m) && ($1 in before) && $2 != before[$1] { printf "  %-72s %14.0f -> %14.0f  (%+.0f)\n", $1, before[$1], $2, $2 - before[$1] }' "$1" "$2"
}

rvmad_demo_begin() {
	RVMAD_DEMO_DIR=${LAB_OUT:-/tmp}/rvmad-demo
	mkdir -p "$RVMAD_DEMO_DIR"
	mkdir -p /run/rvmad
	echo '{"sockets": {"enabled": true}}' >"$RVMAD_DEMO_DIR/rvmad.json"
	rvmad_start "$RVMAD_DEMO_DIR/rvmad.log" -config "$RVMAD_DEMO_DIR/rvmad.json" --listen 127.0.0.1:9470 --device "$LAB_DEVICE"
	wait_http http://127.0.0.1:9470/readyz
	scrape http://127.0.0.1:9470/metrics "$RVMAD_DEMO_DIR/before.prom"
	printf '\n== guest %s: rvmad is up (http://127.0.0.1:9470/metrics); counters of %s before the traffic:\n' "$LAB_INDEX" "$LAB_DEVICE"
	grep -E "^rvmad_(hw_(sent|received)_packets|port_state|port_active_mtu_bytes)[a-z_]*\\{device=\"$LAB_DEVICE\"" "$RVMAD_DEMO_DIR/before.prom" | sed 's/^/  /'
}

rvmad_demo_end() {
	scrape http://127.0.0.1:9470/metrics "$RVMAD_DEMO_DIR/after.prom"
	printf '\n== guest %s: what rvmad saw move on %s during the demo:\n' "$LAB_INDEX" "$LAB_DEVICE"
	show_changes "$RVMAD_DEMO_DIR/before.prom" "$RVMAD_DEMO_DIR/after.prom"
	printf '\n== guest %s: the module'"'"'s JBMT counters in rvmad, where they moved:\n' "$LAB_INDEX"
	show_changes "$RVMAD_DEMO_DIR/before.prom" "$RVMAD_DEMO_DIR/after.prom" rdmaplus_jbmt_
	printf '\n== guest %s: rvmad'"'"'s sockets broker, where its counters moved:\n' "$LAB_INDEX"
	show_changes "$RVMAD_DEMO_DIR/before.prom" "$RVMAD_DEMO_DIR/after.prom" rdmaplus_sockets_
	rvmad_stop
}

# tcp_segs: TCP segments this guest received and sent so far (InSegs +
# OutSegs of /proc/net/snmp), the TCP side of a proof of transport beside
# rxe_packets.
tcp_segs() {
	awk '/^Tcp:/ { if (!h) { for (i = 1; i <= NF; i++) c[$i] = i; h = 1 } else print $c["InSegs"] + $c["OutSegs"] }' /proc/net/snmp
}

SOCKPRELOAD=${LAB_DIR:-}/build/sockpreload
SHIM=$SOCKPRELOAD/librdmaplus-sockets.so
BULK=$SOCKPRELOAD/bulk
RSOCKET=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so

sockets_need() {
	local f
	for f in "$@"; do
		case $f in
		"$SOCKPRELOAD"/*) [ -e "$f" ] || lab_fail "$f is missing (make sockpreload)" ;;
		*) [ -e "$f" ] || lab_fail "$f missing from the guest" ;;
		esac
	done
}

sockets_begin() {
	trap "jobs -p | xargs -r kill -${1:-TERM} 2>/dev/null || true" EXIT
	rvmad_sockets_start /tmp/rvmad.log
}

shim() {
	LD_PRELOAD=$SHIM RDMAPLUS_SOCKETS_DEBUG=1 "$@"
}

wait_peer() {
	lab_wait "$1" "${2:-120}"
	peer=$(lab_peer 1)
}

rxe_check() {
	echo "$1: rxe packets +$2"
	[ "$2" -ge "$3" ] || lab_fail "$1: rxe moved only $2 packets: not by RDMA"
}

by_rdma() {
	local show= name min p0 p1 rc=0
	[ "$1" != -s ] || { show=$2; shift 2; }
	name=$1 min=$2
	shift 2
	p0=$(rxe_packets)
	"$@" >"/tmp/out.$name" 2>&1 || rc=$?
	p1=$(rxe_packets)
	if [ $rc -ne 0 ]; then
		cat "/tmp/out.$name"
		lab_fail "$name failed (status $rc)"
	elif [ -n "$show" ]; then
		grep -E "$show" "/tmp/out.$name" || true
	else
		grep -v "^$" "/tmp/out.$name" | tail -8
	fi
	rxe_check "$name" $((p1 - p0)) "$min"
}

mode_port() {
	case $1 in tcp) echo 7491 ;; rsocket) echo 7492 ;; ours) echo 7493 ;; esac
}

mode_preload() {
	case $1 in tcp) echo "" ;; rsocket) echo "$RSOCKET" ;; ours) echo "$SHIM" ;; esac
}

declare -A BULK_PID
bulk_servers() {
	local m rs=
	for m in "$@"; do
		LD_PRELOAD=$(mode_preload "$m") RDMAPLUS_SOCKETS_ATTACH_MS=0 "$BULK" server -p "$(mode_port "$m")" >/tmp/srv.$m 2>&1 &
		BULK_PID[$m]=$!
	done
	for m in "$@"; do
		case $m in rsocket) rs=1 ;; *) lab_wait_listen "$(mode_port "$m")" ;; esac
	done
	[ -n "$rs" ] || return 0
	sleep 3	# rsocket listens through rdma_cm: no kernel socket to wait for
	kill -0 "${BULK_PID[rsocket]}" || { cat /tmp/srv.rsocket; lab_fail "the rsocket server exited"; }
}
