#!/bin/bash
# lab: guests=2 timeout=400 make=sockpreload gobuild=./cmd/rvmad
#
# sshd under the sockets shim, unmodified, with rvmad's broker on both
# guests: an accept-then-fork server that re-execs itself (sshd -R), runs
# its pre-authentication child in a seccomp sandbox, and serves the
# session from a child forked after authentication. scp (through ssh
# under the shim) moves 20 MiB each way; both files' sha256 must match and
# each transfer must go by RDMA (rxe's packet counters): the connection
# attaches in the child that serves it, by the kernel's byte counts.
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
sockets_need "$SHIM"
sockets_begin
# the initramfs has no user database: root for both, sshd's privilege separation user
grep -qs '^root:' /etc/passwd || echo 'root:x:0:0:root:/root:/bin/bash' >>/etc/passwd
grep -qs '^root:' /etc/group || echo 'root:x:0:' >>/etc/group
grep -qs '^sshd:' /etc/passwd || echo 'sshd:x:100:65534::/run/sshd:/bin/false' >>/etc/passwd
grep -qs '^nogroup:' /etc/group || echo 'nogroup:x:65534:' >>/etc/group
mkdir -p /root /tmp/ssh /run/sshd
chmod 755 /run/sshd
size=$((20 << 20))

if [ "$LAB_ROLE" = server ]; then
	ssh-keygen -q -t ed25519 -N '' -f /tmp/ssh/host
	ssh-keygen -q -t ed25519 -N '' -f /tmp/ssh/client
	cp /tmp/ssh/client "$LAB_SHARED/ssh-client-key"
	cp /tmp/ssh/client.pub /tmp/ssh/authorized_keys
	cat >/tmp/ssh/sshd_config <<-CONF
	Port 2222
	HostKey /tmp/ssh/host
	PermitRootLogin yes
	AuthorizedKeysFile /tmp/ssh/authorized_keys
	StrictModes no
	UsePAM no
	Subsystem sftp /usr/lib/openssh/sftp-server
	PidFile /tmp/ssh/sshd.pid
	CONF
	head -c $size /dev/urandom >/tmp/down
	sha256sum /tmp/down | cut -d' ' -f1 >"$LAB_SHARED/down.sha256"
	# sshd must be started by its absolute path to re-exec itself
	shim /usr/sbin/sshd -D -e -f /tmp/ssh/sshd_config >/tmp/sshd.log 2>&1 &
	(lab_wait_listen 2222 30) || { cat /tmp/sshd.log; exit 1; }
	lab_signal sshd-ready
	lab_wait uploaded 300
	sha256sum /tmp/up | cut -d' ' -f1 >"$LAB_SHARED/up.server.sha256"
	lab_signal checked
	lab_wait client-done 300
	tail -20 /tmp/sshd.log
	if grep -q "terminated by signal" /tmp/sshd.log; then
		lab_fail "an sshd child died of a signal under the shim"
	fi
else
	wait_peer sshd-ready
	cp "$LAB_SHARED/ssh-client-key" /tmp/ssh/client
	chmod 600 /tmp/ssh/client
	head -c $size /dev/urandom >/tmp/up
	opts=(-i /tmp/ssh/client -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
		-o BatchMode=yes -o LogLevel=ERROR -P 2222)
	# 20 MiB in 4 KiB writes at least; a fallback to TCP moves none
	scp_by_rdma() {
		local name=$1
		shift
		by_rdma -s . "scp $name" 4000 shim timeout 200 scp "${opts[@]}" "$@"
		grep -q "attached=1" "/tmp/out.scp $name" || lab_fail "scp $name: ssh did not attach"
	}
	scp_by_rdma up /tmp/up "root@$peer:/tmp/up"
	lab_signal uploaded
	lab_wait checked 120
	[ "$(cat "$LAB_SHARED/up.server.sha256")" = "$(sha256sum /tmp/up | cut -d' ' -f1)" ] ||
		lab_fail "the uploaded file differs"
	scp_by_rdma down "root@$peer:/tmp/down" /tmp/down
	[ "$(cat "$LAB_SHARED/down.sha256")" = "$(sha256sum /tmp/down | cut -d' ' -f1)" ] ||
		lab_fail "the downloaded file differs"
	echo "sshd: 20 MiB each way by scp, sha256 equal, both by RDMA"
	lab_signal client-done
fi
