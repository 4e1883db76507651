# write_bw_loopback SIZE ITERS [FLAGS...]: perftest's ib_write_bw between
# a server and a client in this guest (the anchor of the JBMT bandwidth
# benchmarks), printing the client's average MB/s. On a failure it prints
# both sides' output and returns 1. Sourced by jbmt-bw.sh, jbmt-async.sh
# and jbmt-odp.sh.
write_bw_loopback() {
	local s=$1 n=$2
	shift 2
	ib_write_bw -F -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" "$@" >/tmp/bw.srv 2>&1 &
	local srv=$!
	lab_wait_listen 18515
	if ! ib_write_bw -F -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" "$@" 127.0.0.1 >/tmp/bw.cli 2>&1; then
		cat /tmp/bw.cli >&2
		wait $srv || true
		return 1
	fi
	wait $srv || { cat /tmp/bw.srv >&2; return 1; }
	awk -v s="$s" -v n="$n" '{ for (i = 1; i < NF - 2; i++) if ($i == s && $(i + 1) == n && $(i + 3) ~ /^[0-9.]+$/) print $(i + 3) }' /tmp/bw.cli | tail -1
}
