/*
 * epoll.c: epoll_create, epoll_create1, epoll_ctl, epoll_wait,
 * epoll_pwait, epoll_pwait2 (docs/sockets.md, "Readiness").
 *
 * A set without attachable connections is the kernel's alone. The first
 * attachable connection added to a program's set E gives E a shadow set S
 * (added to E under a random 64-bit cookie), and the connection a
 * registration (struct ereg):
 *
 * - its anchor stays in E, with the program's events but our ereg as the
 *   data, so that epoll_wait knows whose event it is (the program's data
 *   is given back in its place). While the outgoing direction is on the
 *   ring, the anchor's EPOLLOUT (always there) is dropped: room in the
 *   peer's ring decides.
 * - its eventfds (readers', writers') go into S, level or edge triggered
 *   as the program asked. The registration counts as a sleeper of the
 *   attachment, so completions that change what it waits for signal them.
 *   Its completion channel goes into S too, and the CQ stays armed while
 *   a registration exists: a completion wakes epoll_wait on E directly.
 *
 * epoll_wait on E turns S's events into events of the connection (ring
 * data, FIN, a reset: EPOLLIN; room: EPOLLOUT), merged with its anchor's.
 * Level triggered: an eventfd is drained only once the ring has nothing
 * more for it, so E keeps reporting while data is there; edge triggered:
 * drained as reported. EPOLLONESHOT holds a registration's events until
 * EPOLL_CTL_MOD re-arms it.
 *
 * A set nested in another (added to a set of the program's) keeps no
 * completion channel in its shadow: a completion that changes nothing for
 * the program (a send done, a credit) would make the set readable to its
 * outer set. The progress thread watches the channels of its connections
 * instead (att->ep_nested) and signals the eventfds. When a connection
 * attaches, its CQ is armed and its sets hear of it (att_ep_attached). The eventfds are drained before a look at the ring,
 * so that a signal after the look is news, and by a read that leaves the
 * ring empty, so that an outer set sees no stale readiness.
 *
 * Limits: a set shared across fork is the parent's (the child's view of
 * an attachable connection in it is its anchor's alone); the same
 * connection under two fds of one set is registered once (the second one
 * demotes).
 */
#include "rdma.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

struct ereg {
	struct ereg *next;		/* the set's registrations */
	struct eset *set;
	struct att *a;			/* a reference */
	int fd;				/* the program's fd registered */
	uint32_t events;		/* what the program asked for */
	uint64_t data;			/* the program's data */
	int fired;			/* EPOLLONESHOT: reported, until MOD */
	uint32_t chan_gen;		/* the attachment's channel in the shadow set */
	uint32_t kernel;		/* the anchor's events in E now */
};

struct eset {
	int epfd, shadow;
	int nested;			/* in another set: no channels in the shadow */
	uint64_t cookie;
	struct ereg *regs;
	pthread_mutex_t mu;
};

static pthread_mutex_t sets_mu = PTHREAD_MUTEX_INITIALIZER;
static struct eset **sets;	/* by epfd; an old array is never freed */
static size_t nsets;
static _Atomic int any_set;
/* The program's epoll sets, by fd (set at creation): which fds may nest. */
static unsigned char *epmark;	/* an old array is never freed */
static size_t nepmark;

static void epmark_set(int fd, unsigned char v)
{
	if (fd < 0)
		return;
	pthread_mutex_lock(&sets_mu);
	if ((size_t)fd >= nepmark && v) {
		size_t n = nepmark ? nepmark : 64;
		unsigned char *t;

		while (n <= (size_t)fd)
			n *= 2;
		t = calloc(n, 1);
		if (t) {
			for (size_t i = 0; i < nepmark; i++)
				t[i] = epmark[i];
			__atomic_store_n(&epmark, t, __ATOMIC_RELEASE);
			__atomic_store_n(&nepmark, n, __ATOMIC_RELEASE);
		}
	}
	if ((size_t)fd < nepmark)
		__atomic_store_n(&epmark[fd], v, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&sets_mu);
}

static int epmark_get(int fd)
{
	unsigned char *t = __atomic_load_n(&epmark, __ATOMIC_ACQUIRE);
	size_t n = __atomic_load_n(&nepmark, __ATOMIC_ACQUIRE);

	return t && fd >= 0 && (size_t)fd < n && __atomic_load_n(&t[fd], __ATOMIC_RELAXED);
}

/* Whether epfd may have a shadow set, without the lock. */
static int set_peek(int epfd)
{
	struct eset **t = __atomic_load_n(&sets, __ATOMIC_ACQUIRE);
	size_t n = __atomic_load_n(&nsets, __ATOMIC_ACQUIRE);

	/* nsets grows after sets: n never exceeds t's length */
	return t && (size_t)epfd < n && __atomic_load_n(&t[epfd], __ATOMIC_RELAXED) != NULL;
}

static struct eset *set_of(int epfd)
{
	struct eset *s = NULL;

	if (!atomic_load_explicit(&any_set, memory_order_relaxed) || epfd < 0)
		return NULL;
	pthread_mutex_lock(&sets_mu);
	if ((size_t)epfd < nsets)
		s = sets[epfd];
	pthread_mutex_unlock(&sets_mu);
	return s;
}

/* E's shadow set, made on first use. */
static struct eset *set_get(int epfd)
{
	struct epoll_event ev = { .events = EPOLLIN };
	struct eset *s;

	pthread_mutex_lock(&sets_mu);
	if ((size_t)epfd >= nsets) {
		size_t n = nsets ? nsets : 64;
		struct eset **t;

		while (n <= (size_t)epfd)
			n *= 2;
		t = calloc(n, sizeof(*t));
		if (!t)
			goto fail;
		for (size_t i = 0; i < nsets; i++)
			t[i] = sets[i];
		__atomic_store_n(&sets, t, __ATOMIC_RELEASE);	/* the old array stays */
		__atomic_store_n(&nsets, n, __ATOMIC_RELEASE);
	}
	if ((s = sets[epfd]))
		goto out;
	s = calloc(1, sizeof(*s));
	if (!s)
		goto fail;
	s->epfd = epfd;
	s->shadow = REAL(epoll_create1)(EPOLL_CLOEXEC);
	if (s->shadow < 0 || getrandom(&s->cookie, sizeof(s->cookie), GRND_NONBLOCK) != sizeof(s->cookie))
		goto fail_free;
	ev.data.u64 = s->cookie;
	if (REAL(epoll_ctl)(epfd, EPOLL_CTL_ADD, s->shadow, &ev) < 0)
		goto fail_free;
	pthread_mutex_init(&s->mu, NULL);
	sets[epfd] = s;
	atomic_store(&any_set, 1);
out:
	pthread_mutex_unlock(&sets_mu);
	return s;
fail_free:
	if (s->shadow >= 0)
		REAL(close)(s->shadow);
	free(s);
fail:
	pthread_mutex_unlock(&sets_mu);
	return NULL;
}

/*
 * The attachment's side of a registration (reg: +1 added, -1 removed, 0
 * changed): it counts as a sleeper for reading (rd) and writing (wr), and
 * the CQ is kept armed.
 */
static void att_ep(struct att *a, int rd, int wr, int reg)
{
	pthread_mutex_lock(&a->mu);
	a->ep_rd += rd;
	a->ep_wr += wr;
	a->ep_regs += reg;
	if (a->cq && a->ep_regs > 0) {
		ibv_req_notify_cq(a->cq, 0);
		att_poll_cq(a);
	}
	att_ep_sync(a);
	progress_watch(a);
	pthread_mutex_unlock(&a->mu);
}

static uint32_t kernel_events(struct ereg *r)
{
	uint32_t ev = r->events;

	if (r->a->out != AOUT_TCP)
		ev &= ~(uint32_t)EPOLLOUT;
	return ev;
}

/*
 * The shadow registrations of r's eventfds, as the program asked (the
 * readers' for EPOLLIN, the writers' for EPOLLOUT). op: EPOLL_CTL_ADD,
 * or EPOLL_CTL_DEL of both.
 */
static int shadow_ctl(struct ereg *r, int op)
{
	struct epoll_event e = { .events = EPOLLIN | (r->events & EPOLLET) };
	int rc = 0;

	if (op == EPOLL_CTL_DEL) {
		REAL(epoll_ctl)(r->set->shadow, op, r->a->rd_ev, NULL);
		REAL(epoll_ctl)(r->set->shadow, op, r->a->wr_ev, NULL);
		pthread_mutex_lock(&r->a->mu);
		if (r->chan_gen && r->a->chan && r->chan_gen == r->a->chan_gen)
			REAL(epoll_ctl)(r->set->shadow, op, r->a->chan->fd, NULL);
		pthread_mutex_unlock(&r->a->mu);
		r->chan_gen = 0;
		return 0;
	}
	e.data.u64 = (uintptr_t)r;
	if ((r->events & EPOLLIN) && REAL(epoll_ctl)(r->set->shadow, op, r->a->rd_ev, &e) < 0)
		rc = -1;
	e.data.u64 = (uintptr_t)r + 1;
	if ((r->events & EPOLLOUT) && REAL(epoll_ctl)(r->set->shadow, op, r->a->wr_ev, &e) < 0)
		rc = -1;
	return rc;
}

/*
 * The attachment's completion channel in the shadow set (data r + 2), so
 * that a completion wakes the program's epoll_wait directly; a new
 * attachment brings a new channel (the old one left the set when it was
 * closed). Under the set's mutex.
 */
static void chan_sync(struct ereg *r)
{
	struct att *a = r->a;
	struct epoll_event e = { .events = EPOLLIN };
	int fd = -1;
	uint32_t gen;

	if (r->set->nested)
		return;
	pthread_mutex_lock(&a->mu);
	gen = a->chan_gen;
	if (a->chan)
		fd = a->chan->fd;
	pthread_mutex_unlock(&a->mu);
	if (fd < 0 || gen == r->chan_gen)
		return;
	e.data.u64 = (uintptr_t)r + 2;
	if (REAL(epoll_ctl)(r->set->shadow, EPOLL_CTL_ADD, fd, &e) == 0 || errno == EEXIST)
		r->chan_gen = gen;
}

/* a's registrations in nested sets change by delta: see the file comment. */
static void att_ep_nest(struct att *a, int delta)
{
	pthread_mutex_lock(&a->mu);
	a->ep_nested += delta;
	if (a->cq && a->ep_regs > 0)
		ibv_req_notify_cq(a->cq, 0);
	progress_watch(a);
	pthread_mutex_unlock(&a->mu);
}

static void reg_free(struct ereg *r)
{
	if (r->set->nested)
		att_ep_nest(r->a, -1);
	shadow_ctl(r, EPOLL_CTL_DEL);
	att_ep(r->a, -!!(r->events & EPOLLIN), -!!(r->events & EPOLLOUT), -1);
	att_put(r->a);
	free(r);
}

static struct ereg *reg_find(struct eset *s, int fd)
{
	struct ereg *r;

	for (r = s->regs; r && r->fd != fd; r = r->next)
		;
	return r;
}

/*
 * epoll_ctl on an attachable connection: see the file comment. -1 with
 * errno as the kernel's; 1: not handled here (the caller demotes and
 * calls the kernel).
 */
static int ctl_att(int epfd, int op, int fd, struct epoll_event *ev, struct att *a)
{
	struct eset *s = op == EPOLL_CTL_ADD ? set_get(epfd) : set_of(epfd);
	struct epoll_event k;
	struct ereg *r, **pp;
	int rc;

	if (!s)
		return 1;
	pthread_mutex_lock(&s->mu);
	r = reg_find(s, fd);
	switch (op) {
	case EPOLL_CTL_ADD:
		if (r) {
			rc = -1;
			errno = EEXIST;
			break;
		}
		for (struct ereg *o = s->regs; o; o = o->next)
			if (o->a == a) {
				rc = 1;	/* the same connection twice in one set */
				goto out;
			}
		r = calloc(1, sizeof(*r));
		if (!r) {
			rc = 1;
			break;
		}
		r->set = s;
		r->a = a;
		atomic_fetch_add(&a->refs, 1);
		r->fd = fd;
		r->events = ev->events;
		r->data = ev->data.u64;
		k.events = r->kernel = kernel_events(r);
		k.data.u64 = (uintptr_t)r;
		if ((rc = REAL(epoll_ctl)(epfd, EPOLL_CTL_ADD, fd, &k)) < 0) {
			att_put(a);
			free(r);
			break;
		}
		if (shadow_ctl(r, EPOLL_CTL_ADD) < 0) {
			int err = errno;

			REAL(epoll_ctl)(epfd, EPOLL_CTL_DEL, fd, NULL);
			shadow_ctl(r, EPOLL_CTL_DEL);
			att_put(a);
			free(r);
			errno = err;
			rc = 1;
			break;
		}
		att_ep(a, !!(r->events & EPOLLIN), !!(r->events & EPOLLOUT), 1);
		if (s->nested)
			att_ep_nest(a, 1);
		chan_sync(r);
		r->next = s->regs;
		s->regs = r;
		break;
	case EPOLL_CTL_MOD:
		if (!r) {
			rc = 1;	/* not ours: the kernel's answer */
			break;
		}
		att_ep(a, !!(ev->events & EPOLLIN) - !!(r->events & EPOLLIN),
		       !!(ev->events & EPOLLOUT) - !!(r->events & EPOLLOUT), 0);
		r->events = ev->events;
		r->data = ev->data.u64;
		r->fired = 0;
		k.events = r->kernel = kernel_events(r);
		k.data.u64 = (uintptr_t)r;
		rc = REAL(epoll_ctl)(epfd, EPOLL_CTL_MOD, fd, &k);
		shadow_ctl(r, EPOLL_CTL_DEL);
		shadow_ctl(r, EPOLL_CTL_ADD);
		chan_sync(r);
		pthread_mutex_lock(&a->mu);
		att_ep_sync(a);	/* re-armed: what is there is reported */
		pthread_mutex_unlock(&a->mu);
		break;
	default:	/* EPOLL_CTL_DEL */
		if (!r) {
			rc = 1;
			break;
		}
		rc = REAL(epoll_ctl)(epfd, EPOLL_CTL_DEL, fd, ev);
		for (pp = &s->regs; *pp != r; pp = &(*pp)->next)
			;
		*pp = r->next;
		reg_free(r);
	}
out:
	pthread_mutex_unlock(&s->mu);
	return rc;
}

/*
 * The last fd of a connection closes (before the kernel's close): its
 * registrations go, as the kernel's would with the socket's last fd (the
 * shim's private duplicate would keep them alive).
 */
void epoll_conn_closing(struct att *a)
{
	if (!atomic_load_explicit(&any_set, memory_order_relaxed))
		return;
	pthread_mutex_lock(&sets_mu);
	for (size_t i = 0; i < nsets; i++) {
		struct eset *s = sets[i];
		struct ereg **pp, *r;

		if (!s)
			continue;
		pthread_mutex_lock(&s->mu);
		for (pp = &s->regs; (r = *pp);) {
			if (r->a != a) {
				pp = &r->next;
				continue;
			}
			*pp = r->next;
			REAL(epoll_ctl)(s->epfd, EPOLL_CTL_DEL, r->fd, NULL);
			reg_free(r);
		}
		pthread_mutex_unlock(&s->mu);
	}
	pthread_mutex_unlock(&sets_mu);
}

/* close(epfd): its shadow set and registrations go. */
void epoll_set_closing(int epfd)
{
	struct eset *s;

	if (epmark_get(epfd))
		epmark_set(epfd, 0);
	if (!atomic_load_explicit(&any_set, memory_order_relaxed) || epfd < 0)
		return;
	/*
	 * A look without the lock first: libibverbs closes its own fds under
	 * an attachment's lock, which must not wait for sets_mu (taken before
	 * attachments' locks elsewhere). A stale answer is checked below.
	 */
	if (!set_peek(epfd))
		return;
	pthread_mutex_lock(&sets_mu);
	s = (size_t)epfd < nsets ? sets[epfd] : NULL;
	if (s)
		sets[epfd] = NULL;
	pthread_mutex_unlock(&sets_mu);
	if (!s)
		return;
	while (s->regs) {
		struct ereg *r = s->regs;

		s->regs = r->next;
		reg_free(r);
	}
	REAL(close)(s->shadow);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

/* In a forked child: the sets are the parent's view; forgotten. */
void epoll_fork_child(void)
{
	epmark = NULL;
	nepmark = 0;
	sets = NULL;
	nsets = 0;
	atomic_store(&any_set, 0);
	pthread_mutex_init(&sets_mu, NULL);
}

/* Add or merge an event for the program's data d into out[0..*n). */
static void emit(struct epoll_event *out, int *n, int max, uint64_t d, uint32_t ev)
{
	for (int i = 0; i < *n; i++)
		if (out[i].data.u64 == d) {
			out[i].events |= ev;
			return;
		}
	if (*n < max) {
		out[*n].events = ev;
		out[*n].data.u64 = d;
		(*n)++;
	}
}

static int is_reg(struct eset *s, uint64_t d, struct ereg **out)
{
	for (struct ereg *r = s->regs; r; r = r->next)
		if ((uintptr_t)r == (d & ~(uint64_t)3)) {
			*out = r;
			return 1;
		}
	return 0;
}

/* Readiness of r's connection for the program (EPOLLIN, EPOLLOUT). */
static uint32_t ring_ready(struct ereg *r, uint32_t which)
{
	uint32_t ev = 0;

	if ((which & EPOLLIN) && (r->events & EPOLLIN) && att_readable(r->a))
		ev |= EPOLLIN;
	if ((which & EPOLLIN) && (r->events & EPOLLIN) && !ev) {
		pthread_mutex_lock(&r->a->mu);
		if (att_rd_behind(r->a))
			ev |= EPOLLIN;	/* the anchor's bytes first, then these */
		pthread_mutex_unlock(&r->a->mu);
	}
	if ((which & EPOLLOUT) && (r->events & EPOLLOUT) && att_writable(r->a))
		ev |= EPOLLOUT;
	return ev;
}

/*
 * Turn E's raw events into the program's: see the file comment. Returns
 * how many events are in out.
 */
static int translate(struct eset *s, struct epoll_event *raw, int n, struct epoll_event *out, int max)
{
	int m = 0;

	pthread_mutex_lock(&s->mu);
	for (int i = 0; i < n; i++) {
		uint64_t d = raw[i].data.u64;
		struct ereg *r;

		if (d == s->cookie) {
			struct epoll_event sev[64];
			int k = REAL(epoll_wait)(s->shadow, sev, 64, 0);

			for (int j = 0; j < k; j++) {
				uint32_t which = (sev[j].data.u64 & 1) ? EPOLLOUT : EPOLLIN, ev;
				uint64_t v;
				int efd;

				if (!is_reg(s, sev[j].data.u64, &r))
					continue;
				if (sev[j].data.u64 & 2) {
					/* completions: taken; the eventfds now say what is there */
					pthread_mutex_lock(&r->a->mu);
					att_take_events(r->a);
					pthread_mutex_unlock(&r->a->mu);
					ev = r->fired ? 0 : ring_ready(r, EPOLLIN | EPOLLOUT);
					if (ev) {
						emit(out, &m, max, r->data, ev);
						if (r->events & EPOLLONESHOT)
							r->fired = 1;
					}
					continue;
				}
				efd = which == EPOLLIN ? r->a->rd_ev : r->a->wr_ev;
				/* drained first: a signal after the look below is news */
				if (REAL(read)(efd, &v, sizeof(v)) < 0) {
					/* drained already */
				}
				ev = r->fired ? 0 : ring_ready(r, which);
				if (!ev)
					continue;
				/* level: signalled again, reported while there */
				if (!(r->events & EPOLLET))
					att_signal(r->a, which == EPOLLIN, which == EPOLLOUT);
				emit(out, &m, max, r->data, ev);
				if (r->events & EPOLLONESHOT)
					r->fired = 1;
			}
			continue;
		}
		if (is_reg(s, d, &r) && !(d & 1)) {
			uint32_t ev = raw[i].events;

			if (r->a->out != AOUT_TCP)
				ev &= ~(uint32_t)EPOLLOUT;
			if (kernel_events(r) != r->kernel) {
				struct epoll_event k = { .events = kernel_events(r) };

				k.data.u64 = (uintptr_t)r;
				if (REAL(epoll_ctl)(s->epfd, EPOLL_CTL_MOD, r->fd, &k) == 0)
					r->kernel = k.events;
				if (r->kernel & EPOLLOUT)
					ev |= raw[i].events & EPOLLOUT;
			}
			if (r->fired)
				continue;
			if (r->events & EPOLLONESHOT)
				r->fired = 1;
			if (ev)
				emit(out, &m, max, r->data, ev);
			continue;
		}
		emit(out, &m, max, d, raw[i].events);
	}
	/*
	 * A new attachment's channel joins the shadow set; an anchor whose
	 * EPOLLOUT came back (demoted to TCP) asks the kernel again.
	 */
	for (struct ereg *r = s->regs; r; r = r->next) {
		chan_sync(r);
		if (kernel_events(r) != r->kernel) {
			struct epoll_event k = { .events = kernel_events(r) };

			k.data.u64 = (uintptr_t)r;
			if (REAL(epoll_ctl)(s->epfd, EPOLL_CTL_MOD, r->fd, &k) == 0)
				r->kernel = k.events;
		}
	}
	pthread_mutex_unlock(&s->mu);
	return m;
}


/* epoll_wait and friends on a set with a shadow: see the file comment. */
static int wait_set(struct eset *s, struct epoll_event *ev, int max, int timeout,
		    const sigset_t *ss, int pwait)
{
	struct epoll_event raw[64];
	int64_t end = timeout > 0 ? shim_now_ms() + timeout : 0;

	if (max <= 0) {
		errno = EINVAL;
		return -1;
	}
	for (;;) {
		int n, m, t = timeout <= 0 ? timeout : (int)(end - shim_now_ms());

		if (timeout > 0 && t < 0)
			t = 0;
		n = pwait ? REAL(epoll_pwait)(s->epfd, raw, max < 64 ? max : 64, t, ss)
			  : REAL(epoll_wait)(s->epfd, raw, max < 64 ? max : 64, t);
		if (n <= 0)
			return n;
		m = translate(s, raw, n, ev, max);
		if (m > 0 || timeout == 0 || (timeout > 0 && shim_now_ms() >= end))
			return m;
	}
}

static int created(int fd)
{
	if (fd >= 0 && fdt_load(fd) > SLOT_NONE) {
		int err = errno;

		conn_forget(fd);
		errno = err;
	}
	if (fd >= 0)
		epoll_set_closing(fd);	/* a stale shadow of a number reused */
	return fd;
}

/* A registration of a connection not established yet (under no lock: the
 * program's own calls on one socket; a race only keeps it from attaching). */
static void pending(struct conn *c, int epfd, int op, int fd, struct epoll_event *ev)
{
	switch (op) {
	case EPOLL_CTL_ADD:
		if (c->ep_sets++ == 0) {
			c->ep_epfd = epfd;
			c->ep_fd = fd;
			c->ep_ev = *ev;
		}
		/*
		 * A one-shot registration may have fired already: moving it
		 * would arm it again. Such a connection never attaches.
		 */
		if (ev->events & EPOLLONESHOT)
			c->ep_sets = 2;
		break;
	case EPOLL_CTL_MOD:
		if (c->ep_sets == 1 && c->ep_epfd == epfd && c->ep_fd == fd)
			c->ep_ev = *ev;
		if (ev->events & EPOLLONESHOT)
			c->ep_sets = 2;
		break;
	default:
		if (c->ep_sets == 1 && c->ep_epfd == epfd && c->ep_fd == fd)
			c->ep_sets = 0;
		else
			c->ep_sets = 2;	/* lost track: never attach */
	}
}

/* epoll_create, epoll_create1: the kernel's set; its shadow comes later. */
SHIM_EXPORT int epoll_create(int size)
{
	int fd = created(REAL(epoll_create)(size));

	epmark_set(fd, 1);
	return fd;
}

SHIM_EXPORT int epoll_create1(int flags)
{
	int fd = created(REAL(epoll_create1)(flags));

	epmark_set(fd, 1);
	return fd;
}

/*
 * A set of the program's added to another: nested from now on (see the
 * file comment); the channels leave its shadow.
 */
static void set_nested(int fd)
{
	struct eset *s = set_get(fd);

	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	if (!s->nested) {
		s->nested = 1;
		for (struct ereg *r = s->regs; r; r = r->next) {
			pthread_mutex_lock(&r->a->mu);
			if (r->chan_gen && r->a->chan && r->chan_gen == r->a->chan_gen)
				REAL(epoll_ctl)(s->shadow, EPOLL_CTL_DEL, r->a->chan->fd, NULL);
			pthread_mutex_unlock(&r->a->mu);
			r->chan_gen = 0;
			att_ep_nest(r->a, 1);
		}
	}
	pthread_mutex_unlock(&s->mu);
}

/*
 * epoll_ctl: the kernel's, except for attachable connections (see the
 * file comment); one that cannot be registered so is demoted and left to
 * the kernel.
 */
SHIM_EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	struct conn *c = slot_conn(fdt_load(fd));
	struct att *a = c ? conn_att(c) : NULL;
	int rc;

	if (c && !a) {
		/* not established yet: kept, moved to the attachment then */
		rc = REAL(epoll_ctl)(epfd, op, fd, ev);
		if (rc == 0)
			pending(c, epfd, op, fd, ev);
		return rc;
	}
	if (!c && op == EPOLL_CTL_ADD && epmark_get(fd))
		set_nested(fd);
	if (!a && !set_of(epfd))
		return REAL(epoll_ctl)(epfd, op, fd, ev);
	if (a && (op == EPOLL_CTL_DEL || ev)) {
		rc = ctl_att(epfd, op, fd, ev, a);
		if (rc <= 0)
			return rc;
		if (op != EPOLL_CTL_DEL)
			conn_demote(c, SOCKPROTO_R_DISABLED);
	}
	return REAL(epoll_ctl)(epfd, op, fd, ev);
}

/*
 * The connection just became attachable while in one epoll set: its plain
 * registration becomes an attachable one (the same events and data).
 */
void epoll_conn_established(struct conn *c, struct att *a)
{
	int err = errno;

	if (c->ep_sets == 1 && REAL(epoll_ctl)(c->ep_epfd, EPOLL_CTL_DEL, c->ep_fd, NULL) == 0) {
		if (ctl_att(c->ep_epfd, EPOLL_CTL_ADD, c->ep_fd, &c->ep_ev, a) != 0) {
			REAL(epoll_ctl)(c->ep_epfd, EPOLL_CTL_ADD, c->ep_fd, &c->ep_ev);
			pthread_mutex_lock(&a->mu);
			a->disabled = 1;
			pthread_mutex_unlock(&a->mu);
		}
	}
	c->ep_sets = 0;
	errno = err;
}

SHIM_EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	struct eset *s = set_of(epfd);

	if (likely(!s))
		return REAL(epoll_wait)(epfd, ev, max, timeout);
	return wait_set(s, ev, max, timeout, NULL, 0);
}

SHIM_EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout,
			    const sigset_t *ss)
{
	struct eset *s = set_of(epfd);

	if (likely(!s))
		return REAL(epoll_pwait)(epfd, ev, max, timeout, ss);
	return wait_set(s, ev, max, timeout, ss, 1);
}

SHIM_EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max,
			     const struct timespec *ts, const sigset_t *ss)
{
	struct eset *s = set_of(epfd);
	int timeout;

	if (likely(!s))
		return REAL(epoll_pwait2)(epfd, ev, max, ts, ss);
	timeout = ts ? (int)(ts->tv_sec * 1000 + (ts->tv_nsec + 999999) / 1000000) : -1;
	return wait_set(s, ev, max, timeout, ss, 1);
}
