/*
 * ring.c: the program's reads and writes on an attachable connection.
 *
 * Reads follow the incoming direction: the anchor up to the peer's switch
 * offset (never beyond), then the ring until the peer's FIN. Writes follow
 * the outgoing one: the anchor before the switch (holding wmu, so that a
 * switch never falls inside a write), the send buffer and the peer's
 * ring after it, the send buffer alone while held by a demote. A reader
 * never sits in a kernel read of the anchor: it reads without waiting and
 * waits in poll() for the anchor or its eventfd, so a switch (or ring
 * data) arriving meanwhile wakes it. Signals restart the wait, as
 * SA_RESTART would restart the kernel's read.
 */
#include "rdma.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;

	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/* Copy len bytes between buf and the iovecs from byte offset off. */
static void iov_copy(const struct iovec *iov, int n, size_t off, unsigned char *buf, size_t len,
		     int to_iov)
{
	for (int i = 0; i < n && len; i++) {
		size_t l = iov[i].iov_len;

		if (off >= l) {
			off -= l;
			continue;
		}
		size_t m = l - off < len ? l - off : len;

		if (to_iov)
			memcpy((char *)iov[i].iov_base + off, buf, m);
		else
			memcpy(buf, (char *)iov[i].iov_base + off, m);
		buf += m;
		len -= m;
		off = 0;
	}
}

/* Ring (size 1 << log2) bytes from stream offset o into the iovecs at off. */
static void ring_out(struct att *a, uint64_t o, const struct iovec *iov, int n, size_t off, size_t len)
{
	uint64_t mask = ((uint64_t)1 << a->log2) - 1;

	while (len) {
		size_t pos = (size_t)(o & mask), m = (size_t)(mask + 1 - pos);

		if (m > len)
			m = len;
		iov_copy(iov, n, off, att_ring(a) + pos, m, 1);
		o += m;
		off += m;
		len -= m;
	}
}

/* The iovecs from off into the send buffer at stream offset o. */
static void sbuf_in(struct att *a, uint64_t o, const struct iovec *iov, int n, size_t off, size_t len)
{
	while (len) {
		size_t pos = (size_t)(o & (a->win - 1)), m = (size_t)(a->win - pos);

		if (m > len)
			m = len;
		iov_copy(iov, n, off, att_sbuf(a) + pos, m, 0);
		o += m;
		off += m;
		len -= m;
	}
}


/*
 * How long a blocked reader polls the CQ before it sleeps
 * (RDMAPLUS_SOCKETS_SPIN_US, default 20 µs; 0: never): a reply that
 * comes within it costs no wake-up.
 */
static long spin_ns(void)
{
	static _Atomic long v = -1;
	long s = atomic_load_explicit(&v, memory_order_relaxed);

	if (s < 0) {
		const char *e = getenv("RDMAPLUS_SOCKETS_SPIN_US");

		s = e ? strtol(e, NULL, 10) * 1000 : 20000;
		if (s < 0 || s > 10000000)
			s = 20000;
		atomic_store_explicit(&v, s, memory_order_relaxed);
	}
	return s;
}

/* Poll the CQ until ring data, the end or a reset, for at most spin_ns. */
static void spin_read(struct att *a)
{
	struct timespec t0, t;
	long ns = spin_ns();

	if (!ns)
		return;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		pthread_mutex_lock(&a->mu);
		att_poll_cq(a);
		int done = a->in != IN_RING || a->prod > a->rx || a->rx == a->fin_in || a->reset;

		pthread_mutex_unlock(&a->mu);
		if (done)
			return;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > ns)
			return;
	}
}

/*
 * Empty the readers' (rd) or writers' eventfd, if att_signal marked it
 * since the last time: a round trip then costs no read of an empty
 * eventfd. A signal whose mark comes after this look is read next time;
 * a sleeper it wakes meanwhile just looks again.
 */
static void drain(struct att *a, int rd)
{
	uint64_t v;
	int err = errno;

	if (!atomic_exchange_explicit(rd ? &a->rd_sig : &a->wr_sig, 0, memory_order_acquire))
		return;
	if (REAL(read)(rd ? a->rd_ev : a->wr_ev, &v, sizeof(v)) < 0) {
		/* nothing pending */
	}
	errno = err;
}

/*
 * Sleep until this connection may have changed for a reader (rd) or a
 * writer: its eventfd, its completion channel (the CQ armed first), or
 * the anchor's events anchor_ev. Signals restart the wait. Returns the
 * anchor's events seen.
 */
static short att_sleep(struct att *a, int rd, short anchor_ev, int ms)
{
	struct pollfd p[3] = { { rd ? a->rd_ev : a->wr_ev, POLLIN, 0 } };
	int chanfd, n = 1, fired = 0, r = att_poll_enter(a, rd, !rd, &chanfd);
	short ev = 0;

	if (!(r & (ATT_POLLED | (rd ? POLLIN : POLLOUT)))) {
		if (anchor_ev)
			p[n++] = (struct pollfd){ a->anchor, anchor_ev, 0 };
		if (chanfd >= 0)
			p[n++] = (struct pollfd){ chanfd, POLLIN, 0 };
		while (REAL(poll)(p, (nfds_t)n, ms) < 0 && errno == EINTR)
			;
		fired = chanfd >= 0 && p[n - 1].revents;
		ev = anchor_ev ? p[1].revents : 0;
	}
	att_poll_leave(a, rd, !rd, fired);
	drain(a, rd);
	return ev;
}

/* The iovecs from off, at most lim bytes, as a short array for recvmsg. */
static int iov_sub(const struct iovec *iov, int n, size_t off, size_t lim, struct iovec *out, int max)
{
	int k = 0;

	for (int i = 0; i < n && lim && k < max; i++) {
		size_t l = iov[i].iov_len;

		if (off >= l) {
			off -= l;
			continue;
		}
		out[k].iov_base = (char *)iov[i].iov_base + off;
		out[k].iov_len = l - off < lim ? l - off : lim;
		lim -= out[k].iov_len;
		off = 0;
		k++;
	}
	return k;
}

ssize_t att_recv(struct conn *c, struct att *a, const struct iovec *iov, int iovcnt, int flags)
{
	int nb = (conn_flags(c) & CONN_NONBLOCK) || (flags & MSG_DONTWAIT);
	int peek = flags & MSG_PEEK;
	int waitall = (flags & MSG_WAITALL) && !peek;
	size_t want = iov_total(iov, iovcnt), got = 0;
	int err = 0, spun = 0, saved = errno;

	if (want == 0)
		return 0;
	pthread_mutex_lock(&a->rmu);
	for (;;) {
		drain(a, 1);
		pthread_mutex_lock(&a->mu);
		if (a->in == IN_TCP || (a->in == IN_SWITCHING && a->rx < a->sw_in)) {
			uint64_t lim = want - got;
			struct iovec sub[64];
			struct msghdr m = { .msg_iov = sub };
			ssize_t r;

			if (a->in == IN_SWITCHING && a->sw_in - a->rx < lim)
				lim = a->sw_in - a->rx;
			pthread_mutex_unlock(&a->mu);
			m.msg_iovlen = (size_t)iov_sub(iov, iovcnt, got, (size_t)lim, sub, 64);
			r = REAL(recvmsg)(a->anchor, &m, MSG_DONTWAIT | (flags & (MSG_PEEK | MSG_TRUNC)));
			if (r > 0) {
				pthread_mutex_lock(&a->mu);
				if (!peek) {
					a->rx += (uint64_t)r;
					if (a->in == IN_SWITCHING && a->rx == a->sw_in)
						a->in = IN_RING;
				}
				pthread_mutex_unlock(&a->mu);
				got += (size_t)r;
				if (!waitall || got == want)
					break;
				continue;
			}
			if (r == 0)
				break;
			if (errno != EAGAIN) {
				err = errno;
				break;
			}
			if (nb) {
				err = EAGAIN;
				break;
			}
			att_sleep(a, 1, POLLIN, -1);
			continue;
		}
		/* The ring. */
		uint64_t avail = a->prod - a->rx;

		if (!avail) {
			att_poll_cq(a);
			avail = a->prod - a->rx;
		}
		if (avail) {
			size_t m = want - got < avail ? want - got : (size_t)avail;

			ring_out(a, a->rx, iov, iovcnt, got, m);
			if (!peek) {
				stats_ring(a, 1, m);
				a->rx += m;
				att_credit_check(a);
			}
			pthread_mutex_unlock(&a->mu);
			got += m;
			if (peek || !waitall || got == want)
				break;
			continue;
		}
		if (a->reset) {
			err = a->reset;
			pthread_mutex_unlock(&a->mu);
			break;
		}
		if (a->rx == a->fin_in || a->anchor_eof) {
			pthread_mutex_unlock(&a->mu);
			break;
		}
		pthread_mutex_unlock(&a->mu);
		if (nb) {
			err = EAGAIN;
			break;
		}
		if (!spun) {
			spun = 1;
			spin_read(a);
			continue;
		}
		spun = 0;
		if (att_sleep(a, 1, POLLIN, -1)) {
			char b;
			ssize_t r = REAL(recv)(a->anchor, &b, 1, MSG_PEEK | MSG_DONTWAIT);

			int e = errno;

			pthread_mutex_lock(&a->mu);
			att_poll_cq(a);
			if (r < 0 && e == ECONNRESET && !a->reset)
				a->reset = ECONNRESET;	/* the peer reset: as TCP's read says */
			if (r == 0 || (r < 0 && e != EAGAIN))
				a->anchor_eof = 1;
			else if (r > 0 && a->in != IN_TCP && a->prod == a->rx)
				att_demote(a, SOCKPROTO_R_TCP_AFTER_SWITCH);
			pthread_mutex_unlock(&a->mu);
		}
	}
	if (got > 0 && !peek)
		stats_slot_rx(a);
	pthread_mutex_unlock(&a->rmu);
	if (a->ep_rd > 0) {
		pthread_mutex_lock(&a->mu);
		att_ep_sync(a);	/* epoll: still readable, or not */
		pthread_mutex_unlock(&a->mu);
	}
	if (got > 0) {
		if (!peek)
			conn_count(c, 1, got);
		errno = saved;
		return (ssize_t)got;
	}
	errno = err ? err : saved;
	return err ? -1 : 0;
}

ssize_t att_send(struct conn *c, struct att *a, const struct iovec *iov, int iovcnt, int flags)
{
	int nb = (conn_flags(c) & CONN_NONBLOCK) || (flags & MSG_DONTWAIT);
	size_t total = iov_total(iov, iovcnt), done = 0;
	int err = 0, ring_err = 0, saved = errno;
	short aev;

	pthread_mutex_lock(&a->wmu);
	pthread_mutex_lock(&a->mu);
	if (a->want_switch)
		att_switch(a);
	for (;;) {
		if (a->out == AOUT_TCP) {
			struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
			struct iovec sub[64];
			ssize_t r;

			pthread_mutex_unlock(&a->mu);
			if (done) {
				m.msg_iov = sub;
				m.msg_iovlen = (size_t)iov_sub(iov, iovcnt, done, total - done, sub, 64);
			}
			r = REAL(sendmsg)(a->anchor, &m, flags);
			pthread_mutex_lock(&a->mu);
			if (r > 0) {
				a->tx += (uint64_t)r;
				done += (size_t)r;
			} else if (r < 0 && !done) {
				err = errno;
			}
			if (a->want_switch)
				att_switch(a);
			break;
		}
		if (!a->reset && a->probed) {
			att_poll_cq(a);
			/*
			 * The probe failed the QP, or no credit came within 10 s
			 * of it: the peer's process is gone, and nobody answers
			 * a demote.
			 */
			if (a->qp_dead || shim_now_ms() - a->probed > 10000) {
				TRACE("blocked writer: the peer is gone (QP %s)", a->qp_dead ? "failed" : "silent");
				a->reset = ECONNRESET;
			}
		}
		if (a->reset || a->shut_wr) {
			err = a->reset ? a->reset : EPIPE;
			/* as TCP: one write hears of the reset, the next ones get EPIPE */
			if (err == ECONNRESET && a->reset_told++)
				err = EPIPE;
			ring_err = 1;
			break;
		}
		uint64_t space = att_send_space(a);

		if (!space) {
			att_poll_cq(a);
			space = att_send_space(a);
			if (a->out == AOUT_TCP)
				continue;
		}
		if (space) {
			size_t m = total - done < space ? total - done : (size_t)space;

			a->probed = 0;	/* credits came: the peer lives */

			sbuf_in(a, a->tx, iov, iovcnt, done, m);
			if (a->out == AOUT_RING) {
				if (att_post_data(a, a->tx, m) < 0)
					att_demote(a, SOCKPROTO_R_QP_ERROR);
				else
					stats_ring(a, 0, m);
			}
			a->tx += m;
			done += m;
			if (a->out == AOUT_FLUSH)
				att_flush(a);
			if (done == total)
				break;
			continue;
		}
		if (a->out == AOUT_RING)
			att_blocked(a);
		if (nb) {
			if (!done)
				err = EAGAIN;
			break;
		}
		/*
		 * The peer's stream comes by the ring, so its end would too
		 * (FIN): an end of the anchor without one may mean the peer's
		 * process is gone, and then no credit ever comes. The blocked
		 * offset is written once more: a dead peer fails the QP
		 * within its retries (the QP error demotes, and a demote
		 * nobody answers resets), a live one (demoting meanwhile)
		 * just reads it again.
		 */
		aev = a->in != IN_TCP && a->fin_in == SOCKPROTO_NO_FIN && !a->probed ? POLLRDHUP : 0;
		pthread_mutex_unlock(&a->mu);
		aev = att_sleep(a, 0, aev, a->probed ? 1000 : -1);
		pthread_mutex_lock(&a->mu);
		if ((aev & (POLLRDHUP | POLLHUP | POLLERR)) && !a->probed && a->out == AOUT_RING) {
			TRACE("blocked writer: the anchor ended without a FIN, probing the QP");
			a->probed = shim_now_ms();
			a->blocked_sent = 0;
			att_blocked(a);
		}
	}
	stats_slot_sync(a);
	pthread_mutex_unlock(&a->mu);
	pthread_mutex_unlock(&a->wmu);
	if (a->ep_wr > 0) {
		pthread_mutex_lock(&a->mu);
		att_ep_sync(a);	/* epoll: still writable, or not */
		pthread_mutex_unlock(&a->mu);
	}
	if (done) {
		conn_count(c, 0, done);
		errno = saved;
		return (ssize_t)done;
	}
	if (ring_err && err == EPIPE && !(flags & MSG_NOSIGNAL))
		raise(SIGPIPE);
	errno = err ? err : saved;
	return err ? -1 : 0;
}

/* Ring bytes, the end, or a reset ready (no system call). */
int att_readable(struct att *a)
{
	int r;

	pthread_mutex_lock(&a->mu);
	if (a->in == IN_RING && a->prod == a->rx)
		att_poll_cq(a);
	r = att_rd_ready(a);
	pthread_mutex_unlock(&a->mu);
	return r;
}

/* Room in the peer's ring (or the send buffer), or a reset. */
int att_writable(struct att *a)
{
	int r;

	pthread_mutex_lock(&a->mu);
	if (a->out != AOUT_TCP && !att_send_space(a))
		att_poll_cq(a);
	r = att_wr_ready(a);
	pthread_mutex_unlock(&a->mu);
	return r;
}

/*
 * FIONREAD on an attachable connection: what a read would get now. The
 * kernel's count (anchor) is capped at the switch offset while switching;
 * on the ring, the ring's bytes.
 */
int att_readable_bytes(struct att *a, int anchor)
{
	uint64_t n;

	pthread_mutex_lock(&a->mu);
	if (a->in == IN_TCP) {
		n = (uint64_t)anchor;
	} else if (a->in == IN_SWITCHING && a->rx < a->sw_in) {
		n = a->sw_in - a->rx < (uint64_t)anchor ? a->sw_in - a->rx : (uint64_t)anchor;
	} else {
		att_poll_cq(a);
		n = a->prod - a->rx;
	}
	pthread_mutex_unlock(&a->mu);
	return n > INT32_MAX ? INT32_MAX : (int)n;
}
