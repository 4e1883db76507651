#!/bin/bash
# lab: guests=2 timeout=900 gobuild=./cmd/rvmad
# lab: gotest=./pkg/sockets
#
# pkg/sockets between two guests, each running rvmad with its sockets
# broker (guest 1 serves, guest 2 dials): 16 MiB each way over an
# attached connection with every byte checked and rxe's packet counters
# and the TCP segment counters proving RDMA carried them; plain peers on
# either side stay on TCP; a broker nobody serves stays on TCP; demotes
# mid-stream asked by either side, and a QP failed mid-stream (demoted
# through rvmad, every byte delivered); the server's rxe device deleted
# mid-stream (rvmad says so, the server demotes and closes it, the
# delete returns, every byte delivered); an attached peer killed with
# SIGKILL gives an error, never a hang; a peer closing at once delivers
# everything, then end of file; deadlines and a Read woken by ring
# bytes; Upgrade of net connections; eight connections at once.
# Then rvmad stops on both guests and new connections stay on TCP.
set -euo pipefail
source "$LAB_DIR/cmd/rvmad/testdata/lab/helpers.sh"
trap 'jobs -p | xargs -r kill 2>/dev/null || true' EXIT

rvmad_sockets_start /tmp/rvmad-sockets.log
SOCKETS_PHASE=a lab_gotest sockets -test.v -test.count=1 -test.timeout 600s \
	-test.run '^TestLab(RDMATransfer|PlainPeer|NoRvmad|Demote|PeerKilled|Deadlines|PeerCloses|Upgrade|Many|QPError|DualStack|DeviceRemoved)$' ||
	{ echo "--- rvmad's log:"; cat /tmp/rvmad-sockets.log; lab_fail "pkg/sockets lab tests failed"; }
lab_signal "rvmad-stop-$LAB_INDEX"
lab_wait rvmad-stop-1 120
lab_wait rvmad-stop-2 120
rvmad_stop
SOCKETS_PHASE=b SOCKETS_RVMAD=stopped lab_gotest sockets -test.v -test.count=1 -test.timeout 120s \
	-test.run '^TestLabNoRvmad$' || lab_fail "pkg/sockets without rvmad failed"
echo "PASS sockets-go (guest $LAB_INDEX)"
