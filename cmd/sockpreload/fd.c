/*
 * fd.c: the calls that make, remove or change file descriptors: close,
 * close_range, closefrom, dup, dup2, dup3, fcntl, fcntl64, ioctl.
 *
 * An fd the shim does not follow costs one table lookup (and, for a
 * newly made fd, a second one to see that its slot holds nothing stale).
 * A removed fd's slot is cleared before libc closes it, so another thread
 * that gets the number back from socket() or accept() records it after.
 */
#include "rdma.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <stdarg.h>
#include <sys/ioctl.h>

/*
 * close: the fd's slot is cleared, and its connection loses a reference;
 * the last one releases it. Attached: closing the last fd of a connection
 * first runs the attachment's close (FIN on the ring, or ABORT with
 * unread data or a zero linger) through conn_close_prepare.
 */
SHIM_EXPORT int close(int fd)
{
	struct conn *c = slot_conn(fdt_load(fd));

	if (likely(!c)) {
		epoll_set_closing(fd);
		return REAL(close)(fd);
	}
	conn_close_prepare(c);
	conn_untrack(fd);
	return REAL(close)(fd);
}

SHIM_EXPORT int __close(int fd) __attribute__((alias("close")));

/*
 * close_range: with CLOSE_RANGE_CLOEXEC the tracked fds of the range
 * become close-on-exec; otherwise they are untracked before libc closes
 * them. Calls libc would refuse (unknown flags, first above last) change
 * nothing. Attached: each connection losing its last fd is closed as by
 * close().
 */
SHIM_EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	int r;

	if ((flags & ~(CLOSE_RANGE_UNSHARE | CLOSE_RANGE_CLOEXEC)) || first > last)
		return REAL(close_range)(first, last, flags);
	if (flags & CLOSE_RANGE_CLOEXEC) {
		r = REAL(close_range)(first, last, flags);
		if (r == 0)
			conn_set_cloexec_range(first, last);
		return r;
	}
	conn_untrack_range(first, last);
	return REAL(close_range)(first, last, flags);
}

/* closefrom: as close_range(lowfd, ~0U, 0). */
SHIM_EXPORT void closefrom(int lowfd)
{
	if (lowfd >= 0)
		conn_untrack_range((unsigned)lowfd, ~0u);
	REAL(closefrom)(lowfd);
}

/*
 * The result of a dup: newfd aliases oldfd's connection c, or, when oldfd
 * is not followed, newfd's slot is cleared if it held a stale connection.
 */
static int duped(int oldfd, struct conn *c, int newfd, int cloexec)
{
	int err = errno;

	if (newfd < 0)
		return newfd;
	if (c)
		conn_alias(oldfd, c, newfd, cloexec);
	else if (fdt_load(newfd) > SLOT_NONE)
		conn_forget(newfd);
	errno = err;
	return newfd;
}

/*
 * dup, dup2, dup3: the new fd shares the connection (and its state and
 * counters) with the old one; dup3's O_CLOEXEC is recorded. dup2 and dup3
 * over a tracked fd drop its reference. Attached: the same; the
 * connection is one object whichever fd the program uses, and an fd
 * replaced by dup2 is closed as by close().
 */
SHIM_EXPORT int dup(int fd)
{
	struct conn *c = sock_lookup(fd);

	return duped(fd, c, REAL(dup)(fd), 0);
}

static void dup_over(int oldfd, int newfd)
{
	struct conn *n;

	if (oldfd != newfd && (n = slot_conn(fdt_load(newfd))))
		conn_close_prepare(n);
}

SHIM_EXPORT int dup2(int oldfd, int newfd)
{
	struct conn *c = sock_lookup(oldfd);

	dup_over(oldfd, newfd);
	if (oldfd == newfd)
		return REAL(dup2)(oldfd, newfd);
	return duped(oldfd, c, REAL(dup2)(oldfd, newfd), 0);
}

SHIM_EXPORT int __dup2(int oldfd, int newfd) __THROW __attribute__((alias("dup2")));

SHIM_EXPORT int dup3(int oldfd, int newfd, int flags)
{
	struct conn *c = sock_lookup(oldfd);

	if (oldfd == newfd)
		return REAL(dup3)(oldfd, newfd, flags);
	dup_over(oldfd, newfd);
	return duped(oldfd, c, REAL(dup3)(oldfd, newfd, flags), flags & O_CLOEXEC);
}

/*
 * fcntl, fcntl64: F_DUPFD and F_DUPFD_CLOEXEC are dups; F_SETFL records
 * O_NONBLOCK (a property of the open file description, shared by every
 * alias), F_SETFD records FD_CLOEXEC (the fd's own). Every other command
 * is the anchor's. Attached: the same; the nonblocking flag decides
 * whether a read of an empty ring or a write into a full one blocks or
 * fails with EAGAIN.
 */
static int do_fcntl(enum shim_sym sym, int fd, int cmd, void *arg)
{
	int (*real)(int, int, ...) = shim_real(sym);
	struct conn *c = sock_lookup(fd);
	int r, err;

	if (likely(!c)) {
		r = real(fd, cmd, arg);
		if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && r >= 0 &&
		    fdt_load(r) > SLOT_NONE) {
			err = errno;
			conn_forget(r);
			errno = err;
		}
		return r;
	}
	r = real(fd, cmd, arg);
	if (r < 0)
		return r;
	err = errno;
	switch (cmd) {
	case F_DUPFD:
	case F_DUPFD_CLOEXEC:
		duped(fd, c, r, cmd == F_DUPFD_CLOEXEC);
		break;
	case F_SETFL:
		conn_set_flag(c, CONN_NONBLOCK, ((int)(intptr_t)arg & O_NONBLOCK) != 0);
		break;
	case F_SETFD:
		conn_set_cloexec(fd, ((int)(intptr_t)arg & FD_CLOEXEC) != 0);
		break;
	}
	errno = err;
	return r;
}

SHIM_EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(SYM_fcntl, fd, cmd, arg);
}

SHIM_EXPORT int __fcntl(int fd, int cmd, ...) __attribute__((alias("fcntl")));

SHIM_EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(SYM_fcntl64, fd, cmd, arg);
}

/*
 * ioctl: FIONBIO records the nonblocking flag, FIOCLEX and FIONCLEX the
 * close-on-exec bit; FIONREAD (SIOCINQ) and SIOCOUTQ are the anchor's.
 * Attached: FIONREAD counts the bytes readable, from the anchor up to the
 * switch offset and then from the ring; SIOCOUTQ the bytes sent but not
 * yet credited.
 */
SHIM_EXPORT int ioctl(int fd, unsigned long req, ...)
{
	struct conn *c = sock_lookup(fd);
	va_list ap;
	void *arg;
	int r, err;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	r = REAL(ioctl)(fd, req, arg);
	if (likely(!c) || r < 0)
		return r;
	err = errno;
	switch (req) {
	case FIONBIO:
		if (arg)
			conn_set_flag(c, CONN_NONBLOCK, *(int *)arg != 0);
		break;
	case FIOCLEX:
		conn_set_cloexec(fd, 1);
		break;
	case FIONCLEX:
		conn_set_cloexec(fd, 0);
		break;
	case FIONREAD:
		if (arg && conn_att(c))
			*(int *)arg = att_readable_bytes(conn_att(c), *(int *)arg);
		break;
	}
	errno = err;
	return r;
}
