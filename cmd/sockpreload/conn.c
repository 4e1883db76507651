/*
 * conn.c: connection objects, and every change of the fd table.
 *
 * A connection object stands for one kernel TCP socket of AF_INET or
 * AF_INET6 (one open file description); each fd aliasing it (dup, dup2,
 * dup3, F_DUPFD) holds a reference. Objects come from a free list and go
 * back to it, never to malloc (shim.h says why); the live ones are on a
 * list that fork, exec and the statistics walk.
 *
 * Sockets the shim did not create (inherited across exec, received with
 * SCM_RIGHTS, made by a raw system call) are found by conn_probe the
 * first time a wrapper meets their fd: one getsockopt tells a socket from
 * anything else, three more a TCP socket of AF_INET or AF_INET6 from
 * other sockets. Such a connection is "adopted": it may attach from the
 * kernel's byte counts (kcount.c).
 */
#include "rdma.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <time.h>

static struct conn *live_head;
static struct conn *free_head;
static unsigned next_id;

/* Under shim_lock. */
static struct conn *conn_alloc(enum conn_role role, int family, unsigned flags)
{
	struct conn *c = free_head;

	if (c)
		free_head = c->next;
	else if (!(c = malloc(sizeof(*c))))
		return NULL;
	c->refs = 1;
	c->id = ++next_id;
	atomic_store_explicit(&c->role, role, memory_order_relaxed);
	if (family == AF_INET6)
		flags |= CONN_V6;
	atomic_store_explicit(&c->flags, flags, memory_order_relaxed);
	atomic_store_explicit(&c->att, NULL, memory_order_relaxed);
	c->ep_sets = 0;
	atomic_store_explicit(&c->eligible, 0, memory_order_relaxed);
	atomic_store_explicit(&c->tx, 0, memory_order_relaxed);
	atomic_store_explicit(&c->rx, 0, memory_order_relaxed);
	atomic_store_explicit(&c->inflight, 0, memory_order_relaxed);
	atomic_store_explicit(&c->attaching, 0, memory_order_relaxed);
	atomic_store_explicit(&c->rbytes, 0, memory_order_relaxed);
	atomic_store_explicit(&c->wbytes, 0, memory_order_relaxed);
	c->prev = NULL;
	c->next = live_head;
	if (live_head)
		live_head->prev = c;
	live_head = c;
	stat_add(&shim_stats.live, 1);
	stat_add(&shim_stats.created[role], 1);
	stats_arm();
	return c;
}

/* Drop one fd's reference (under shim_lock); the last one frees. */
static void conn_put(struct conn *c)
{
	struct att *a;

	if (--c->refs > 0)
		return;
	if ((a = atomic_exchange(&c->att, NULL)))
		progress_closed(a);	/* the progress thread closes it: not under this lock */
	stats_conn_released(c);
	if (c->prev)
		c->prev->next = c->next;
	else
		live_head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	atomic_fetch_sub_explicit(&shim_stats.live, 1, memory_order_relaxed);
	c->next = free_head;
	free_head = c;
}

/* Point fd's slot at v, dropping what it held (under shim_lock). */
static void slot_set(int fd, uintptr_t v)
{
	struct conn *old = slot_conn(fdt_load(fd));

	if (fdt_store(fd, v) < 0) {
		/* The table could not grow: fd stays unknown, holding nothing. */
		if (slot_conn(v))
			conn_put(slot_conn(v));
		return;
	}
	if (old)
		conn_put(old);
}

static uintptr_t slot_of(struct conn *c, int cloexec)
{
	return (uintptr_t)c | (cloexec ? SLOT_CLOEXEC : 0);
}

void conn_set_flag(struct conn *c, unsigned flag, int on)
{
	if (on)
		atomic_fetch_or_explicit(&c->flags, flag, memory_order_relaxed);
	else
		atomic_fetch_and_explicit(&c->flags, ~flag, memory_order_relaxed);
}

/* Move the role from one value to another; 1 when this call moved it. */
int conn_role_move(struct conn *c, enum conn_role from, enum conn_role to)
{
	int expect = from;

	if (!atomic_compare_exchange_strong(&c->role, &expect, to))
		return 0;
	if (to != ROLE_NEW && to != ROLE_CONNECTING)
		stat_add(&shim_stats.created[to], 1);
	return 1;
}

/*
 * A connection attempt ended, or went on (err: SO_ERROR's value, or what
 * connect answered): a success makes the socket the protocol's client
 * (once), a failure makes it new again and counts it.
 */
void conn_connect_result(struct conn *c, int fd, int err)
{
	if (err == 0 || err == EISCONN) {
		if (conn_role_move(c, ROLE_CONNECTING, ROLE_CLIENT))
			conn_established(c, fd);
	} else if (err != EINPROGRESS && err != EALREADY && err != EINTR &&
		   err != EAGAIN) {
		if (conn_role_move(c, ROLE_CONNECTING, ROLE_NEW))
			stat_add(&shim_stats.connect_failed, 1);
	}
}

/* A connect in progress that the kernel says is done. */
void conn_check_connected(struct conn *c, int fd)
{
	struct sockaddr_storage ss;
	socklen_t l = sizeof(ss);
	int err = errno;

	if (REAL(getpeername)(fd, (struct sockaddr *)&ss, &l) == 0)
		conn_connect_result(c, fd, 0);
	errno = err;
}

/*
 * socket(): a TCP socket of AF_INET or AF_INET6 gets a connection object
 * (role new); anything else leaves its slot unknown, or clears a stale
 * one, so the fast path stays one lookup.
 */
void conn_track_new(int fd, int family, int type)
{
	struct shim_held h;
	struct conn *c;

	if (!shim_lock(&h))
		return;
	c = conn_alloc(ROLE_NEW, family, (type & SOCK_NONBLOCK) ? CONN_NONBLOCK : 0);
	slot_set(fd, c ? slot_of(c, type & SOCK_CLOEXEC) : SLOT_UNKNOWN);
	shim_unlock(&h);
}

/* accept(), accept4(): the new fd is the protocol's server side. */
void conn_track_accepted(int fd, struct conn *listener, int flags)
{
	struct shim_held h;
	struct conn *c;

	if (!shim_lock(&h))
		return;
	c = conn_alloc(ROLE_SERVER, (conn_flags(listener) & CONN_V6) ? AF_INET6 : AF_INET,
		       (flags & SOCK_NONBLOCK) ? CONN_NONBLOCK : 0);
	slot_set(fd, c ? slot_of(c, flags & SOCK_CLOEXEC) : SLOT_UNKNOWN);
	shim_unlock(&h);
	if (c)
		conn_established(c, fd);
}

/*
 * dup and friends: newfd aliases oldfd's connection c, unless oldfd no
 * longer holds it (closed by another thread meanwhile): then newfd is
 * left to be probed.
 */
void conn_alias(int oldfd, struct conn *c, int newfd, int cloexec)
{
	struct shim_held h;

	if (!shim_lock(&h))
		return;
	if (slot_conn(fdt_load(oldfd)) == c) {
		c->refs++;
		slot_set(newfd, slot_of(c, cloexec));
	} else {
		slot_set(newfd, SLOT_UNKNOWN);
	}
	shim_unlock(&h);
}

/* close(): the fd is gone; its number will next come from elsewhere. */
void conn_untrack(int fd)
{
	struct shim_held h;

	if (!shim_lock(&h))
		return;
	slot_set(fd, SLOT_NONE);
	shim_unlock(&h);
}

void conn_untrack_range(unsigned first, unsigned last)
{
	struct shim_held h;
	size_t n;

	if (!shim_lock(&h))
		return;
	n = fdt_size();
	for (size_t fd = first; fd < n && fd <= last; fd++)
		if (slot_conn(fdt_load((int)fd)))
			slot_set((int)fd, SLOT_NONE);
	shim_unlock(&h);
}

/*
 * The shim lets go of fd (fdopen: stdio owns it now, and stdio's own close
 * is invisible) or must look at it again (an fd received by SCM_RIGHTS
 * whose number the table knew): the slot becomes unknown.
 */
void conn_forget(int fd)
{
	struct shim_held h;

	if (!shim_lock(&h))
		return;
	slot_set(fd, SLOT_UNKNOWN);
	shim_unlock(&h);
}

void conn_set_cloexec(int fd, int on)
{
	struct shim_held h;
	uintptr_t v;

	if (!shim_lock(&h))
		return;
	v = fdt_load(fd);
	if (slot_conn(v))
		fdt_store(fd, on ? v | SLOT_CLOEXEC : v & ~SLOT_CLOEXEC);
	shim_unlock(&h);
}

void conn_set_cloexec_range(unsigned first, unsigned last)
{
	struct shim_held h;
	size_t n;

	if (!shim_lock(&h))
		return;
	n = fdt_size();
	for (size_t fd = first; fd < n && fd <= last; fd++) {
		uintptr_t v = fdt_load((int)fd);

		if (slot_conn(v))
			fdt_store((int)fd, v | SLOT_CLOEXEC);
	}
	shim_unlock(&h);
}

/*
 * An fd the table has never seen: is it a TCP socket of AF_INET or
 * AF_INET6? The answer is recorded, unless the slot changed meanwhile (a
 * wrapper recorded the fd, or it was closed): then the slot's value is
 * the answer. A closed fd (EBADF) records nothing. errno is kept.
 */
struct conn *conn_probe(int fd)
{
	int err = errno, type = 0, dom = 0, proto = 0, acc = 0, fl, fdfl;
	socklen_t l = sizeof(int);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	uintptr_t v = SLOT_NONE;
	enum conn_role role;
	struct conn *c = NULL;
	struct shim_held h;

	if (shim_sandbox())
		return NULL;	/* no system call the sandbox did not expect */
	if (REAL(getsockopt)(fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0) {
		if (errno == EBADF)
			goto out;
		goto record;
	}
	if (type != SOCK_STREAM)
		goto record;
	l = sizeof(int);
	if (REAL(getsockopt)(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l) < 0 ||
	    (dom != AF_INET && dom != AF_INET6))
		goto record;
	l = sizeof(int);
	if (REAL(getsockopt)(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l) < 0 ||
	    proto != IPPROTO_TCP)
		goto record;
	l = sizeof(int);
	REAL(getsockopt)(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l);
	if (acc)
		role = ROLE_LISTENER;
	else if (REAL(getpeername)(fd, (struct sockaddr *)&ss, &sl) == 0)
		role = ROLE_ADOPTED;
	else
		role = ROLE_NEW;
	fl = REAL(fcntl)(fd, F_GETFL);
	fdfl = REAL(fcntl)(fd, F_GETFD);
	if (fl < 0 || fdfl < 0)
		goto out;
	if (!shim_lock(&h))
		goto out;
	if (fdt_load(fd) == SLOT_UNKNOWN &&
	    (c = conn_alloc(role, dom, (fl & O_NONBLOCK) ? CONN_NONBLOCK : 0))) {
		fdt_store(fd, slot_of(c, fdfl & FD_CLOEXEC));
		if (role == ROLE_ADOPTED) {
			/* bytes moved before us: the kernel counts them */
			conn_set_flag(c, CONN_KOFF, 1);
			conn_established(c, fd);
		}
	} else {
		c = slot_conn(fdt_load(fd));
	}
	shim_unlock(&h);
	goto out;
record:
	if (!shim_lock(&h))
		goto out;
	if (fdt_load(fd) == SLOT_UNKNOWN)
		fdt_store(fd, v);
	c = slot_conn(fdt_load(fd));
	shim_unlock(&h);
out:
	errno = err;
	return c;
}

/*
 * conn_close_prepare: an fd of c is about to close. If it is the last
 * one, its epoll registrations go; with bytes of the ring the program
 * never read, or SO_LINGER {1, 0}, the connection is reset as TCP would
 * (ABORT), else if the outgoing direction is on the ring, FIN goes now.
 * A connection other processes may hold is neither (att_closed demotes
 * it). The rest of the close (linger, release) is the progress thread's
 * (att_closed); at exit the shim waits a moment for writes still in
 * flight (progress.c).
 */
void conn_close_prepare(struct conn *c)
{
	struct att *a = conn_att(c);
	int err = errno;

	if (!a || c->refs > 1)
		return;
	epoll_conn_closing(a);
	pthread_mutex_lock(&a->mu);
	if (conn_flags(c) & CONN_LINGER0)
		a->linger0 = 1;
	if (a->qp && a->phase == PHASE_ATTACHED && !a->forked && !a->shared &&
	    ((conn_flags(c) & CONN_LINGER0) || (a->in == IN_RING && a->prod > a->rx)))
		att_abort(a, (conn_flags(c) & CONN_LINGER0) ? SOCKPROTO_R_LINGER0 :
			     SOCKPROTO_R_CLOSE_UNREAD);
	else if (a->out == AOUT_RING && a->qp)
		att_post_fin(a);
	pthread_mutex_unlock(&a->mu);
	errno = err;
}


/* How long a connection lives on TCP before it may attach (ms). */
static int64_t attach_delay(void)
{
	static _Atomic long v = -1;
	long d = atomic_load_explicit(&v, memory_order_relaxed);

	if (d < 0) {
		const char *e = getenv("RDMAPLUS_SOCKETS_ATTACH_MS");

		d = e ? strtol(e, NULL, 10) : 200;
		if (d < 0 || d > 3600000)
			d = 200;
		atomic_store_explicit(&v, d, memory_order_relaxed);
	}
	return d;
}

/*
 * conn_established: a connection is up (connect completed, or accepted)
 * in the process that made it. It may become attachable later
 * (conn_maybe_attach), never on the program's critical path and never
 * for a connection shorter than the attach delay: registering every
 * accepted connection with rvmad halved nginx's rate of short
 * connections in the lab.
 */
void conn_established(struct conn *c, int fd)
{
	(void)fd;
	if (!shim_owner() || (conn_flags(c) & CONN_FOREIGN) || conn_att(c))
		return;
	c->t_est = shim_now_ms();
	atomic_store_explicit(&c->eligible, 1, memory_order_release);
}

/*
 * At a read or write of an eligible connection: once it lived the attach
 * delay or moved 64 KiB, it becomes attachable (once): registered with
 * rvmad (its socket passed as proof), and the client asks for an
 * attachment from the progress thread. NULL: not (yet, or ever).
 */
struct att *conn_maybe_attach(struct conn *c, int fd)
{
	struct att *a;
	int koff = conn_flags(c) & CONN_KOFF, one = 1;
	int client = atomic_load(&c->role) == ROLE_CLIENT && !koff;
	uint64_t tx, rx;

	if (shim_now_ms() - c->t_est < attach_delay() &&
	    atomic_load_explicit(&c->tx, memory_order_relaxed) +
	    atomic_load_explicit(&c->rx, memory_order_relaxed) < (64 << 10))
		return NULL;
	if (!atomic_compare_exchange_strong(&c->eligible, &one, 0))
		return conn_att(c);
	if (!shim_owner() || shim_sandbox() || (conn_flags(c) & CONN_FOREIGN) || c->ep_sets > 1)
		return NULL;
	/*
	 * Plain I/O of another thread under way: its bytes are not counted
	 * yet. Try again at a later call (io_begin's other half).
	 */
	atomic_store(&c->attaching, 1);
	if (atomic_load(&c->inflight)) {
		atomic_store(&c->attaching, 0);
		atomic_store(&c->eligible, 1);
		return NULL;
	}
	if (koff) {
		if (kcount_offsets(fd, &tx, &rx) < 0) {
			/* moving right now: at a later call; closing: never */
			atomic_store(&c->attaching, 0);
			if (errno == EAGAIN)
				atomic_store(&c->eligible, 1);
			return NULL;
		}
	} else {
		tx = atomic_load(&c->tx);
		rx = atomic_load(&c->rx);
	}
	a = att_new(c, fd, client);
	if (a) {
		a->tx = tx;
		a->rx = rx;
		a->shared = !!koff;
		if (broker_register(a, fd) < 0) {
			att_put(a);
			a = NULL;
		} else {
			atomic_store_explicit(&c->att, a, memory_order_release);
		}
	}
	atomic_store(&c->attaching, 0);
	if (!a)
		return NULL;
	stat_add(&shim_stats.attachable, 1);
	if (c->ep_sets)
		epoll_conn_established(c, a);
	if (client)
		progress_kick();
	return a;
}

/*
 * conn_demote: the connection goes back to TCP, for a reason of
 * sockproto.h (exec, fd_passed, fdopen, splice, or a call the ring does
 * not serve yet: disabled). Not attached yet: it never will be. Attached:
 * DEMOTE, then wait (at most 5 s) until the outgoing direction is on the
 * anchor again, so that whoever uses the socket next finds it plain.
 */
void conn_demote(struct conn *c, int reason)
{
	struct att *a = conn_att(c);

	atomic_store(&c->eligible, 0);	/* the kernel or another moves bytes now */
	conn_set_flag(c, CONN_NEVER, 1);
	if (a)
		att_demote_wait(a, reason, 5000);
}

/* Demote a and wait (at most ms) until its outgoing direction is on TCP. */
void att_demote_wait(struct att *a, int reason, int ms)
{
	int err = errno;

	pthread_mutex_lock(&a->mu);
	a->disabled = 1;
	if (a->phase == PHASE_ATTACHED || a->phase == PHASE_ATTACHING)
		att_demote(a, reason);
	for (int i = 0; i < ms / 10 && (a->phase != PHASE_PLAIN || a->out != AOUT_TCP) && !a->reset; i++) {
		pthread_mutex_unlock(&a->mu);
		{
			struct pollfd p = { a->wr_ev, POLLIN, 0 };

			REAL(poll)(&p, 1, 10);
		}
		pthread_mutex_lock(&a->mu);
		att_poll_cq(a);
		if (a->out == AOUT_FLUSH)
			att_flush(a);
	}
	pthread_mutex_unlock(&a->mu);
	errno = err;
}

/*
 * shutdown(SHUT_WR) on an attachable connection: no switch from now on.
 * 1 when the outgoing direction is off the anchor: FIN goes on the ring,
 * and the anchor is shut once everything was credited (or flushed), not
 * now; 0: the caller shuts the anchor.
 */
int conn_shut_wr(struct conn *c)
{
	struct att *a = conn_att(c);
	int later;

	if (!a)
		return 0;
	pthread_mutex_lock(&a->wmu);
	pthread_mutex_lock(&a->mu);
	a->shut_wr = 1;
	a->want_switch = 0;
	later = a->out != AOUT_TCP;
	if (a->out == AOUT_RING)
		att_post_fin(a);
	if (!later)
		a->anchor_shut = 1;
	pthread_mutex_unlock(&a->mu);
	pthread_mutex_unlock(&a->wmu);
	return later;
}

/*
 * After fork, in the parent (the fork handler, with the table's mutex
 * still held): the child may read and write every connection now, so the
 * counts of one not yet registered no longer say where its streams stand;
 * it may still attach, by the kernel's counts (CONN_KOFF). Registered
 * ones are the progress thread's (progress_fork_parent).
 */
void conn_fork_parent(void)
{
	for (struct conn *c = live_head; c; c = c->next)
		if (!conn_att(c))
			conn_set_flag(c, CONN_KOFF, 1);
}

/*
 * After fork, in the child (the fork handler, with the table's mutex held
 * by the forking thread's copy): every live connection is the parent's
 * too. One the parent registered with rvmad stays the parent's (foreign:
 * the child passes its calls to the kernel, and never registers it, which
 * would take the parent's records); any other may attach here, answering
 * its peer's request with the kernel's counts (CONN_KOFF), so that the
 * child of an accept-then-fork server (sshd) carries its connection on
 * RDMA.
 */
void conn_fork_child(void)
{
	uint64_t n = 0;

	stats_fork_child();
	for (struct conn *c = live_head; c; c = c->next) {
		int role = atomic_load_explicit(&c->role, memory_order_relaxed);

		if (conn_att(c)) {
			conn_set_flag(c, CONN_FOREIGN, 1);
		} else {
			conn_set_flag(c, CONN_KOFF, 1);
			if ((role == ROLE_CLIENT || role == ROLE_SERVER || role == ROLE_ADOPTED) &&
			    !(conn_flags(c) & CONN_NEVER)) {
				c->t_est = shim_now_ms();
				atomic_store_explicit(&c->eligible, 1, memory_order_relaxed);
			}
		}
		atomic_store_explicit(&c->att, NULL, memory_order_relaxed);
		atomic_store_explicit(&c->rbytes, 0, memory_order_relaxed);
		atomic_store_explicit(&c->wbytes, 0, memory_order_relaxed);
		n++;
	}
	progress_fork_child();
	atomic_store_explicit(&shim_stats.live, n, memory_order_relaxed);
	atomic_store_explicit(&shim_stats.inherited, n, memory_order_relaxed);
}

/* Walk the live connections under shim_lock (stats, exec). */
void conn_foreach_live(void (*fn)(struct conn *c, void *arg), void *arg)
{
	struct shim_held h;

	if (!shim_lock(&h))
		return;
	for (struct conn *c = live_head; c; c = c->next)
		fn(c, arg);
	shim_unlock(&h);
}
