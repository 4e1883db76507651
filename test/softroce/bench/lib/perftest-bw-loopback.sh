# perftest_bw_loopback PROG SIZE ITERS [FLAGS...]: perftest's PROG
# (ib_write_bw or ib_read_bw) between a server and a client in this guest,
# printing the client's average MB/s. On a failure it prints both sides'
# output and returns 1. write_bw_loopback and read_bw_loopback name the
# two anchors of the JBMT bandwidth benchmarks. Sourced by jbmt-bw.sh,
# jbmt-async.sh, jbmt-odp.sh, jbmt-pincache.sh and jbmt-profile.sh.
perftest_bw_loopback() {
	local prog=$1 s=$2 n=$3
	shift 3
	$prog -F -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" "$@" >/tmp/bw.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	if ! $prog -F -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" "$@" 127.0.0.1 >/tmp/bw.cli 2>&1; then
		cat /tmp/bw.cli >&2
		wait $srv || true
		return 1
	fi
	wait $srv || { cat /tmp/bw.srv >&2; return 1; }
	awk -v s="$s" -v n="$n" '{ for (i = 1; i < NF - 2; i++) if ($i == s && $(i + 1) == n && $(i + 3) ~ /^[0-9.]+$/) print $(i + 3) }' /tmp/bw.cli | tail -1
}

write_bw_loopback() { perftest_bw_loopback ib_write_bw "$@"; }
read_bw_loopback() { perftest_bw_loopback ib_read_bw "$@"; }
