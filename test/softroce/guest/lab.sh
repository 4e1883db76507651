# Helpers for lab suites, sourced by every suite command (bash).
#
#   lab_signal NAME          this guest reached barrier point NAME
#   lab_wait NAME [SECS]     wait until some guest reached NAME (default 60 s)
#   lab_wait_listen PORT [SECS]  wait until a TCP port listens in this guest
#   lab_gotest NAME [ARGS]   run $LAB_BIN/NAME.test from its package directory
#   lab_fail MESSAGE         print MESSAGE and fail the suite
#   lab_tee FILE CMD...      run CMD, printing its output and appending it
#                            to FILE; a failing CMD fails the suite
#   lab_rping_server ARGS    serve rping (rping -s -a $LAB_ADDR ARGS) until a
#                            client signals rping-done; signals rping-ready
#   lab_peer I               the address of guest I
#   lab_bench TOOL TEST SIZE FILE  print "BENCH TOOL TEST SIZE VALUE" from the
#                            perftest-style output in FILE: t_typical [µs]
#                            for latency tests, BW average [MB/s] followed
#                            by MsgRate [Mpps] for *_bw
#   lab_pair NAME PORT TEST SIZE SERVER-CMD... -- CLIENT-CMD...
#                            one step of a two-guest benchmark: the server
#                            command on guest 1 (LAB_ROLE server, listening
#                            on PORT), the client on the other guest, which
#                            prints the step's BENCH line; both print their
#                            output's '#' lines (rdmaperf -ctxsw)

lab_bench() {
	case $2 in
	*_bw) # BW average [MB/s] and MsgRate [Mpps] (more digits for small sizes)
		awk -v n="$1" -v t="$2" -v s="$3" '$1 == s && $2 ~ /^[0-9]+$/ { print "BENCH", n, t, s, $4, $5 }' "$4" ;;
	*) # t_typical [usec]
		awk -v n="$1" -v t="$2" -v s="$3" '$1 == s && $2 ~ /^[0-9]+$/ { print "BENCH", n, t, s, $5 }' "$4" ;;
	esac
}

LAB_PAIR_STEP=0
lab_pair() {
	local name=$1 port=$2 t=$3 s=$4 side out
	shift 4
	local srv=() cli=()
	while [ "$1" != -- ]; do srv+=("$1"); shift; done
	shift
	cli=("$@")
	LAB_PAIR_STEP=$((LAB_PAIR_STEP + 1))
	if [ "$LAB_ROLE" = server ]; then
		side=SRV out=/tmp/lab-pair.srv
		"${srv[@]}" >$out 2>&1 &
		local pid=$!
		lab_wait_listen "$port"
		lab_signal "ready-$LAB_PAIR_STEP"
		wait $pid || { cat $out; lab_fail "$name $t -s $s server failed"; }
	else
		side=CLI out=/tmp/lab-pair.cli
		lab_wait "ready-$LAB_PAIR_STEP" 600
		"${cli[@]}" >$out 2>&1 || { cat $out; lab_fail "$name $t -s $s failed"; }
		lab_bench "$name" "$t" "$s" $out
	fi
	! grep -q '^#' $out || echo "$side $name $t $s: $(grep '^#' $out)"
	if [ "$LAB_ROLE" = server ]; then
		lab_wait "done-$LAB_PAIR_STEP" 600
	else
		lab_signal "done-$LAB_PAIR_STEP"
	fi
}

lab_fail() {
	echo "FAIL: $*" >&2
	exit 1
}

lab_tee() {
	local f=$1
	shift
	"$@" 2>&1 | tee -a "$f" || lab_fail "$* failed"
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
