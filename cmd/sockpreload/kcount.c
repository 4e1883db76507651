/*
 * kcount.c: where a connection's byte streams stand, by the kernel's own
 * counters.
 *
 * A connection the shim did not follow from its start (inherited across
 * exec, or live at a fork, where another process may have moved bytes)
 * has no count of its own that can be trusted. The kernel keeps them:
 * tcp_info's bytes_acked plus the send queue (SIOCOUTQ) is everything
 * written to the socket, bytes_received less the receive queue (SIOCINQ)
 * everything read from it. Such a connection only ever answers an
 * attachment (its peer is the client, so this side opened passively and
 * bytes_acked counts no SYN), and a client asks only while its stream has
 * gone by the anchor alone, so these counts are the stream's offsets
 * (docs/sockets.md, "fork and exec").
 */
#include <errno.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "shim.h"

#define KC_ESTABLISHED	1	/* TCP_ESTABLISHED (netinet/tcp.h, which clashes with linux/tcp.h) */

/*
 * The bytes written to and read from fd's TCP connection. The queues are
 * read before and after tcp_info, and again while they moved (bytes
 * arriving or acknowledged meanwhile); -1 (errno set) unless the
 * connection is established and the counts held still.
 */
int kcount_offsets(int fd, uint64_t *written, uint64_t *read)
{
	for (int i = 0; i < 8; i++) {
		struct tcp_info ti = { 0 };
		socklen_t l = sizeof(ti);
		int in0, out0, in1, out1;

		if (REAL(ioctl)(fd, SIOCINQ, &in0) < 0 || REAL(ioctl)(fd, SIOCOUTQ, &out0) < 0 ||
		    REAL(getsockopt)(fd, IPPROTO_TCP, TCP_INFO, &ti, &l) < 0 ||
		    REAL(ioctl)(fd, SIOCINQ, &in1) < 0 || REAL(ioctl)(fd, SIOCOUTQ, &out1) < 0)
			return -1;
		if (ti.tcpi_state != KC_ESTABLISHED ||
		    l < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof(ti.tcpi_bytes_received)) {
			errno = ENOTCONN;
			return -1;
		}
		if (in0 != in1 || out0 != out1 || in1 < 0 || out1 < 0 ||
		    ti.tcpi_bytes_received < (uint64_t)in1)
			continue;
		*written = ti.tcpi_bytes_acked + (uint64_t)out1;
		*read = ti.tcpi_bytes_received - (uint64_t)in1;
		return 0;
	}
	errno = EAGAIN;
	return -1;
}
