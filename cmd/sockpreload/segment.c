/*
 * segment.c: the process's statistics segment, which rvmad reads
 * (docs/sockets.md, "Statistics").
 *
 * Nothing here runs at load. The process's counters (struct shim_counters)
 * start in a private block; when its first connection registers with
 * rvmad, the broker client (progress.c) asks for the segment: a memfd
 * (close-on-exec, sealed against shrinking and growing, so that rvmad's
 * read-only mapping of it can never fault) holding the header of
 * sockproto.h (struct sockproto_stats, with the counters) and a table of
 * slots, one per attachable connection. The counters move into it, and
 * the memfd goes to rvmad with a STATS record (SCM_RIGHTS); rvmad keeps
 * its own mapping and this process closes its descriptor.
 *
 * Counters are written with relaxed atomics and only grow (live is a
 * gauge). A slot is claimed under seg_mu: its gen is odd while it is
 * filled for a new connection; after that, only the attachment's owner
 * writes it, under the attachment's mutex. A reader never trusts any of
 * it: the process may scribble on its own segment.
 *
 * fork: the child's counters start from zero in its private block, and
 * the parent's segment is replaced in the child by anonymous memory (an
 * attachment of the parent's that the child still points at writes
 * nowhere); the child's first registration makes its own segment.
 */
#include "rdma.h"

#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

#define SEG_SLOTS	4096

_Static_assert(sizeof(struct shim_counters) == sizeof(struct sockproto_stats_counters), "counters");
_Static_assert(offsetof(struct shim_counters, bytes_in) ==
	       offsetof(struct sockproto_stats_counters, bytes_in), "bytes_in");
_Static_assert(offsetof(struct shim_counters, ring_read) ==
	       offsetof(struct sockproto_stats_counters, rdma_in), "rdma_in");
_Static_assert(offsetof(struct shim_counters, rdma_writes) ==
	       offsetof(struct sockproto_stats_counters, rdma_writes), "rdma_writes");
_Static_assert(offsetof(struct shim_counters, spawns) ==
	       offsetof(struct sockproto_stats_counters, spawns), "spawns");
_Static_assert(offsetof(struct shim_counters, demotes) ==
	       offsetof(struct sockproto_stats_counters, demotes), "demotes");
_Static_assert(offsetof(struct shim_counters, fallbacks) ==
	       offsetof(struct sockproto_stats_counters, fallbacks), "fallbacks");
_Static_assert(sizeof(((struct shim_counters *)0)->demotes) / 8 == SOCKPROTO_STATS_REASONS, "reasons");
_Static_assert((int)ROLE_CLIENT == (int)SOCKPROTO_STATS_CLIENT &&
	       (int)ROLE_SERVER == (int)SOCKPROTO_STATS_SERVER &&
	       (int)ROLE_ADOPTED == (int)SOCKPROTO_STATS_ADOPTED && ROLE_NR <= 8, "roles");
_Static_assert(_Alignof(_Atomic uint64_t) == 8 && sizeof(_Atomic uint64_t) == 8, "atomics");

static struct shim_counters priv;
struct shim_counters *_Atomic shim_statsp = &priv;

static pthread_mutex_t seg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sockproto_stats *seg;	/* the mapping, once made */
static size_t seg_len;
static int seg_fd = -1;			/* until rvmad has it */
static int seg_failed;			/* no memfd here: counters stay private */

static struct sockproto_stats_slot *slots(void)
{
	return (struct sockproto_stats_slot *)((char *)seg + SOCKPROTO_STATS_HDR_SIZE);
}

#define STORE(p, v)	__atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define ADD(p, v)	__atomic_fetch_add((p), (v), __ATOMIC_RELAXED)

/* Under seg_mu: the memfd, its mapping, the header; the counters move in. */
static int seg_create(void)
{
	size_t len = SOCKPROTO_STATS_HDR_SIZE + (size_t)SEG_SLOTS * SOCKPROTO_STATS_SLOT_SIZE;
	_Atomic uint64_t *from = (_Atomic uint64_t *)&priv;
	_Atomic uint64_t *to;
	struct sockproto_stats *h;
	int err = errno, fd;
	void *p;

	fd = memfd_create("rdmaplus-sockets-stats", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		goto fail0;
	if (ftruncate(fd, (off_t)len) < 0)
		goto fail;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	if (REAL(fcntl)(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		munmap(p, len);
		goto fail;
	}
	h = p;
	h->magic = SOCKPROTO_STATS_MAGIC;
	h->version = SOCKPROTO_STATS_VERSION;
	h->hdr_size = SOCKPROTO_STATS_HDR_SIZE;
	h->slot_size = SOCKPROTO_STATS_SLOT_SIZE;
	h->nslots = SEG_SLOTS;
	h->pid = (uint32_t)getpid();
	/*
	 * From now on the counters are the segment's; what the private block
	 * counted so far moves over (an increment racing with the move, by a
	 * thread that loaded the old pointer, may stay behind).
	 */
	to = (_Atomic uint64_t *)&h->c;
	atomic_store(&shim_statsp, (struct shim_counters *)&h->c);
	for (size_t i = 0; i < sizeof(priv) / sizeof(*from); i++)
		atomic_fetch_add_explicit(&to[i], atomic_exchange(&from[i], 0), memory_order_relaxed);
	seg = h;
	seg_len = len;
	seg_fd = fd;
	errno = err;
	return 0;
fail:
	REAL(close)(fd);
fail0:
	errno = err;
	return -1;
}

/*
 * STATS with the segment's memfd, through send (the broker client's,
 * under its lock); the segment is made on first use. After it went, this
 * process keeps only its mapping. -1: not sent (try again later).
 */
int stats_segment_send(int (*send)(const void *rec, size_t len, int fd))
{
	struct sockproto_stats_rec r;
	int rc = -1;

	pthread_mutex_lock(&seg_mu);
	if (!seg && !seg_failed && seg_create() < 0)
		seg_failed = 1;
	if (seg && seg_fd >= 0) {
		sockproto_init(&r, SOCKPROTO_STATS, 1);
		sockproto_put32(&r.size, (uint32_t)seg_len);
		rc = send(&r, sizeof(r), seg_fd);
		if (rc == 0) {
			REAL(close)(seg_fd);
			seg_fd = -1;
		}
	}
	pthread_mutex_unlock(&seg_mu);
	return rc;
}

static int slot_state(struct att *a)
{
	if (a->closing)
		return SOCKPROTO_SLOT_CLOSING;
	switch (a->phase) {
	case PHASE_ATTACHING:
		return SOCKPROTO_SLOT_ATTACHING;
	case PHASE_ATTACHED:
		return SOCKPROTO_SLOT_ATTACHED;
	case PHASE_DEMOTING:
		return SOCKPROTO_SLOT_DEMOTING;
	}
	return SOCKPROTO_SLOT_TCP;
}

/* A slot for a newly registered attachment (none when the table is full). */
void stats_slot_open(struct att *a, int fd)
{
	struct sockproto_stats_slot *s = NULL, *t;
	uint32_t used;

	pthread_mutex_lock(&seg_mu);
	if (!seg) {
		pthread_mutex_unlock(&seg_mu);
		return;
	}
	t = slots();
	used = seg->used;
	for (uint32_t i = 0; i < used && !s; i++)
		if (__atomic_load_n(&t[i].state, __ATOMIC_RELAXED) == SOCKPROTO_SLOT_FREE)
			s = &t[i];
	if (!s && used < seg->nslots) {
		s = &t[used];
		STORE(&seg->used, used + 1);
	}
	if (s) {
		__atomic_store_n(&s->gen, s->gen | 1, __ATOMIC_RELAXED);	/* odd: being filled */
		__atomic_thread_fence(__ATOMIC_RELEASE);
		memcpy(&s->tuple, &a->tuple, sizeof(s->tuple));
		STORE(&s->fd, (uint32_t)fd);
		STORE(&s->epoch, a->epoch);
		STORE(&s->last_reason, (uint16_t)0);
		STORE(&s->path, (uint8_t)0);
		STORE(&s->bytes_in, a->rx);
		STORE(&s->bytes_out, a->tx);
		STORE(&s->rdma_in, (uint64_t)0);
		STORE(&s->rdma_out, (uint64_t)0);
		STORE(&s->rdma_writes, (uint64_t)0);
		STORE(&s->state, (uint8_t)SOCKPROTO_SLOT_TCP);
		__atomic_store_n(&s->gen, s->gen + 1, __ATOMIC_RELEASE);	/* even: stable */
		a->slot = s;
	}
	pthread_mutex_unlock(&seg_mu);
}

/* Under mu (or by the attachment's last user): what the slot shows now. */
void stats_slot_sync(struct att *a)
{
	struct sockproto_stats_slot *s = a->slot;

	if (!s)
		return;
	STORE(&s->state, (uint8_t)slot_state(a));
	STORE(&s->path, (uint8_t)(a->out == AOUT_RING || a->in != IN_TCP));
	STORE(&s->epoch, a->epoch);
	STORE(&s->bytes_in, a->rx);
	STORE(&s->bytes_out, a->tx);
}

/* Under rmu (readers change rx only under it): the bytes the program read. */
void stats_slot_rx(struct att *a)
{
	if (a->slot)
		STORE(&a->slot->bytes_in, a->rx);
}

void stats_slot_close(struct att *a)
{
	struct sockproto_stats_slot *s = a->slot;

	if (!s)
		return;
	pthread_mutex_lock(&seg_mu);
	if (seg)	/* else the parent's, in a forked child: memory of no one's */
		STORE(&s->state, (uint8_t)SOCKPROTO_SLOT_FREE);
	a->slot = NULL;
	pthread_mutex_unlock(&seg_mu);
}

/* Under mu: n bytes read from the ring (rd) or written into the peer's. */
void stats_ring(struct att *a, int rd, uint64_t n)
{
	stat_add(rd ? &shim_stats.ring_read : &shim_stats.ring_written, n);
	if (a->slot) {
		ADD(rd ? &a->slot->rdma_in : &a->slot->rdma_out, n);
		stats_slot_sync(a);
	}
}

/* Under mu: one RDMA WRITE of data posted. */
void stats_rdma_write(struct att *a)
{
	stat_add(&shim_stats.rdma_writes, 1);
	if (a->slot)
		ADD(&a->slot->rdma_writes, (uint64_t)1);
}

static unsigned reason_index(int reason)
{
	return reason > 0 && reason < SOCKPROTO_STATS_REASONS ? (unsigned)reason : 0;
}

/* Under mu: a demote, this side's or its answer to the peer's. */
void stats_demote(struct att *a, int reason)
{
	stat_add(&shim_stats.demoted, 1);
	stat_add(&shim_stats.demotes[reason_index(reason)], 1);
	if (a->slot) {
		STORE(&a->slot->last_reason, (uint16_t)reason_index(reason));
		stats_slot_sync(a);
	}
}

/* Under mu: an attachable connection stays on TCP: its attachment was refused or failed. */
void stats_fallback(struct att *a, int reason)
{
	stat_add(&shim_stats.fallbacks[reason_index(reason)], 1);
	if (a && a->slot) {
		STORE(&a->slot->last_reason, (uint16_t)reason_index(reason));
		stats_slot_sync(a);
	}
}

/* In a forked child (the fork handler): counters from zero, the parent's segment gone. */
void stats_fork_child(void)
{
	atomic_store(&shim_statsp, &priv);
	memset(&priv, 0, sizeof(priv));
	if (seg) {
		/* the parent's: anonymous memory in its place, so nothing of ours reaches it */
		if (mmap(seg, seg_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
			 -1, 0) == MAP_FAILED)
			munmap(seg, seg_len);
		seg = NULL;
	}
	if (seg_fd >= 0)
		REAL(close)(seg_fd);
	seg_fd = -1;
	seg_failed = 0;
	pthread_mutex_init(&seg_mu, NULL);
}
