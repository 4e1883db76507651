#!/bin/bash
# lab: guests=1 timeout=180
# lab: gotest=./cmd/rvmad/internal/sockets
#
# rvmad's sockets broker on a guest kernel: its tests (ownership by a
# passed socket checked against the kernel's sock_diag, over IPv4 and
# IPv6; two brokers relaying in order over 127.0.0.1; every refusal, a
# process's descriptors never kept) run where sock_diag is the guest
# kernel's, loaded from its modules (inet_diag, tcp_diag), not the host's.
set -euo pipefail
lab_gotest sockets -test.v -test.timeout 150s
