# Helpers for the rvmad lab suites (test/softroce/suites/rvmad*.sh), sourced
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
