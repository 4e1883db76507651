/*
 * stats.c: the process's counters.
 *
 * Connections are counted by the role they reached, bytes in each
 * connection object (folded into the process's totals when the object is
 * released), and the events that will demote an attached connection by
 * kind. These are this process's own: a forked child starts from zero
 * with its inherited connections counted as such. Later the same counters
 * live in a shared segment rvmad reads (docs/sockets.md, metrics); for now
 * RDMAPLUS_SOCKETS_DEBUG=1 prints them as one line on stderr at exit,
 * from an atexit handler registered when the first connection appears
 * (never at load).
 */
#include "shim.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

struct shim_stats shim_stats;

static int armed;

static void stats_print(void);

/* The first connection: register the summary if asked for (under the lock). */
void stats_arm(void)
{
	const char *v;

	if (armed)
		return;
	armed = 1;
	v = getenv("RDMAPLUS_SOCKETS_DEBUG");
	if (v && *v && strcmp(v, "0") != 0)
		atexit(stats_print);
}

void stats_conn_released(struct conn *c)
{
	stat_add(&shim_stats.rbytes_done, atomic_load(&c->rbytes));
	stat_add(&shim_stats.wbytes_done, atomic_load(&c->wbytes));
}

void stats_fork_child(void)
{
	memset(&shim_stats, 0, sizeof(shim_stats));
}

struct bytes {
	uint64_t r, w;
};

static void add_live(struct conn *c, void *arg)
{
	struct bytes *b = arg;

	b->r += atomic_load(&c->rbytes);
	b->w += atomic_load(&c->wbytes);
}

static uint64_t get(_Atomic uint64_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

static void stats_print(void)
{
	struct shim_stats *s = &shim_stats;
	struct bytes b = { 0, 0 };
	char line[512];
	int err = errno, n;

	conn_foreach_live(add_live, &b);
	b.r += get(&s->rbytes_done);
	b.w += get(&s->wbytes_done);
	n = snprintf(line, sizeof(line),
		"rdmaplus-sockets: pid %d: connections client=%" PRIu64 " server=%" PRIu64
		" listener=%" PRIu64 " adopted=%" PRIu64 " new=%" PRIu64 " inherited=%" PRIu64
		" live=%" PRIu64 " connect_failed=%" PRIu64 "; bytes read=%" PRIu64
		" written=%" PRIu64 "; attached=%" PRIu64 " fd_passed=%" PRIu64
		" fdopen=%" PRIu64 " splice=%" PRIu64 " exec=%" PRIu64 " spawn=%" PRIu64 "\n",
		(int)getpid(), get(&s->created[ROLE_CLIENT]), get(&s->created[ROLE_SERVER]),
		get(&s->created[ROLE_LISTENER]), get(&s->created[ROLE_ADOPTED]),
		get(&s->created[ROLE_NEW]), get(&s->inherited), get(&s->live),
		get(&s->connect_failed), b.r, b.w, get(&s->attached), get(&s->fd_passed),
		get(&s->fdopen), get(&s->splice), get(&s->execs), get(&s->spawns));
	if (n > 0)
		REAL(write)(2, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
	errno = err;
}
