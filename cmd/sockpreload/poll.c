/*
 * poll.c: readiness: select, pselect, poll, ppoll (and their fortified
 * __poll_chk, __ppoll_chk); epoll is in epoll.c.
 *
 * A wait over fds none of which is attachable is libc's (one load of
 * shim_stats.attachable, then one table lookup per fd). Otherwise
 * (docs/sockets.md, "Readiness"): each attachable connection's ring is
 * checked inline, the CQ armed, and the kernel waits on the anchor (its
 * POLLOUT dropped while the outgoing direction is on the ring), the
 * attachment's completion channel and its eventfds; what they report is
 * checked again against the ring before it is returned.
 */
#include "rdma.h"

#include <stdlib.h>

/*
 * glibc declares poll's array write-only (__attr_access), so gcc takes
 * the wrappers' reading of the program's fds for a use of uninitialized
 * memory; poll reads them, as the kernel does.
 */
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <string.h>
#include <time.h>

/* The attachable connection of a polled fd (no probing), or NULL. */
static struct att *poll_att(int fd)
{
	struct conn *c;

	if (fd < 0)
		return NULL;
	c = slot_conn(fdt_load(fd));
	return c ? conn_att(c) : NULL;
}

static long ms_left(const struct timespec *end)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (end->tv_sec - t.tv_sec) * 1000 + (end->tv_nsec - t.tv_nsec) / 1000000;
}

/*
 * poll over fds some of which are attachable: each such entry's anchor
 * keeps its kernel events except POLLOUT while the outgoing direction is
 * on the ring; its eventfds join the set; the rings are checked inline
 * before and after. ts (ppoll) or timeout (ms, poll) bound the wait.
 */
static int poll_att_set(struct pollfd *fds, nfds_t n, int timeout, const struct timespec *ts,
			const sigset_t *ss, int use_ppoll)
{
	struct pollfd stack[96], *arr = stack;
	struct att *stack_att[32], **att;
	short stack_pre[32], *pre;
	struct timespec end;
	nfds_t m, i;
	int r, forever;

	att = n <= 32 ? stack_att : malloc(n * sizeof(*att));
	pre = n <= 32 ? stack_pre : malloc(n * sizeof(*pre));
	if (4 * n > 96)
		arr = malloc(4 * n * sizeof(*arr));
	if (!att || !pre || !arr) {
		r = use_ppoll ? REAL(ppoll)(fds, n, ts, ss) : REAL(poll)(fds, n, timeout);
		goto out;
	}
	if (use_ppoll)
		timeout = ts ? (int)(ts->tv_sec * 1000 + ts->tv_nsec / 1000000) : -1;
	forever = timeout < 0;
	clock_gettime(CLOCK_MONOTONIC, &end);
	if (!forever) {
		end.tv_sec += timeout / 1000;
		end.tv_nsec += (long)(timeout % 1000) * 1000000;
		if (end.tv_nsec >= 1000000000) {
			end.tv_sec++;
			end.tv_nsec -= 1000000000;
		}
	}
	for (;;) {
		int ready = 0, wait;

		m = n;
		for (i = 0; i < n; i++) {
			struct att *a = poll_att(fds[i].fd);
			int rd = !!(fds[i].events & POLLIN), wr = !!(fds[i].events & POLLOUT), chanfd, e;

			arr[i] = fds[i];
			arr[i].revents = 0;
			att[i] = a;
			pre[i] = 0;
			if (!a)
				continue;
			e = att_poll_enter(a, rd, wr, &chanfd);
			pre[i] = (short)(e & (POLLIN | POLLOUT));
			if (e)
				ready++;
			if (a->out != AOUT_TCP)
				arr[i].events &= ~POLLOUT;
			arr[m++] = (struct pollfd){ rd ? a->rd_ev : -1, POLLIN, 0 };
			arr[m++] = (struct pollfd){ wr ? a->wr_ev : -1, POLLIN, 0 };
			arr[m++] = (struct pollfd){ chanfd, POLLIN, 0 };
		}
		wait = ready ? 0 : forever ? -1 : (int)(ms_left(&end) > 0 ? ms_left(&end) : 0);
		if (use_ppoll) {
			struct timespec t = { wait / 1000, (long)(wait % 1000) * 1000000 };

			r = REAL(ppoll)(arr, m, wait < 0 ? NULL : &t, ss);
		} else {
			r = REAL(poll)(arr, m, wait);
		}
		m = n;
		for (i = 0; i < n; i++) {
			struct att *a = att[i];
			short rev = arr[i].revents;

			if (a) {
				struct pollfd *x = &arr[m];
				int rd = !!(fds[i].events & POLLIN), wr = !!(fds[i].events & POLLOUT);
				uint64_t v;

				m += 3;
				att_poll_leave(a, rd, wr, x[2].revents != 0);
				if (x[0].revents && REAL(read)(a->rd_ev, &v, sizeof(v)) < 0) {
					/* drained */
				}
				if (x[1].revents && REAL(read)(a->wr_ev, &v, sizeof(v)) < 0) {
					/* drained */
				}
				if (a->out != AOUT_TCP)
					rev &= ~POLLOUT;
				rev |= pre[i];
				if (rd && (x[0].revents || x[2].revents) && att_readable(a))
					rev |= POLLIN;
				if (wr && (x[1].revents || x[2].revents) && att_writable(a))
					rev |= POLLOUT;
			}
			if (r >= 0)
				fds[i].revents = rev & (fds[i].events | POLLERR | POLLHUP | POLLNVAL);
		}
		if (r < 0)
			goto out;
		r = 0;
		for (i = 0; i < n; i++)
			if (fds[i].revents)
				r++;
		if (r || (!forever && ms_left(&end) <= 0))
			break;
	}
out:
	if (att != stack_att)
		free(att);
	if (pre != stack_pre)
		free(pre);
	if (arr != stack)
		free(arr);
	return r;
}

static int any_att(const struct pollfd *fds, nfds_t n)
{
	if (!atomic_load_explicit(&shim_stats.attachable, memory_order_relaxed))
		return 0;
	for (nfds_t i = 0; i < n; i++)
		if (poll_att(fds[i].fd))
			return 1;
	return 0;
}

/* select over attachable fds: through poll_att_set. */
static int select_att(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *ts,
		      const sigset_t *ss, int use_ppoll, int *handled)
{
	struct pollfd stack[64], *p = stack;
	int k = 0, has = 0, res;

	*handled = 0;
	if (!atomic_load_explicit(&shim_stats.attachable, memory_order_relaxed) || n <= 0 ||
	    n > FD_SETSIZE)
		return 0;
	for (int fd = 0; fd < n; fd++) {
		if (((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w))) && poll_att(fd))
			has = 1;
		if ((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (e && FD_ISSET(fd, e)))
			k++;
	}
	if (!has)
		return 0;
	if (k > 64 && !(p = malloc((size_t)k * sizeof(*p))))
		return 0;
	k = 0;
	for (int fd = 0; fd < n; fd++) {
		short ev = 0;

		if (r && FD_ISSET(fd, r))
			ev |= POLLIN;
		if (w && FD_ISSET(fd, w))
			ev |= POLLOUT;
		if (e && FD_ISSET(fd, e))
			ev |= POLLPRI;
		if (ev)
			p[k++] = (struct pollfd){ fd, ev, 0 };
	}
	res = poll_att_set(p, (nfds_t)k, ts ? (int)(ts->tv_sec * 1000 + ts->tv_nsec / 1000000) : -1,
			   ts, ss, use_ppoll);
	*handled = 1;
	if (res >= 0) {
		if (r)
			FD_ZERO(r);
		if (w)
			FD_ZERO(w);
		if (e)
			FD_ZERO(e);
		res = 0;
		for (int i = 0; i < k; i++) {
			if (p[i].revents & POLLNVAL) {
				res = -1;
				errno = EBADF;
				break;
			}
			if (r && (p[i].revents & (POLLIN | POLLHUP | POLLERR)) && (p[i].events & POLLIN)) {
				FD_SET(p[i].fd, r);
				res++;
			}
			if (w && (p[i].revents & (POLLOUT | POLLERR)) && (p[i].events & POLLOUT)) {
				FD_SET(p[i].fd, w);
				res++;
			}
			if (e && (p[i].revents & POLLPRI)) {
				FD_SET(p[i].fd, e);
				res++;
			}
		}
	}
	if (p != stack)
		free(p);
	return res;
}

SHIM_EXPORT int select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv)
{
	struct timespec ts, *tsp = NULL;
	int handled, res;

	if (tv) {
		ts.tv_sec = tv->tv_sec;
		ts.tv_nsec = tv->tv_usec * 1000;
		tsp = &ts;
	}
	res = select_att(n, r, w, e, tsp, NULL, 0, &handled);
	if (handled) {
		if (tv && res >= 0)
			tv->tv_sec = tv->tv_usec = 0;
		return res;
	}
	return REAL(select)(n, r, w, e, tv);
}

SHIM_EXPORT int __select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv)
	__attribute__((alias("select")));

SHIM_EXPORT int pselect(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *ts,
			const sigset_t *ss)
{
	int handled, res = select_att(n, r, w, e, ts, ss, 1, &handled);

	if (handled)
		return res;
	return REAL(pselect)(n, r, w, e, ts, ss);
}

SHIM_EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	if (unlikely(any_att(fds, n)))
		return poll_att_set(fds, n, timeout, NULL, NULL, 0);
	return REAL(poll)(fds, n, timeout);
}

SHIM_EXPORT int __poll(struct pollfd *fds, nfds_t n, int timeout) __attribute__((alias("poll")));

/* __poll_chk: poll with _FORTIFY_SOURCE's check of the array's size. */
SHIM_EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	if (unlikely(any_att(fds, n)) && n <= fdslen / sizeof(*fds))
		return poll_att_set(fds, n, timeout, NULL, NULL, 0);
	return REAL(__poll_chk)(fds, n, timeout, fdslen);
}

SHIM_EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts,
		      const sigset_t *ss)
{
	if (unlikely(any_att(fds, n)))
		return poll_att_set(fds, n, 0, ts, ss, 1);
	return REAL(ppoll)(fds, n, ts, ss);
}

SHIM_EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts,
			    const sigset_t *ss, size_t fdslen)
{
	if (unlikely(any_att(fds, n)) && n <= fdslen / sizeof(*fds))
		return poll_att_set(fds, n, 0, ts, ss, 1);
	return REAL(__ppoll_chk)(fds, n, ts, ss, fdslen);
}
