/*
 * stats.c: the process's counters.
 *
 * Connections are counted by the role they reached, bytes by path and
 * direction, and the events that demote an attached connection by kind.
 * These are this process's own: a forked child starts from zero with its
 * inherited connections counted as such. They live in the statistics
 * segment rvmad reads once the process registered a connection
 * (segment.c); RDMAPLUS_SOCKETS_DEBUG=1 also prints them as one line on
 * stderr at exit, from an atexit handler registered when the first
 * connection appears (never at load).
 */
#include "shim.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int armed;

static void stats_print(void);

/* RDMAPLUS_SOCKETS_DEBUG=2: a crash's stack on stderr, then the default action. */
static void crash(int sig)
{
	void *pcs[32];
	int n = backtrace(pcs, 32);
	Dl_info di;

	for (int i = 0; i < n; i++) {
		char line[160];
		int k;

		if (dladdr(pcs[i], &di) && di.dli_fname)
			k = snprintf(line, sizeof(line), "rdmaplus-sockets: crash %d: %s+%#lx\n", sig,
				     di.dli_fname, (unsigned long)((char *)pcs[i] - (char *)di.dli_fbase));
		else
			k = snprintf(line, sizeof(line), "rdmaplus-sockets: crash %d: %p\n", sig, pcs[i]);
		if (k > 0 && REAL(write)(2, line, (size_t)k) < 0)
			break;
	}
	raise(sig);
}

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
	if (v && atoi(v) >= 2) {
		struct sigaction sa = { .sa_handler = crash, .sa_flags = SA_RESETHAND };

		shim_debug = 2;
		/* debugging only: a crash prints where it happened */
		sigaction(SIGSEGV, &sa, NULL);
		sigaction(SIGBUS, &sa, NULL);
		sigaction(SIGABRT, &sa, NULL);
	}
}

int shim_debug;

/*
 * A debugging line to stderr; none in a sandbox, which may have set
 * RLIMIT_FSIZE to 0 (sshd's pre-authentication child), so that writing
 * to a log file would kill it with SIGXFSZ.
 */
static void debug_write(const char *line, size_t n)
{
	if (shim_sandbox())
		return;
	if (REAL(write)(2, line, n) < 0) {
		/* nowhere to say it */
	}
}

/* RDMAPLUS_SOCKETS_DEBUG=2: one line per attachment event on stderr. */
void shim_trace(const char *fmt, ...)
{
	char line[256];
	struct timespec t;
	va_list ap;
	int n, m, err = errno;

	clock_gettime(CLOCK_MONOTONIC, &t);
	n = snprintf(line, sizeof(line), "rdmaplus-sockets: pid %d: %ld.%06ld: ", (int)getpid(),
		     (long)t.tv_sec, t.tv_nsec / 1000);
	va_start(ap, fmt);
	m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	n = m < 0 ? n : n + m < (int)sizeof(line) - 1 ? n + m : (int)sizeof(line) - 2;
	line[n++] = '\n';
	debug_write(line, (size_t)n);
	errno = err;
}

/* A connection object goes: its bytes are in the process's totals already. */
void stats_conn_released(struct conn *c)
{
	(void)c;
}

static uint64_t get(_Atomic uint64_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

static void stats_print(void)
{
	struct shim_counters *s = &shim_stats;
	char line[512];
	int err = errno, n;

	n = snprintf(line, sizeof(line),
		"rdmaplus-sockets: pid %d: connections client=%" PRIu64 " server=%" PRIu64
		" listener=%" PRIu64 " adopted=%" PRIu64 " new=%" PRIu64 " inherited=%" PRIu64
		" live=%" PRIu64 " connect_failed=%" PRIu64 "; bytes read=%" PRIu64
		" written=%" PRIu64 " ring_read=%" PRIu64 " ring_written=%" PRIu64 " rdma_writes=%" PRIu64
		"; attachable=%" PRIu64 " attached=%" PRIu64 " demoted=%" PRIu64 " fd_passed=%" PRIu64
		" fdopen=%" PRIu64 " splice=%" PRIu64 " exec=%" PRIu64 " spawn=%" PRIu64 "\n",
		(int)getpid(), get(&s->created[ROLE_CLIENT]), get(&s->created[ROLE_SERVER]),
		get(&s->created[ROLE_LISTENER]), get(&s->created[ROLE_ADOPTED]),
		get(&s->created[ROLE_NEW]), get(&s->inherited), get(&s->live),
		get(&s->connect_failed), get(&s->bytes_in), get(&s->bytes_out), get(&s->ring_read), get(&s->ring_written), get(&s->rdma_writes),
		get(&s->attachable), get(&s->attached), get(&s->demoted), get(&s->fd_passed),
		get(&s->fdopen), get(&s->splice), get(&s->execs), get(&s->spawns));
	if (n > 0)
		debug_write(line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
	errno = err;
}
