/*
 * io.c: the data calls: read, recv, recvfrom, recvmsg, readv, recvmmsg,
 * write, send, sendto, sendmsg, writev, sendmmsg, and glibc's fortified
 * __read_chk, __recv_chk, __recvfrom_chk.
 *
 * An fd the shim does not follow goes straight to libc after one table
 * lookup. On a tracked socket not (yet) attachable, libc is called too
 * and the bytes moved are added to the connection's counters (a MSG_PEEK
 * consumes nothing, so it counts nothing); io_begin may make it
 * attachable first. errno is libc's: counting makes no system call.
 *
 * Attached, reads follow the connection's incoming direction: the anchor
 * up to the peer's switch offset (never beyond: at most switch - consumed
 * bytes are asked of the kernel), then the ring; writes follow the
 * outgoing one: the anchor before the switch, the peer's ring after it
 * (RDMA WRITE with immediate, kept until credited), held during a demote.
 * The nonblocking flag (or MSG_DONTWAIT) picks EAGAIN over waiting.
 *
 * SCM_RIGHTS: fds a process receives may be sockets the table has not
 * seen, or numbers it remembers for something else: their slots become
 * unknown, and the first wrapper to meet one probes it. A tracked socket
 * sent away demotes first (once attached): the receiver may have no shim.
 */
#include "rdma.h"

#include <sched.h>

void __chk_fail(void) __attribute__((noreturn));

/*
 * The plain path's byte count (the stream's offsets until the connection
 * becomes attachable; a MSG_PEEK consumes nothing), and the end of the
 * I/O that io_begin let through (held).
 */
static ssize_t io_end(struct conn *c, int held, ssize_t r, int peek, int rd)
{
	if (r > 0 && !peek) {
		conn_count(c, rd, (uint64_t)r);
		stat_add(rd ? &c->rx : &c->tx, (uint64_t)r);
	}
	if (held)
		atomic_fetch_sub(&c->inflight, 1);
	return r;
}

/*
 * Before a tracked socket moves bytes (a connect in progress that
 * completed is noticed first): its attachable state to use, or NULL with
 * *held set when the plain path may go on. A connection becomes
 * attachable only while no plain I/O is in flight on it, so that the
 * stream's offsets it starts from are exact: io_begin and
 * conn_maybe_attach meet through c->inflight and c->attaching.
 */
static struct att *io_begin(struct conn *c, int fd, int *held)
{
	struct att *a;

	*held = 0;
	for (;;) {
		conn_moved(c, fd);
		if ((a = conn_att(c)))
			return a;
		if (unlikely(atomic_load_explicit(&c->eligible, memory_order_relaxed)) &&
		    (a = conn_maybe_attach(c, fd)))
			return a;
		atomic_fetch_add(&c->inflight, 1);
		if (likely(!atomic_load(&c->attaching)) && !conn_att(c)) {
			*held = 1;
			return NULL;
		}
		atomic_fetch_sub(&c->inflight, 1);
		while (atomic_load(&c->attaching))
			sched_yield();
	}
}

/* flags the ring serves; others (MSG_OOB, MSG_ERRQUEUE, ...) demote first. */
#define RING_RFLAGS	(MSG_PEEK | MSG_DONTWAIT | MSG_WAITALL | MSG_NOSIGNAL | MSG_CMSG_CLOEXEC)
#define RING_WFLAGS	(MSG_DONTWAIT | MSG_NOSIGNAL | MSG_MORE | MSG_EOR)

/* An attachable connection and flags the ring does not serve: demoted. */
static struct att *ring_flags(struct conn *c, struct att *a, int flags, int ok)
{
	if (a && (flags & ~ok)) {
		conn_demote(c, SOCKPROTO_R_DISABLED);
		return NULL;
	}
	return a;
}

static ssize_t att_recv1(struct conn *c, struct att *a, void *buf, size_t n, int flags)
{
	struct iovec v = { buf, n };

	return att_recv(c, a, &v, 1, flags);
}

static ssize_t att_send1(struct conn *c, struct att *a, const void *buf, size_t n, int flags)
{
	struct iovec v = { (void *)buf, n };

	return att_send(c, a, &v, 1, flags);
}

/* Fds received with SCM_RIGHTS: look at them afresh. */
void io_received_fds(struct msghdr *msg)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
		int *fds = (int *)CMSG_DATA(cm);
		size_t n;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++)
			if (fdt_load(fds[i]) != SLOT_UNKNOWN)
				conn_forget(fds[i]);
	}
}

/* Fds about to be sent with SCM_RIGHTS: tracked ones leave the shim's reach. */
static void io_sending_fds(const struct msghdr *msg)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm;
	     cm = CMSG_NXTHDR((struct msghdr *)msg, cm)) {
		const int *fds = (const int *)CMSG_DATA(cm);
		size_t n;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			struct conn *c = slot_conn(fdt_load(fds[i]));

			if (c) {
				stat_add(&shim_stats.fd_passed, 1);
				conn_demote(c, SOCKPROTO_R_FD_PASSED);
			}
		}
	}
}

static void received(struct msghdr *msg, ssize_t r)
{
	int err;

	if (r < 0 || !msg->msg_control || msg->msg_controllen == 0)
		return;
	err = errno;
	io_received_fds(msg);
	errno = err;
}

/* read: see the file comment. */
SHIM_EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (likely(!c))
		return REAL(read)(fd, buf, n);
	if ((a = io_begin(c, fd, &held)))
		return att_recv1(c, a, buf, n, 0);
	return io_end(c, held, REAL(read)(fd, buf, n), 0, 1);
}

SHIM_EXPORT ssize_t __read(int fd, void *buf, size_t n) __attribute__((alias("read")));

/* __read_chk: read with _FORTIFY_SOURCE's buffer check (libc's). */
SHIM_EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (likely(!c))
		return REAL(__read_chk)(fd, buf, n, buflen);
	if ((a = io_begin(c, fd, &held))) {
		if (n > buflen)
			__chk_fail();
		return att_recv1(c, a, buf, n, 0);
	}
	return io_end(c, held, REAL(__read_chk)(fd, buf, n, buflen), 0, 1);
}

/* recv: MSG_PEEK, MSG_WAITALL, MSG_DONTWAIT served by the ring too. */
SHIM_EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (likely(!c))
		return REAL(recv)(fd, buf, n, flags);
	if ((a = ring_flags(c, io_begin(c, fd, &held), flags, RING_RFLAGS)))
		return att_recv1(c, a, buf, n, flags);
	return io_end(c, held, REAL(recv)(fd, buf, n, flags), flags & MSG_PEEK, 1);
}

SHIM_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (likely(!c))
		return REAL(__recv_chk)(fd, buf, n, buflen, flags);
	if ((a = ring_flags(c, io_begin(c, fd, &held), flags, RING_RFLAGS))) {
		if (n > buflen)
			__chk_fail();
		return att_recv1(c, a, buf, n, flags);
	}
	return io_end(c, held, REAL(__recv_chk)(fd, buf, n, buflen, flags), flags & MSG_PEEK, 1);
}

/* recvfrom: on a connected TCP socket, the address is the peer's. */
SHIM_EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags,
			     struct sockaddr *addr, socklen_t *alen)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (likely(!c))
		return REAL(recvfrom)(fd, buf, n, flags, addr, alen);
	if ((a = ring_flags(c, io_begin(c, fd, &held), flags, RING_RFLAGS))) {
		if (alen)
			*alen = 0;
		return att_recv1(c, a, buf, n, flags);
	}
	return io_end(c, held, REAL(recvfrom)(fd, buf, n, flags, addr, alen), flags & MSG_PEEK, 1);
}

SHIM_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags,
				   struct sockaddr *addr, socklen_t *alen)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (likely(!c))
		return REAL(__recvfrom_chk)(fd, buf, n, buflen, flags, addr, alen);
	if ((a = ring_flags(c, io_begin(c, fd, &held), flags, RING_RFLAGS))) {
		if (n > buflen)
			__chk_fail();
		if (alen)
			*alen = 0;
		return att_recv1(c, a, buf, n, flags);
	}
	return io_end(c, held, REAL(__recvfrom_chk)(fd, buf, n, buflen, flags, addr, alen),
		      flags & MSG_PEEK, 1);
}

/*
 * recvmsg: also on sockets the shim does not follow (Unix sockets carry
 * SCM_RIGHTS): received fds are looked at afresh. Attached: ring bytes
 * scatter into the iovecs; no control message comes with them.
 */
SHIM_EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	ssize_t r;
	int held = 0;

	if (c && (a = ring_flags(c, io_begin(c, fd, &held), flags, RING_RFLAGS))) {
		r = att_recv(c, a, msg->msg_iov, (int)msg->msg_iovlen, flags);
		if (r >= 0) {
			msg->msg_controllen = 0;
			msg->msg_flags = 0;
			msg->msg_namelen = 0;
		}
		return r;
	}
	r = REAL(recvmsg)(fd, msg, flags);
	if (unlikely(r >= 0 && msg->msg_controllen))
		received(msg, r);
	return c ? io_end(c, held, r, flags & MSG_PEEK, 1) : r;
}

/* readv: the iovecs filled in order; attached, from the ring likewise. */
SHIM_EXPORT ssize_t readv(int fd, const struct iovec *iov, int iovcnt)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (likely(!c))
		return REAL(readv)(fd, iov, iovcnt);
	if ((a = io_begin(c, fd, &held))) {
		if (iovcnt < 0 || iovcnt > 1024) {
			errno = EINVAL;
			return -1;
		}
		return att_recv(c, a, iov, iovcnt, 0);
	}
	return io_end(c, held, REAL(readv)(fd, iov, iovcnt), 0, 1);
}

/*
 * recvmmsg: several recvmsg in one call; on a TCP socket each message is
 * a piece of the stream. An attachable connection is demoted first.
 */
SHIM_EXPORT int recvmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags,
			 struct timespec *timeout)
{
	struct conn *c = sock_lookup(fd);
	ssize_t total = 0;
	int r, err, held = 0;

	if (c && ring_flags(c, io_begin(c, fd, &held), ~0, 0))
		return -1;	/* not reached: ring_flags demotes and answers NULL */
	r = REAL(recvmmsg)(fd, vec, vlen, flags, timeout);
	err = errno;
	for (int i = 0; i < r; i++) {
		if (unlikely(vec[i].msg_hdr.msg_controllen))
			received(&vec[i].msg_hdr, 0);
		total += vec[i].msg_len;
	}
	if (c)
		io_end(c, held, total, flags & MSG_PEEK, 1);
	errno = err;
	return r;
}

/* write: see the file comment. */
SHIM_EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (likely(!c))
		return REAL(write)(fd, buf, n);
	if ((a = io_begin(c, fd, &held)))
		return att_send1(c, a, buf, n, 0);
	return io_end(c, held, REAL(write)(fd, buf, n), 0, 0);
}

SHIM_EXPORT ssize_t __write(int fd, const void *buf, size_t n) __attribute__((alias("write")));

/*
 * send: MSG_NOSIGNAL and SIGPIPE as the kernel's: a write into the ring
 * after the connection was reset fails with EPIPE, and raises SIGPIPE
 * unless MSG_NOSIGNAL.
 */
SHIM_EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (likely(!c))
		return REAL(send)(fd, buf, n, flags);
	if ((a = ring_flags(c, io_begin(c, fd, &held), flags, RING_WFLAGS)))
		return att_send1(c, a, buf, n, flags);
	return io_end(c, held, REAL(send)(fd, buf, n, flags), 0, 0);
}

SHIM_EXPORT ssize_t __send(int fd, const void *buf, size_t n, int flags)
	__attribute__((alias("send")));

/* sendto: on a connected TCP socket, the address is ignored (or EISCONN). */
SHIM_EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags,
			   const struct sockaddr *addr, socklen_t alen)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (likely(!c))
		return REAL(sendto)(fd, buf, n, flags, addr, alen);
	if ((a = ring_flags(c, io_begin(c, fd, &held), flags, RING_WFLAGS)))
		return att_send1(c, a, buf, n, flags);
	return io_end(c, held, REAL(sendto)(fd, buf, n, flags, addr, alen), 0, 0);
}

/*
 * sendmsg: also on sockets the shim does not follow: tracked fds sent
 * with SCM_RIGHTS are demoted. An attachable connection given control
 * data is demoted too.
 */
SHIM_EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (unlikely(msg && msg->msg_controllen))
		io_sending_fds(msg);
	if (likely(!c))
		return REAL(sendmsg)(fd, msg, flags);
	a = io_begin(c, fd, &held);
	if (a && msg && msg->msg_controllen)
		a = ring_flags(c, a, ~0, 0);
	if ((a = ring_flags(c, a, flags, RING_WFLAGS)))
		return att_send(c, a, msg->msg_iov, (int)msg->msg_iovlen, flags);
	return io_end(c, held, REAL(sendmsg)(fd, msg, flags), 0, 0);
}

SHIM_EXPORT ssize_t writev(int fd, const struct iovec *iov, int iovcnt)
{
	struct conn *c = sock_lookup(fd);
	struct att *a;
	int held;

	if (likely(!c))
		return REAL(writev)(fd, iov, iovcnt);
	if ((a = io_begin(c, fd, &held))) {
		if (iovcnt < 0 || iovcnt > 1024) {
			errno = EINVAL;
			return -1;
		}
		return att_send(c, a, iov, iovcnt, 0);
	}
	return io_end(c, held, REAL(writev)(fd, iov, iovcnt), 0, 0);
}

/* sendmmsg: several sendmsg in one call; an attachable connection demotes first. */
SHIM_EXPORT int sendmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags)
{
	struct conn *c = sock_lookup(fd);
	ssize_t total = 0;
	int r, err, held = 0;

	for (unsigned int i = 0; vec && i < vlen; i++)
		if (unlikely(vec[i].msg_hdr.msg_controllen))
			io_sending_fds(&vec[i].msg_hdr);
	if (c && ring_flags(c, io_begin(c, fd, &held), ~0, 0))
		return -1;	/* not reached: ring_flags demotes and answers NULL */
	r = REAL(sendmmsg)(fd, vec, vlen, flags);
	err = errno;
	for (int i = 0; i < r; i++)
		total += vec[i].msg_len;
	if (c)
		io_end(c, held, total, 0, 0);
	errno = err;
	return r;
}
