# Helpers for lab suites, sourced by every suite command (bash).
#
#   lab_signal NAME          this guest reached barrier point NAME
#   lab_wait NAME [SECS]     wait until some guest reached NAME (default 60 s)
#   lab_wait_listen PORT [SECS]  wait until a TCP port listens in this guest
#   lab_gotest NAME [ARGS]   run $LAB_BIN/NAME.test from its package directory
#   lab_fail MESSAGE         print MESSAGE and fail the suite
#   lab_rping_server ARGS    serve rping (rping -s -a $LAB_ADDR ARGS) until a
#                            client signals rping-done; signals rping-ready
#   lab_peer I               the address of guest I
#   lab_bench TOOL TEST SIZE FILE  print "BENCH TOOL TEST SIZE VALUE" from the
#                            perftest-style output in FILE: t_typical [µs]
#                            for latency tests, BW average [MB/s] for *_bw

lab_bench() {
	local col=5
	case $2 in *_bw) col=4 ;; esac
	awk -v n="$1" -v t="$2" -v s="$3" -v c="$col" '$1 == s && $2 ~ /^[0-9]+$/ { print "BENCH", n, t, s, $c }' "$4"
}

lab_fail() {
	echo "FAIL: $*" >&2
	exit 1
}

lab_peer() {
	local a
	a=$(echo $LAB_ADDRS | cut -d' ' -f"$1")
	[ -n "$a" ] || lab_fail "no guest $1 in this boot"
	echo "$a"
}

lab_signal() {
	: > "$LAB_SHARED/barrier.$1"
}

lab_wait() {
	local name=$1 secs=${2:-60} n=0
	while [ ! -e "$LAB_SHARED/barrier.$name" ]; do
		n=$((n + 1))
		[ $n -le $((secs * 20)) ] || lab_fail "guest $LAB_INDEX: timed out after ${secs}s waiting for '$name'"
		sleep 0.05
	done
}

lab_wait_listen() {
	local port hex secs=${2:-60} n=0
	hex=$(printf '%04X' "$1")
	while ! grep -q "^ *[0-9]*: [0-9A-F]*:$hex [0-9A-F]*:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
		n=$((n + 1))
		[ $n -le $((secs * 20)) ] || lab_fail "guest $LAB_INDEX: nothing listens on port $1 after ${secs}s"
		sleep 0.05
	done
}

lab_gotest() {
	local name=$1
	shift
	local bin="$LAB_BIN/$name.test"
	[ -x "$bin" ] || lab_fail "$bin missing: list its package in the suite's gotest= header"
	local dir
	dir=$(cat "$LAB_BIN/$name.test.dir" 2>/dev/null) || dir=$LAB_DIR
	(cd "$dir" && "$bin" "$@")
}

# rping's server can miss the client's disconnect and wait forever. The
# client checks the payload (rping -V) and signals rping-done when it is
# through; the server is then stopped.
lab_rping_server() {
	rping -s -a "$LAB_ADDR" "$@" &
	local rp=$!
	sleep 0.5
	lab_signal rping-ready
	lab_wait rping-done 120
	kill $rp 2>/dev/null || true
	wait $rp || true
}
