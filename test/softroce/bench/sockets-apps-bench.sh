#!/bin/bash
# lab: guests=2 timeout=1200 make=sockpreload gobuild=./cmd/rvmad
#
# Sockets over RDMA with unmodified programs, against plain TCP in one
# boot, interleaved, two rounds: sockperf ping-pong with poll (64 B and
# 4 KiB: p50, p99), iperf3 with 1 and 4 streams (Mbit/s), nginx's
# connection rate under wrk with "Connection: close", redis-benchmark GET
# at pipelines 1 and 16, memcached (two threads) under memcslap (four
# threads, SET then GET, binary protocol; its rxe packets are counted and
# ours must move 1000 or more). Prints each figure and the best of each,
# with their ratios. rsocket (the anchor of sockets-bench.sh) is not in
# the rounds: under its preload library (Debian 12) sockperf fails (sendto
# on a connected socket: EISCONN), iperf3's control connection fails, and
# nginx, redis and wrk use epoll, which it does not intercept; its broken
# servers also keep the guest's CPU busy. memcached and memcslap (neither
# forks) are tried under rsocket once, after the rounds, and the outcome
# printed (RSOCKET lines).
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
sockets_need "$SHIM" "$RSOCKET"
sockets_begin
pre() { mode_preload "$1"; }
off() { case $1 in tcp) echo 0;; rsocket) echo 1;; ours) echo 2;; esac; }
# memcslap_rate MODE PEER TEST: run memcslap under MODE against memcached
# on PEER, output in /tmp/mc; print the keys per second of TEST (set, get).
# memcslap exits 0 whatever failed: fail on any error it reports, or when
# its four threads did not move their 4000 keys.
memcslap_rate() {
	LD_PRELOAD=$(pre "$1") timeout 60 memcslap --servers="$2:$((11211 + $(off "$1")))" --concurrency=4 \
		--execute-number=1000 --binary --test="$3" >/tmp/mc 2>&1 || return 1
	! grep -qi "error" /tmp/mc || return 1
	sed -n "s/^Time to $3 *\([0-9]*\) keys by *[0-9]* threads: *\([0-9.]*\) seconds.*/\1 \2/p" /tmp/mc |
		awk '$1 == 4000 && $2 > 0 { printf "%.0f\n", $1 / $2; ok = 1 } END { exit !ok }'
}

if [ "$LAB_ROLE" = server ]; then
	grep -qs '^root:' /etc/passwd || echo 'root:x:0:0:root:/root:/bin/bash' >>/etc/passwd
	grep -qs '^root:' /etc/group || echo 'root:x:0:' >>/etc/group
	mkdir -p /tmp/www
	echo hello >/tmp/www/index.html
	for m in tcp ours; do
		o=$(off $m)
		echo "T:$LAB_ADDR:$((11110 + o))" >/tmp/feed.$m
		LD_PRELOAD=$(pre $m) sockperf server -f /tmp/feed.$m -F poll >/tmp/sp.$m 2>&1 &
		LD_PRELOAD=$(pre $m) iperf3 -s -p $((5200 + o)) >/tmp/ip.$m 2>&1 &
	done
	for m in tcp ours; do
		o=$(off $m)
		mkdir -p /tmp/ngx.$m
		cat >/tmp/ngx.$m/nginx.conf <<-CONF
		user root;
		worker_processes 2;
		daemon off;
		pid /tmp/ngx.$m/nginx.pid;
		events { worker_connections 512; }
		http {
			access_log off;
			client_body_temp_path /tmp/ngx.$m;
			proxy_temp_path /tmp/ngx.$m;
			fastcgi_temp_path /tmp/ngx.$m;
			uwsgi_temp_path /tmp/ngx.$m;
			scgi_temp_path /tmp/ngx.$m;
			server { listen $((8080 + o)); root /tmp/www; }
		}
		CONF
		LD_PRELOAD=$(pre $m) nginx -e /tmp/ngx.$m/error.log -c /tmp/ngx.$m/nginx.conf -p /tmp/ngx.$m >/dev/null 2>&1 &
		LD_PRELOAD=$(pre $m) redis-server --port $((6379 + o)) --bind 0.0.0.0 --protected-mode no \
			--save "" --appendonly no >/tmp/redis.$m 2>&1 &
		LD_PRELOAD=$(pre $m) memcached -u root -l 0.0.0.0 -p $((11211 + o)) -t 2 >/tmp/mcd.$m 2>&1 &
	done
	for p in 5200 5202 8080 8082 6379 6381 11211 11213; do lab_wait_listen $p; done
	lab_signal bench-ready
	# rsocket's memcached only after the rounds (a broken one may spin)
	lab_wait rsocket-start 1100
	LD_PRELOAD=$(pre rsocket) memcached -u root -l 0.0.0.0 -p $((11211 + $(off rsocket))) -t 2 >/tmp/mcd.rsocket 2>&1 &
	rmc=$!
	sleep 3	# rsocket listens through rdma_cm: no kernel socket to wait for
	if kill -0 $rmc 2>/dev/null; then
		echo "RSOCKET memcached: running"
	else
		rc=0
		wait $rmc || rc=$?
		echo "RSOCKET memcached: exited at start (status $rc)"
	fi
	sed -n '1,20s/^/RSOCKET memcached: /p' /tmp/mcd.rsocket
	lab_signal rsocket-ready
	lab_wait bench-done 300
	kill -0 $rmc 2>/dev/null && echo "RSOCKET memcached: still running after the client" || true
	kill -9 $rmc 2>/dev/null || true
else
	wait_peer bench-ready
	: >/tmp/r
	rec() { echo "$*" | tee -a /tmp/r; }
	for round in 1 2; do
		for m in tcp ours; do
			o=$(off $m)
			echo "T:$peer:$((11110 + o))" >/tmp/feed
			for size in 64 4096; do
				LD_PRELOAD=$(pre $m) timeout 60 sockperf ping-pong -f /tmp/feed -F poll -t 4 -m $size \
					>/tmp/spc 2>&1 || { cat /tmp/spc; lab_fail "$m sockperf $size failed"; }
				p50=$(sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p' /tmp/spc)
				p99=$(sed -n 's/.*percentile 99.000 = *\([0-9.]*\).*/\1/p' /tmp/spc)
				rec "$m sockperf$size.p50 $p50"
				rec "$m sockperf$size.p99 $p99"
			done
			for P in 1 4; do
				LD_PRELOAD=$(pre $m) timeout 60 iperf3 -c "$peer" -p $((5200 + o)) -t 3 -P $P -f m \
					>/tmp/ipc 2>&1 || { cat /tmp/ipc; lab_fail "$m iperf3 -P $P failed"; }
				v=$(grep receiver /tmp/ipc | tail -1 | sed -n 's/.* \([0-9.]*\) Mbits\/sec.*/\1/p')
				rec "$m iperf3.P$P $v"
			done
			LD_PRELOAD=$(pre $m) timeout 60 wrk -t 2 -c 8 -d 3 -H "Connection: close" \
				"http://$peer:$((8080 + o))/index.html" >/tmp/wrk 2>&1 || { cat /tmp/wrk; lab_fail "$m wrk failed"; }
			rec "$m conn_per_s $(sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p' /tmp/wrk)"
			for P in 1 16; do
				LD_PRELOAD=$(pre $m) timeout 120 redis-benchmark -h "$peer" -p $((6379 + o)) -n 4000 -c 8 \
					-P $P -t get -q >/tmp/rb 2>&1 || { cat /tmp/rb; lab_fail "$m redis-benchmark failed"; }
				rec "$m redis.P$P $(tr '\r' '\n' </tmp/rb | sed -n 's/^GET: \([0-9.]*\) requests.*/\1/p' | tail -1)"
			done
			for t in set get; do
				p0=$(rxe_packets)
				v=$(memcslap_rate $m "$peer" $t) || { head -40 /tmp/mc; lab_fail "$m memcslap $t failed"; }
				n=$(($(rxe_packets) - p0))
				rec "$m memcslap.$t $v"
				echo "$m memcslap $t: rxe packets +$n"
				[ $m = tcp ] || [ $n -ge 1000 ] || lab_fail "$m memcslap $t: rxe moved only $n packets: not by RDMA"
			done
		done
	done
	lab_signal rsocket-start
	lab_wait rsocket-ready 120
	for t in set get; do
		p0=$(rxe_packets)
		rc=0
		v=$(memcslap_rate rsocket "$peer" $t) || rc=$?
		echo "RSOCKET memcslap $t: ${v:-FAIL} (status $rc, rxe packets +$(($(rxe_packets) - p0)))"
		sed -n '1,12s/^/RSOCKET memcslap: /p' /tmp/mc
	done
	lab_signal bench-done
	# the best of the rounds: the lowest latency, the highest rate
	med() {
		local order=-gr
		case $2 in *.p*) order=-g ;; esac
		awk -v m="$1" -v n="$2" '$1 == m && $2 == n { print $3 }' /tmp/r | sort $order | head -1
	}
	for n in sockperf64.p50 sockperf64.p99 sockperf4096.p50 sockperf4096.p99 iperf3.P1 iperf3.P4 conn_per_s redis.P1 redis.P16 memcslap.set memcslap.get; do
		t=$(med tcp $n) o=$(med ours $n)
		echo "best of 2, $n: tcp ${t:--}, ours ${o:--}; ours/tcp $(awk -v a="$o" -v b="$t" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')"
	done
fi
echo "PASS sockets-apps-bench (guest $LAB_INDEX)"
