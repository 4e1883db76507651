/*
 * progress.c: the broker client (rvmad's Unix socket) and the progress
 * thread.
 *
 * Nothing here runs at load. The first connection established while
 * rvmad's broker socket exists opens the process's connection to it
 * (SOCK_SEQPACKET: one record, or ROUTE and one record, per message) and
 * starts the progress thread, with every signal blocked. The thread waits
 * in epoll for rvmad's messages, for completion events of the
 * attachments' CQs, for a kick (new work), and for the private anchors of
 * closed or demoting connections it still drives; it never blocks
 * anywhere else.
 *
 * Environment: RDMAPLUS_SOCKETS=0 keeps every connection on TCP;
 * RDMAPLUS_SOCKETS_BROKER names rvmad's socket (default
 * /run/rvmad/sockets.sock).
 *
 * After fork the child has no thread and no broker connection of its own:
 * progress_fork_child() forgets the parent's (the inherited attachments
 * are the parent's), and the child's first connection starts its own.
 */
#include "rdma.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/un.h>
#include <time.h>

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct att *reg_head;
static int broker_fd = -1;
static int epfd = -1, kickfd = -1;
static int started;
static int stats_sent;		/* the statistics segment went to rvmad */
static _Atomic int retries_pending;	/* clients waiting to ask again */

static time_t broker_retry;

#define TAG_BROKER	((uint64_t)1)
#define TAG_KICK	((uint64_t)2)
/* Else an attachment's address, + 1 for its channel, + 2 for its anchor. */

static int sockets_disabled(void)
{
	const char *e = getenv("RDMAPLUS_SOCKETS");

	return e && (!strcmp(e, "0") || !strcmp(e, "off"));
}

static void *progress_main(void *arg);

/* Under reg_mu: the broker connection and the thread, once. */
static int progress_start(void)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	const char *path = getenv("RDMAPLUS_SOCKETS_BROKER");
	struct epoll_event ev = { .events = EPOLLIN };
	sigset_t all, old;
	pthread_t th;
	int fd, rc;

	if (started)
		return broker_fd >= 0 ? 0 : -1;
	if (sockets_disabled() || time(NULL) < broker_retry)
		return -1;
	if (!path || !*path)
		path = "/run/rvmad/sockets.sock";
	if (strlen(path) >= sizeof(sun.sun_path))
		return -1;
	strcpy(sun.sun_path, path);
	fd = REAL(socket)(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (REAL(connect)(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		REAL(close)(fd);
		broker_retry = time(NULL) + 5;
		return -1;
	}
	epfd = REAL(epoll_create1)(EPOLL_CLOEXEC);
	kickfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (epfd < 0 || kickfd < 0)
		goto fail;
	ev.data.u64 = TAG_BROKER;
	if (REAL(epoll_ctl)(epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		goto fail;
	ev.data.u64 = TAG_KICK;
	if (REAL(epoll_ctl)(epfd, EPOLL_CTL_ADD, kickfd, &ev) < 0)
		goto fail;
	broker_fd = fd;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&th, NULL, progress_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc) {
		broker_fd = -1;
		goto fail;
	}
	pthread_detach(th);
	started = 1;
	return 0;
fail:
	REAL(close)(fd);
	if (epfd >= 0)
		REAL(close)(epfd);
	if (kickfd >= 0)
		REAL(close)(kickfd);
	epfd = kickfd = -1;
	broker_retry = time(NULL) + 5;
	return -1;
}

/*
 * Attachments whose connection the program closed (pushed under the fd
 * table's lock, where taking an attachment's lock could deadlock against
 * a thread that holds it and reaches the table through libibverbs'
 * writes): closed by the progress thread.
 */
static _Atomic(struct att *) closed_head;

void progress_closed(struct att *a)
{
	struct att *h = atomic_load(&closed_head);

	do
		a->close_next = h;
	while (!atomic_compare_exchange_weak(&closed_head, &h, a));
	progress_kick();
}

static void closed_run(void)
{
	struct att *a = atomic_exchange(&closed_head, NULL);

	while (a) {
		struct att *next = a->close_next;

		att_closed(a);
		a = next;
	}
}

void progress_kick(void)
{
	uint64_t one = 1;

	if (kickfd >= 0 && REAL(write)(kickfd, &one, sizeof(one)) < 0) {
		/* the counter is full: the thread has a kick already */
	}
}

/*
 * What the progress thread watches of an attachment (under a->mu): its
 * completion channel while closed and lingering; its anchor while closed
 * and not at its end (EPOLLIN), and while kept bytes wait for room on it
 * (EPOLLOUT). Nothing once released.
 */
void progress_watch(struct att *a)
{
	uint32_t want = 0, ev = 0;
	int fd;

	if (epfd < 0)
		return;
	if ((a->closing == 1 || (a->ep_nested > 0 && !a->closing)) && a->chan && a->anchor >= 0 &&
	    !a->releasing)
		want |= 1;
	if (a->anchor >= 0) {
		if (a->closing == 1 && !a->anchor_eof)
			ev |= EPOLLIN;
		if (a->out == AOUT_FLUSH)
			ev |= EPOLLOUT;
		if (ev)
			want |= 2;
	}
	if ((want ^ a->watched) & 1) {
		struct epoll_event e = { .events = EPOLLIN, .data.u64 = (uintptr_t)a + 1 };

		fd = a->watched & 1 ? a->watched_chan_fd : a->chan->fd;
		if (REAL(epoll_ctl)(epfd, want & 1 ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, fd, &e) == 0 ||
		    !(want & 1))
			a->watched ^= 1;
		if (want & 1)
			a->watched_chan_fd = fd;
	}
	if ((want & 2) != (a->watched & 2) || ((want & 2) && ev != a->anchor_events)) {
		struct epoll_event e = { .events = ev, .data.u64 = (uintptr_t)a + 2 };
		int op = !(want & 2) ? EPOLL_CTL_DEL : (a->watched & 2) ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;

		if (REAL(epoll_ctl)(epfd, op, a->anchor, &e) == 0 || op == EPOLL_CTL_DEL) {
			a->watched = (a->watched & ~2u) | (want & 2);
			a->anchor_events = ev;
		}
	}
}

/*
 * One message to rvmad. Never blocks the caller for long: a full socket
 * (rvmad behind) fails at once, unless wait_ms allows waiting (a DEMOTE,
 * which must get through).
 */
static int send_msg(const void *buf, size_t len, int passfd, int wait_ms)
{
	struct iovec iov = { (void *)buf, len };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t r;

	if (passfd >= 0) {
		struct cmsghdr *cm;

		memset(&u, 0, sizeof(u));
		m.msg_control = u.buf;
		m.msg_controllen = sizeof(u.buf);
		cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &passfd, sizeof(int));
	}
	for (;;) {
		r = REAL(sendmsg)(broker_fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (r >= 0)
			break;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN && wait_ms > 0) {
			struct pollfd p = { broker_fd, POLLOUT, 0 };

			if (REAL(poll)(&p, 1, wait_ms) <= 0)
				break;
			wait_ms = 0;	/* once */
			continue;
		}
		break;
	}
	return r == (ssize_t)len ? 0 : -1;
}

static int send_passing(const void *buf, size_t len, int fd)
{
	return send_msg(buf, len, fd, 0);
}

/*
 * REGISTER the connection (its socket fd passed along) and add it to the
 * registry; starts the broker connection and the thread on first use,
 * and hands rvmad the statistics segment before the first REGISTER. -1:
 * no broker (the connection stays on TCP).
 */
int broker_register(struct att *a, int fd)
{
	struct sockproto_register r;
	int err = errno, rc = -1;

	pthread_mutex_lock(&reg_mu);
	if (progress_start() == 0) {
		if (!stats_sent && stats_segment_send(send_passing) == 0)
			stats_sent = 1;
		sockproto_init(&r, SOCKPROTO_REGISTER, 1);
		r.tuple = a->tuple;
		sockproto_put32(&r.fd, (uint32_t)fd);
		stats_slot_open(a, fd);	/* before anyone else sees the attachment */
		if (send_msg(&r, sizeof(r), fd, 0) == 0) {
			atomic_fetch_add(&a->refs, 1);
			a->next = reg_head;
			reg_head = a;
			rc = 0;
		} else {
			stats_slot_close(a);
		}
	} else {
		stats_fallback(NULL, SOCKPROTO_R_NO_DAEMON);
	}
	pthread_mutex_unlock(&reg_mu);
	errno = err;
	return rc;
}

/* ROUTE (the connection) and rec in one message. */
int broker_send_routed(struct att *a, const void *rec, size_t len)
{
	unsigned char buf[SOCKPROTO_ROUTE_SIZE + SOCKPROTO_RECORD_MAX];
	struct sockproto_route rt;
	int err = errno, rc;

	if (broker_fd < 0 || len > SOCKPROTO_RECORD_MAX)
		return -1;
	sockproto_init(&rt, SOCKPROTO_ROUTE, sockproto_get32(&((const struct sockproto_hdr *)rec)->epoch));
	rt.tuple = a->tuple;
	memcpy(buf, &rt, sizeof(rt));
	memcpy(buf + sizeof(rt), rec, len);
	rc = send_msg(buf, sizeof(rt) + len, -1,
		      ((const struct sockproto_hdr *)rec)->type == SOCKPROTO_DEMOTE ? 2000 : 0);
	errno = err;
	return rc;
}

/* UNREGISTER: the connection is closed (best effort: rvmad also notices). */
void broker_unregister(struct att *a)
{
	struct sockproto_route u;
	int err = errno;

	if (broker_fd < 0 || a->pid != getpid())
		return;
	sockproto_init(&u, SOCKPROTO_UNREGISTER, a->epoch ? a->epoch : 1);
	u.tuple = a->tuple;
	send_msg(&u, sizeof(u), -1, 0);
	errno = err;
}

/* The registry's attachment of tuple t (wire values), with a reference. */
static struct att *reg_find(const struct sockproto_tuple *t)
{
	struct att *a;

	pthread_mutex_lock(&reg_mu);
	for (a = reg_head; a; a = a->next)
		if (!memcmp(&a->tuple, t, sizeof(*t)))
			break;
	if (a)
		atomic_fetch_add(&a->refs, 1);
	pthread_mutex_unlock(&reg_mu);
	return a;
}

/* Drop released attachments from the registry (progress thread). */
static void reg_sweep(void)
{
	struct att **pp, *a, *dead = NULL;

	pthread_mutex_lock(&reg_mu);
	for (pp = &reg_head; (a = *pp);) {
		if (atomic_load(&a->refs) == 1 && a->closing && a->anchor < 0) {
			*pp = a->next;
			a->next = dead;
			dead = a;
		} else {
			pp = &a->next;
		}
	}
	pthread_mutex_unlock(&reg_mu);
	while ((a = dead)) {
		dead = a->next;
		att_put(a);
	}
}

/*
 * Another process may hold a's socket (a's process forked, or a was found
 * open): a's counts are its streams' offsets only while the kernel's say
 * the same, that is nobody else moved a byte. Reads are never left
 * uncounted for long (the ring's reads do not block in the kernel), so
 * the consumed count must be equal; a write of ours may be blocked in the
 * kernel half done, so the written count may be ahead here, and
 * att_switch checks it exactly once no write of ours is under way.
 * Under a->mu.
 */
static int att_counts_agree(struct att *a)
{
	uint64_t w, r;

	return kcount_offsets(a->anchor, &w, &r) == 0 && w >= a->tx && r == a->rx;
}

static void on_record(struct att *a, const unsigned char *rec, size_t len)
{
	struct sockproto_hdr h;
	uint32_t epoch;
	int type;

	memcpy(&h, rec, sizeof(h));
	type = h.type;
	epoch = sockproto_get32(&h.epoch);
	pthread_mutex_lock(&a->mu);
	if (a->anchor < 0)
		type = 0;	/* closed and let go: nothing more to do */
	switch (type) {
	case SOCKPROTO_ATTACH_REQ: {
		struct sockproto_attach req, rep;
		struct sockproto_reason_rec nack;
		int reason = 0;

		memcpy(&req, rec, sizeof(req));
		if (a->client || a->pid != getpid())
			reason = SOCKPROTO_R_DENIED;
		else if (a->closing || a->shut_wr)
			reason = SOCKPROTO_R_SHUTDOWN;
		else if (a->phase != PHASE_PLAIN || epoch <= a->epoch)
			reason = SOCKPROTO_R_BUSY;
		else if ((a->forked || a->shared) && !att_counts_agree(a))
			reason = SOCKPROTO_R_BUSY;	/* moving, or moved by another: later */
		else if (a->disabled)
			reason = SOCKPROTO_R_DISABLED;
		if (!reason) {
			a->epoch = epoch;
			TRACE("ATTACH_REQ epoch %u received", epoch);
			if (att_setup(a) < 0)
				reason = errno == ENODEV ? SOCKPROTO_R_NO_DEVICE : SOCKPROTO_R_NO_MEMORY;
			else if (att_connect(a, &req.ep) < 0)
				reason = SOCKPROTO_R_NO_DEVICE;
		}
		TRACE("ATTACH_REQ epoch %u: %s (reason %d)", epoch, reason ? "refused" : "attached", reason);
		if (reason) {
			stats_fallback(a, reason);
			sockproto_init(&nack, SOCKPROTO_ATTACH_NACK, epoch);
			sockproto_put16(&nack.reason, (uint16_t)reason);
			a->epoch = epoch > a->epoch ? epoch : a->epoch;
			broker_send_routed(a, &nack, sizeof(nack));
			if (a->qp)
				att_release(a);
			break;
		}
		a->phase = PHASE_ATTACHED;
		att_ep_attached(a);
		sockproto_init(&rep, SOCKPROTO_ATTACH_REP, epoch);
		rep.tuple = a->tuple;
		sockproto_put64(&rep.incarnation, (uint64_t)getpid());
		att_local_endpoint(a, &rep.ep);
		broker_send_routed(a, &rep, sizeof(rep));
		stat_add(&shim_stats.attached, 1);
		break;
	}
	case SOCKPROTO_ATTACH_REP: {
		struct sockproto_attach rep;

		memcpy(&rep, rec, sizeof(rep));
		if (a->phase != PHASE_ATTACHING || epoch != a->epoch || !a->qp)
			break;
		if (att_connect(a, &rep.ep) < 0) {
			att_demote(a, SOCKPROTO_R_NO_DEVICE);
			break;
		}
		a->phase = PHASE_ATTACHED;
		att_ep_attached(a);
		stat_add(&shim_stats.attached, 1);
		TRACE("ATTACH_REP epoch %u: attached at offset %llu", epoch, (unsigned long long)a->tx);
		att_try_switch(a);
		break;
	}
	case SOCKPROTO_ATTACH_NACK: {
		int why = sockproto_get16(rec + offsetof(struct sockproto_reason_rec, reason));

		TRACE("ATTACH_NACK epoch %u, reason %d", epoch, why);
		if (epoch != a->epoch)
			break;
		/*
		 * No owner yet: the acceptor has not registered within the
		 * 2 s the peer's rvmad kept the request (it hands the
		 * connection to a child that has not started, as sshd's
		 * after authentication): ask again 100 ms later, so that the
		 * requests wait there nearly all the time. Busy: its bytes
		 * were moving; ask again 100 ms, 400 ms, 1.6 s, then 3.2 s
		 * later.
		 */
		if (a->phase == PHASE_ATTACHING &&
		    (why == SOCKPROTO_R_NO_OWNER || why == SOCKPROTO_R_BUSY) &&
		    a->retries < ATT_RETRIES && !a->closing && !a->disabled) {
			a->retry_at = shim_now_ms() + (why == SOCKPROTO_R_NO_OWNER ? 100 :
						       a->retries < 3 ? 100 << (2 * a->retries) : 3200);
			a->retries++;
			atomic_fetch_add(&retries_pending, 1);
		} else if (a->phase == PHASE_ATTACHING) {
			stats_fallback(a, why);
		}
		if (a->phase == PHASE_ATTACHING || a->phase == PHASE_DEMOTING) {
			a->phase = PHASE_PLAIN;
			a->in = IN_TCP;
			if (a->out == AOUT_HELD)
				a->out = AOUT_TCP;
			if (a->qp)
				att_release(a);
		}
		break;
	}
	case SOCKPROTO_DEMOTE: {
		struct sockproto_demote d;

		memcpy(&d, rec, sizeof(d));
		TRACE("DEMOTE from the peer, epoch %u, consumed %llu", epoch,
		      (unsigned long long)sockproto_get64(&d.consumed));
		if (epoch == a->epoch && (a->phase == PHASE_ATTACHED || a->phase == PHASE_DEMOTING))
			att_on_peer_demote(a, sockproto_get64(&d.consumed));
		break;
	}
	case SOCKPROTO_RESULT: {
		struct sockproto_result r;

		memcpy(&r, rec, sizeof(r));
		if (r.request == SOCKPROTO_REGISTER && sockproto_get16(&r.reason)) {
			a->pid = 0;	/* not ours to attach */
			stats_fallback(a, sockproto_get16(&r.reason));
		}
		else if (r.request == SOCKPROTO_DEMOTE && sockproto_get16(&r.reason) &&
			 a->phase == PHASE_DEMOTING)
			a->reset = ECONNRESET;
		break;
	}
	}
	(void)len;
	if (a->closing)
		att_linger_step(a);
	att_wake(a);
	stats_slot_sync(a);
	pthread_mutex_unlock(&a->mu);
}

/*
 * The registry's attachments (closing ones too), each with a reference
 * the caller gives back, in an array the caller frees: *n of them.
 */
static struct att **reg_all(int *n)
{
	struct att **v = NULL, *a;
	int k = 0, cap = 0;

	pthread_mutex_lock(&reg_mu);
	for (a = reg_head; a; a = a->next) {
		if (k == cap) {
			struct att **p = realloc(v, (size_t)(cap ? 2 * cap : 64) * sizeof(*p));

			if (!p)
				break;
			v = p;
			cap = cap ? 2 * cap : 64;
		}
		atomic_fetch_add(&a->refs, 1);
		v[k++] = a;
	}
	pthread_mutex_unlock(&reg_mu);
	*n = k;
	return v;
}

/*
 * rvmad's DEVICE: the device is being removed, and the kernel waits for
 * this process to close it. Every attachment through it demotes, closing
 * ones too; the device closes when the last is released (ibv.c).
 */
static void on_device(const unsigned char *rec)
{
	struct sockproto_device d;
	struct att **v;
	int n;

	memcpy(&d, rec, sizeof(d));	/* checked: the name ends in a NUL */
	if (!ibv_dev_gone(d.name))
		return;
	TRACE("DEVICE %s is being removed: demoting its attachments", d.name);
	v = reg_all(&n);
	for (int i = 0; i < n; i++) {
		struct att *a = v[i];

		pthread_mutex_lock(&a->mu);
		if (a->dev && a->dev->gone && a->pid == getpid()) {
			att_demote(a, SOCKPROTO_R_DEVICE);
			if (a->closing)
				att_linger_step(a);
		}
		pthread_mutex_unlock(&a->mu);
		att_put(a);
	}
	free(v);
}

static void on_broker(void)
{
	unsigned char buf[SOCKPROTO_ROUTE_SIZE + SOCKPROTO_RECORD_MAX + 8];
	struct sockproto_tuple t;
	const unsigned char *rec;
	size_t len;
	ssize_t r;

	for (;;) {
		r = REAL(recv)(broker_fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		len = (size_t)r;
		if (len > SOCKPROTO_ROUTE_SIZE && buf[3] == SOCKPROTO_ROUTE) {
			struct sockproto_route rt;

			if (sockproto_check(buf, SOCKPROTO_ROUTE_SIZE) < 0)
				continue;
			memcpy(&rt, buf, sizeof(rt));
			t = rt.tuple;
			rec = buf + SOCKPROTO_ROUTE_SIZE;
			len -= SOCKPROTO_ROUTE_SIZE;
		} else if (len == SOCKPROTO_RESULT_SIZE && buf[3] == SOCKPROTO_RESULT) {
			struct sockproto_result res;

			memcpy(&res, buf, sizeof(res));
			t = res.tuple;
			rec = buf;
		} else if (len == SOCKPROTO_DEVICE_SIZE && buf[3] == SOCKPROTO_DEVICE) {
			if (sockproto_check(buf, len) == 0)
				on_device(buf);
			continue;
		} else {
			continue;
		}
		if (sockproto_check(rec, len) < 0)
			continue;
		struct att *a = reg_find(&t);

		if (a) {
			on_record(a, rec, len);
			att_put(a);
		}
	}
	if (r == 0) {
		/* rvmad went away: no new attachments; live ones go on. */
		REAL(epoll_ctl)(epfd, EPOLL_CTL_DEL, broker_fd, NULL);
	}
}

/* An event of a watched attachment: its channel or its anchor. */
static void on_att(struct att *a)
{
	pthread_mutex_lock(&a->mu);
	att_take_events(a);
	if (a->ep_regs > 0 && a->cq) {
		/* epoll waits on this connection: armed again, and what came */
		ibv_req_notify_cq(a->cq, 0);
		att_poll_cq(a);
	}
	if (a->out == AOUT_FLUSH)
		att_flush(a);
	if (a->closing == 1)
		att_linger_step(a);
	else
		progress_watch(a);
	pthread_mutex_unlock(&a->mu);
}

/* New work: clients whose attachment is to start. */
static void on_kick(void)
{
	uint64_t v;
	struct att *a, *todo[256];
	int n = 0;

	if (REAL(read)(kickfd, &v, sizeof(v)) < 0) {
		/* nothing */
	}
	closed_run();
	pthread_mutex_lock(&reg_mu);
	for (a = reg_head; a && n < 256; a = a->next) {
		atomic_fetch_add(&a->refs, 1);
		todo[n++] = a;
	}
	pthread_mutex_unlock(&reg_mu);
	for (int i = 0; i < n; i++) {
		int64_t t = shim_now_ms();

		a = todo[i];
		pthread_mutex_lock(&a->mu);
		int due = 0;

		if (a->retry_at > 0 && (t >= a->retry_at || a->closing || a->disabled)) {
			atomic_fetch_sub(&retries_pending, 1);
			due = t >= a->retry_at;
			a->retry_at = 0;
		}
		if (a->client && a->phase == PHASE_PLAIN && a->pid == getpid() && !a->forked &&
		    (a->epoch == 0 || due) && !a->closing && !a->shut_wr && !a->disabled) {
			struct sockproto_attach req;

			a->epoch++;
			TRACE("attaching");
			if (att_setup(a) == 0) {
				sockproto_init(&req, SOCKPROTO_ATTACH_REQ, a->epoch);
				req.tuple = a->tuple;
				sockproto_put64(&req.incarnation, (uint64_t)getpid());
				att_local_endpoint(a, &req.ep);
				a->phase = PHASE_ATTACHING;
				TRACE("ATTACH_REQ epoch %u sent at offset %llu", a->epoch, (unsigned long long)a->tx);
				if (broker_send_routed(a, &req, sizeof(req)) < 0) {
					a->phase = PHASE_PLAIN;
					att_release(a);
					stats_fallback(a, SOCKPROTO_R_NO_DAEMON);
				}
			} else {
				stats_fallback(a, errno == ENODEV ? SOCKPROTO_R_NO_DEVICE : SOCKPROTO_R_NO_MEMORY);
			}
			stats_slot_sync(a);
		}
		pthread_mutex_unlock(&a->mu);
		att_put(a);
	}
	reg_sweep();
}

static void *progress_main(void *arg)
{
	struct epoll_event evs[16];
	sigset_t sync;

	(void)arg;
	/* A fault is the thread's own: its handler (if any) runs here. */
	sigemptyset(&sync);
	sigaddset(&sync, SIGSEGV);
	sigaddset(&sync, SIGBUS);
	sigaddset(&sync, SIGFPE);
	sigaddset(&sync, SIGILL);
	sigaddset(&sync, SIGABRT);
	pthread_sigmask(SIG_UNBLOCK, &sync, NULL);
	for (;;) {
		int n = REAL(epoll_wait)(epfd, evs, 16, atomic_load(&retries_pending) ? 50 : -1);

		for (int i = 0; i < n; i++) {
			uint64_t tag = evs[i].data.u64;

			if (tag == TAG_BROKER)
				on_broker();
			else if (tag == TAG_KICK)
				on_kick();
			else
				on_att((struct att *)(uintptr_t)(tag & ~(uint64_t)3));
		}
		if (n > 0)
			reg_sweep();
		else if (n == 0)
			on_kick();	/* a client's time to ask again */
	}
	return NULL;
}

/*
 * In the parent after fork: the child holds every socket too, and may
 * read or write it (accept-then-fork servers do, and the parent closes
 * its copy): a registered connection stays this process's (the child
 * leaves it alone), no longer asks for an attachment as a client, and is
 * demoted when this process closes it or exits, so that the child finds
 * its bytes on the anchor.
 */
void progress_fork_parent(void)
{
	pthread_mutex_lock(&reg_mu);
	for (struct att *a = reg_head; a; a = a->next)
		if (a->pid == getpid())
			a->forked = 1;
	pthread_mutex_unlock(&reg_mu);
}

/*
 * In a forked child: the thread is gone and the broker connection is the
 * parent's. The registry's attachments are the parent's: forgotten here
 * (their memory stays; the child never touches them), and their private
 * anchors closed so that the parent's closes still end the connections.
 */
void progress_fork_child(void)
{
	for (struct att *a = reg_head; a; a = a->next)
		if (a->anchor >= 0)
			REAL(close)(a->anchor);
	reg_head = NULL;
	if (broker_fd >= 0)
		REAL(close)(broker_fd);
	if (epfd >= 0)
		REAL(close)(epfd);
	if (kickfd >= 0)
		REAL(close)(kickfd);
	broker_fd = epfd = kickfd = -1;
	started = 0;
	stats_sent = 0;
	pthread_mutex_init(&reg_mu, NULL);
	ibv_fork_child();
	epoll_fork_child();
}

/*
 * At exit: a connection other processes may hold (a child's inherited
 * one, whose parent keeps the socket) is demoted, so that whoever uses
 * it next finds every byte on the anchor (at most 2 s in all; the
 * progress thread still runs and takes the peer's DEMOTE). Then writes
 * posted on the rings complete before the QPs die with the process (at
 * most 1 s in all), as the kernel would still deliver what a TCP socket
 * had accepted. A peer that ended its side already, or a QP that failed,
 * is not waited for.
 */
__attribute__((destructor)) static void progress_exit(void)
{
	struct att *a, *shared[64];
	int64_t end;
	int n = 0;

	if (!started)
		return;
	pthread_mutex_lock(&reg_mu);
	for (a = reg_head; a && n < 64; a = a->next)
		if (a->pid == getpid() && (a->shared || a->forked) && !a->closing &&
		    (a->phase == PHASE_ATTACHED || a->phase == PHASE_ATTACHING)) {
			atomic_fetch_add(&a->refs, 1);
			shared[n++] = a;
		}
	pthread_mutex_unlock(&reg_mu);
	end = shim_now_ms() + 2000;
	for (int i = 0; i < n; i++) {
		int64_t left = end - shim_now_ms();

		if (left > 0)
			att_demote_wait(shared[i], SOCKPROTO_R_SHUTDOWN, (int)left);
		att_put(shared[i]);
	}
	end = shim_now_ms() + 1000;
	pthread_mutex_lock(&reg_mu);
	for (a = reg_head; a; a = a->next) {
		int64_t left = end - shim_now_ms();

		if (left <= 0)
			break;
		if (a->pid != getpid() || pthread_mutex_trylock(&a->mu))
			continue;
		if (a->out == AOUT_RING && a->qp && !a->qp_dead && !a->anchor_eof &&
		    a->fin_in == SOCKPROTO_NO_FIN && !a->reset)
			att_drain_sends(a, (int)left);
		pthread_mutex_unlock(&a->mu);
	}
	pthread_mutex_unlock(&reg_mu);
}
