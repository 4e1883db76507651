# Helpers for the rvmad lab suites (test/softroce/suites/rvmad*.sh), sourced
# with: source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
#
#   rvmad_start LOG ARGS...      start "$LAB_BIN/rvmad serve ARGS" in the background, log to LOG; sets RVMAD_PID
#   rvmad_stop [PID]             SIGTERM rvmad, wait, fail unless it exits 0 within 15 s
#   http_ok URL                  true when URL answers 200
#   wait_http URL [SECS]         wait until URL answers 200 (default 30 s)
#   scrape URL FILE              save the metrics at URL in FILE
#   metric FILE SERIES           the value of SERIES (name{labels} exactly as exposed), fails when absent
#   ge A B                       true when number A >= number B (floats, exponents)
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

http_ok() {
	wget -q -O /dev/null "$1" 2>/dev/null
}

wait_http() {
	local url=$1 secs=${2:-30} n=0
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
