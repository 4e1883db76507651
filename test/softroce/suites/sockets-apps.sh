#!/bin/bash
# lab: guests=2 timeout=600 make=sockpreload gobuild=./cmd/rvmad
#
# Unmodified epoll servers and clients under the sockets shim between two
# guests, rvmad's broker on both: redis-server with redis-benchmark (SET
# and GET, pipelines of 1 and 16) and a BGSAVE (a fork with busy
# connections) during the load; nginx with two worker processes (prefork:
# each worker attaches what it accepts) under wrk, and a 1 MiB file by
# curl whose sha256 must match; memcached under memcslap. Every run must
# go by RDMA (rxe's packet counters), and every program must exit 0.
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
sockets_need "$SHIM"
sockets_begin

if [ "$LAB_ROLE" = server ]; then
	mkdir -p /tmp/redis /tmp/www /tmp/nginx
	head -c $((1 << 20)) /dev/urandom >/tmp/www/file
	# the initramfs has no user database; nginx and memcached look root up
	grep -qs '^root:' /etc/passwd || echo 'root:x:0:0:root:/root:/bin/bash' >>/etc/passwd
	grep -qs '^root:' /etc/group || echo 'root:x:0:' >>/etc/group
	cat >/tmp/nginx/nginx.conf <<-CONF
	user root;
	worker_processes 2;
	daemon off;
	error_log /tmp/nginx/error.log;
	pid /tmp/nginx/nginx.pid;
	events { worker_connections 256; }
	http {
		access_log off;
		client_body_temp_path /tmp/nginx;
		proxy_temp_path /tmp/nginx;
		fastcgi_temp_path /tmp/nginx;
		uwsgi_temp_path /tmp/nginx;
		scgi_temp_path /tmp/nginx;
		sendfile off;
		server { listen 8080; root /tmp/www; }
	}
	CONF
	shim redis-server --port 6379 --bind 0.0.0.0 --protected-mode no --dir /tmp/redis \
		--save "" --appendonly no >/tmp/redis.log 2>&1 &
	shim nginx -e /tmp/nginx/error.log -c /tmp/nginx/nginx.conf -p /tmp/nginx >/tmp/nginx.log 2>&1 &
	shim memcached -u root -l 0.0.0.0 -p 11211 -t 2 >/tmp/memcached.log 2>&1 &
	for p in 6379 8080 11211; do
		(lab_wait_listen $p 30) || { cat /tmp/redis.log /tmp/nginx.log /tmp/nginx/error.log /tmp/memcached.log; exit 1; }
	done
	sha256sum /tmp/www/file | cut -d' ' -f1 >/tmp/www/file.sha256
	lab_signal servers-ready
	lab_wait clients-done 500
	tail -5 /tmp/redis.log /tmp/nginx/error.log /tmp/memcached.log 2>/dev/null || true
else
	wait_peer servers-ready
	by_rdma redis-p1 2000 shim timeout 200 redis-benchmark -h "$peer" -p 6379 -n 5000 -c 8 -t set,get -q
	by_rdma redis-p16 2000 shim timeout 200 redis-benchmark -h "$peer" -p 6379 -n 20000 -c 8 -P 16 -t set,get -q
	# BGSAVE during a load: the server forks with its connections busy.
	shim timeout 200 redis-benchmark -h "$peer" -p 6379 -n 20000 -c 8 -t set -q >/tmp/out.redis-bg 2>&1 &
	bench=$!
	sleep 1
	shim timeout 30 redis-cli -h "$peer" -p 6379 BGSAVE | tee /tmp/bgsave
	grep -q "Background saving started" /tmp/bgsave || lab_fail "BGSAVE did not start"
	wait $bench || { cat /tmp/out.redis-bg; lab_fail "redis-benchmark during BGSAVE failed"; }
	tail -2 /tmp/out.redis-bg
	v=$(shim timeout 30 redis-cli -h "$peer" -p 6379 DBSIZE)
	echo "redis DBSIZE $v"
	[ "${v:-0}" -ge 1 ] || lab_fail "redis has no keys"

	by_rdma wrk 2000 shim timeout 120 wrk -t 2 -c 8 -d 4 "http://$peer:8080/file"
	want=$(shim timeout 30 curl -sf "http://$peer:8080/file.sha256")
	got=$(shim timeout 60 curl -sf "http://$peer:8080/file" | sha256sum | cut -d' ' -f1)
	echo "nginx: curl sha256 $got, want $want"
	[ -n "$want" ] && [ "$got" = "$want" ] || lab_fail "the file curl got through nginx differs"

	by_rdma memcslap 1000 shim timeout 200 memcslap --servers="$peer:11211" --concurrency=4 --execute-number=2000 --binary
	# memcslap exits 0 whatever failed: no error reported, and its four
	# threads moved their 8000 keys
	! grep -qi error /tmp/out.memcslap || { cat /tmp/out.memcslap; lab_fail "memcslap reported errors"; }
	grep -Eq '^Time to [a-z]+ +8000 keys by +4 threads' /tmp/out.memcslap ||
		{ cat /tmp/out.memcslap; lab_fail "memcslap did not move its 8000 keys"; }
	lab_signal clients-done
fi
echo "PASS sockets-apps (guest $LAB_INDEX)"
