/*
 * poll.c: readiness: select, pselect, poll, ppoll (and their fortified
 * __poll_chk, __ppoll_chk), epoll_create, epoll_create1, epoll_ctl,
 * epoll_wait, epoll_pwait, epoll_pwait2.
 *
 * In pass-through mode the anchor is where the bytes are, so the
 * kernel's answer is the right one and every call is libc's. Once
 * attaching exists, each wait starts with one load of
 * shim_stats.attached: while no connection of the process is attached,
 * it stays libc's.
 *
 * Attached (docs/sockets.md, "Readiness"): each attached socket gets two
 * eventfd proxies (readable; writable, kept unsignalled by a count of
 * max-1 until it is) in a shadow epoll set nested in each of the
 * program's epoll sets next to the anchor, so the kernel keeps every
 * epoll semantic (level and edge triggered, EPOLLONESHOT, EPOLLEXCLUSIVE,
 * nesting, sets shared across fork); epoll_wait maps the proxies' events
 * back to the program's fd. poll and select check the rings inline, spin
 * briefly, then call the kernel's with the proxies in place of the
 * attached fds.
 */
#include "shim.h"

SHIM_EXPORT int select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv)
{
	return REAL(select)(n, r, w, e, tv);
}

SHIM_EXPORT int __select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv)
	__attribute__((alias("select")));

SHIM_EXPORT int pselect(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *ts,
			const sigset_t *ss)
{
	return REAL(pselect)(n, r, w, e, ts, ss);
}

SHIM_EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	return REAL(poll)(fds, n, timeout);
}

SHIM_EXPORT int __poll(struct pollfd *fds, nfds_t n, int timeout) __attribute__((alias("poll")));

/* __poll_chk: poll with _FORTIFY_SOURCE's check of the array's size. */
SHIM_EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	return REAL(__poll_chk)(fds, n, timeout, fdslen);
}

SHIM_EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts,
		      const sigset_t *ss)
{
	return REAL(ppoll)(fds, n, ts, ss);
}

SHIM_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts,
			    const sigset_t *ss, size_t fdslen)
{
	return REAL(__ppoll_chk)(fds, n, ts, ss, fdslen);
}

/*
 * epoll_create, epoll_create1: the kernel's set. A stale slot of the new
 * fd is cleared. Attached: the set gets its shadow set lazily, when the
 * first attached socket joins it.
 */
static int created(int fd)
{
	if (fd >= 0 && fdt_load(fd) > SLOT_NONE) {
		int err = errno;

		conn_forget(fd);
		errno = err;
	}
	return fd;
}

SHIM_EXPORT int epoll_create(int size)
{
	return created(REAL(epoll_create)(size));
}

SHIM_EXPORT int epoll_create1(int flags)
{
	return created(REAL(epoll_create1)(flags));
}

/*
 * epoll_ctl: the kernel's. Attached: adding or changing a tracked socket
 * also puts its proxies (with the same events and flags) into the set's
 * shadow set; deleting removes them.
 */
SHIM_EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	return REAL(epoll_ctl)(epfd, op, fd, ev);
}

/*
 * epoll_wait, epoll_pwait, epoll_pwait2: the kernel's. Attached: events
 * of the shadow set are mapped back to the program's fds and data.
 */
SHIM_EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	return REAL(epoll_wait)(epfd, ev, max, timeout);
}

SHIM_EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout,
			    const sigset_t *ss)
{
	return REAL(epoll_pwait)(epfd, ev, max, timeout, ss);
}

SHIM_EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max,
			     const struct timespec *ts, const sigset_t *ss)
{
	return REAL(epoll_pwait2)(epfd, ev, max, ts, ss);
}
