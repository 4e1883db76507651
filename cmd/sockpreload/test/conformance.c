/*
 * conformance: socket behaviour programs rely on, over real TCP, for
 * comparing plain TCP, rsocket and rdmaplus's shim (docs/sockets.md, "The
 * shim"). Every scenario prints one line, "ok NAME" or "FAIL NAME: why";
 * the program exits non-zero if any failed. Every blocking step is bounded
 * (poll timeouts, and an alarm per scenario), so nothing hangs.
 *
 *   conformance list                      print the scenarios' names, one a line
 *   conformance loopback                  a server forked on 127.0.0.1, the client
 *   conformance server [-p PORT] [ADDR]   serve until a client is done (default
 *                                         0.0.0.0, port 7471)
 *   conformance client [-p PORT] [-r PORT] ADDR
 *                                         run every scenario against ADDR; -r is
 *                                         a port nothing listens on (PORT + 1)
 *   -s SEED   the pattern's seed (default 1); -t NAME  only scenarios whose
 *             name contains NAME; -x NAME  only the scenario named NAME
 *   server -T  each connection in a thread of the server's own process (a
 *             process only for the mode that dies by SIGKILL), so that a
 *             transport that does not follow fork still serves it
 *   server -P  portable calls only, for rsocket's preload (rdma-core 44):
 *             the listener made with socket(SOCK_STREAM) (a type with
 *             SOCK_CLOEXEC or SOCK_NONBLOCK stays on TCP there) and made
 *             nonblocking with fcntl; accept, not accept4 (not intercepted
 *             there: ENOTSOCK), the connection made nonblocking with fcntl
 *             and close-on-exec when the transport allows it (rsocket's
 *             fcntl knows only F_GETFL and F_SETFL); blocking again with
 *             fcntl, not ioctl(FIONBIO)
 *
 * Each connection to the server starts with a header naming what the
 * server does with it (sink, source, echo, ...); every byte either way is
 * a seeded pattern, checked at the receiving end. The server checks
 * accept4 with SOCK_NONBLOCK | SOCK_CLOEXEC on every connection and runs
 * each connection in a process of its own (or a thread: -T).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MAGIC		0x52534346u	/* "FCSR" */
#define TIMEOUT_MS	10000		/* one blocking step */
#define SCENARIO_S	60		/* one scenario, whole */

/* What the server does with a connection. */
enum mode {
	M_SINK = 1,	/* read to EOF, check, answer {received, first bad offset} */
	M_SINK_LATE,	/* as M_SINK, after 500 ms (the client's writes fill up) */
	M_SOURCE,	/* write len bytes, shut down writing, drain to EOF */
	M_SOURCE_SLOW,	/* as M_SOURCE, in small pieces with pauses */
	M_ECHO,		/* send back what arrives; at EOF shut down writing */
	M_CLOSE,	/* close at once */
	M_KILL,		/* write len bytes, then die by SIGKILL */
	M_DONE,		/* the client is done: the server exits */
	M_UNREAD,	/* echo len bytes, then close with more unread (a reset) */
	M_LINGER0,	/* echo len bytes, then close with SO_LINGER {1, 0} (a reset) */
};

struct hdr {
	uint32_t magic, mode;
	uint64_t seed, len;
};

struct verdict {
	uint64_t received, bad;	/* bad: first wrong offset, or ~0 */
};

static const char *host = "127.0.0.1";
static int port = 7471, refused_port;
static uint64_t base_seed = 1;
static const char *only;
static const char *cur;		/* the running scenario */
static __thread char why[512];
static const char *exact;	/* -x */
static int threads, plain_listener;	/* server -T, -P */
static int failures;

/* ---- the pattern ---- */

static uint8_t pat(uint64_t seed, uint64_t i)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + (i >> 3) + 1;

	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return (uint8_t)(x >> ((i & 7) * 8));
}

static void fill(uint8_t *b, uint64_t seed, uint64_t off, size_t n)
{
	for (size_t i = 0; i < n; i++)
		b[i] = pat(seed, off + i);
}

/* The first offset in [off, off + n) that differs, or -1. */
static int64_t mismatch(const uint8_t *b, uint64_t seed, uint64_t off, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != pat(seed, off + i))
			return (int64_t)(off + i);
	return -1;
}

/* ---- results ---- */

__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return -1;
}

#define FAILE(what) fail("%s: %s", what, strerror(errno))

static void on_alarm(int sig)
{
	char line[256];
	int n = snprintf(line, sizeof(line), "FAIL %s: timed out after %d s\n",
			 cur ? cur : "?", SCENARIO_S);

	(void)sig;
	if (n > 0)
		(void)!write(1, line, (size_t)n);
	_exit(1);
}

static void report(const char *name, int r)
{
	if (r == 0) {
		printf("ok %s\n", name);
	} else {
		printf("FAIL %s: %s\n", name, why);
		failures++;
	}
	fflush(stdout);
}

/* ---- helpers ---- */

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* poll one fd; its revents, 0 on timeout, -1 on error. */
static int wait_fd(int fd, short events, int ms)
{
	struct pollfd p = { .fd = fd, .events = events };
	uint64_t end = now_ms() + (uint64_t)ms;

	for (;;) {
		int left = (int)(end - now_ms()), r;

		if (left < 0)
			left = 0;
		r = poll(&p, 1, left);
		if (r > 0)
			return p.revents;
		if (r == 0)
			return 0;
		if (errno != EINTR)
			return -1;
	}
}

static int set_nonblock(int fd, int on)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0)
		return -1;
	return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

/* Write everything, blocking or not (EAGAIN waits for POLLOUT). */
static int write_all(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;

	while (n > 0) {
		ssize_t r = write(fd, p, n);

		if (r > 0) {
			p += r;
			n -= (size_t)r;
		} else if (r < 0 && errno == EINTR) {
			continue;
		} else if (r < 0 && errno == EAGAIN) {
			if (wait_fd(fd, POLLOUT, TIMEOUT_MS) <= 0)
				return fail("write: no room for %d s", TIMEOUT_MS / 1000);
		} else {
			return FAILE("write");
		}
	}
	return 0;
}

/* Read up to n bytes, stopping early only at EOF: the count, or -1. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
	uint8_t *p = buf;
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, p + got, n - got);

		if (r > 0) {
			got += (size_t)r;
		} else if (r == 0) {
			break;
		} else if (errno == EINTR) {
			continue;
		} else if (errno == EAGAIN) {
			if (wait_fd(fd, POLLIN, TIMEOUT_MS) <= 0)
				return fail("read: nothing for %d s", TIMEOUT_MS / 1000);
		} else {
			return FAILE("read");
		}
	}
	return (ssize_t)got;
}

static int send_pattern(int fd, uint64_t seed, uint64_t off, uint64_t n)
{
	static __thread uint8_t buf[65536];

	while (n > 0) {
		size_t k = n < sizeof(buf) ? (size_t)n : sizeof(buf);

		fill(buf, seed, off, k);
		if (write_all(fd, buf, k) < 0)
			return -1;
		off += k;
		n -= k;
	}
	return 0;
}

/* Read exactly n bytes of the pattern from off; then, if eof, EOF. */
static int recv_pattern(int fd, uint64_t seed, uint64_t off, uint64_t n, int eof)
{
	static __thread uint8_t buf[65536];
	int64_t bad;
	ssize_t r;

	while (n > 0) {
		size_t k = n < sizeof(buf) ? (size_t)n : sizeof(buf);

		r = read_full(fd, buf, k);
		if (r < 0)
			return -1;
		if ((size_t)r < k)
			return fail("EOF after %" PRIu64 " bytes, %" PRIu64 " missing",
				    off + (uint64_t)r, n - (uint64_t)r);
		if ((bad = mismatch(buf, seed, off, k)) >= 0)
			return fail("byte %" PRId64 " differs", bad);
		off += k;
		n -= k;
	}
	if (eof) {
		uint8_t c;

		r = read_full(fd, &c, 1);
		if (r < 0)
			return -1;
		if (r != 0)
			return fail("a byte after the end of the stream");
	}
	return 0;
}

static int resolve(const char *h, int p, struct sockaddr_storage *ss, socklen_t *len)
{
	struct addrinfo hints = { .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
				  .ai_socktype = SOCK_STREAM }, *ai;
	char ps[16];
	int r;

	snprintf(ps, sizeof(ps), "%d", p);
	if ((r = getaddrinfo(h, ps, &hints, &ai)) != 0)
		return fail("address %s: %s", h, gai_strerror(r));
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	*len = ai->ai_addrlen;
	freeaddrinfo(ai);
	return 0;
}

/* A connection to the server doing mode: blocking, the header sent. */
static int dial_port(int p, int type_flags)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd;

	if (resolve(host, p, &ss, &len) < 0)
		return -1;
	fd = socket(ss.ss_family, SOCK_STREAM | type_flags, 0);
	if (fd < 0)
		return FAILE("socket");
	if (connect(fd, (struct sockaddr *)&ss, len) < 0 && errno != EINPROGRESS) {
		FAILE("connect");
		close(fd);
		return -1;
	}
	return fd;
}

static int send_hdr(int fd, enum mode m, uint64_t seed, uint64_t len)
{
	struct hdr h = { MAGIC, m, seed, len };

	return write_all(fd, &h, sizeof(h));
}

static int dial(enum mode m, uint64_t seed, uint64_t len)
{
	int fd = dial_port(port, 0);

	if (fd < 0)
		return -1;
	if (send_hdr(fd, m, seed, len) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* After the client's stream of len bytes: shut down, read the verdict. */
static int verdict(int fd, uint64_t len)
{
	struct verdict v;

	if (shutdown(fd, SHUT_WR) < 0)
		return FAILE("shutdown");
	if (read_full(fd, &v, sizeof(v)) != sizeof(v))
		return why[0] ? -1 : fail("no verdict from the server");
	if (v.bad != ~0ull)
		return fail("the server found byte %" PRIu64 " wrong", v.bad);
	if (v.received != len)
		return fail("the server received %" PRIu64 " bytes, want %" PRIu64, v.received, len);
	return 0;
}

/* ---- the server ---- */

static int handle(int fd, const struct hdr *h)
{
	static __thread uint8_t buf[65536];
	struct verdict v = { 0, ~0ull };
	uint64_t off = 0;
	ssize_t r;

	switch (h->mode) {
	case M_SINK_LATE:
		usleep(500000);
		/* fall through */
	case M_SINK:
		while ((r = read(fd, buf, sizeof(buf))) != 0) {
			int64_t bad;

			if (r < 0) {
				if (errno == EINTR)
					continue;
				return FAILE("sink: read");
			}
			if (v.bad == ~0ull && (bad = mismatch(buf, h->seed, off, (size_t)r)) >= 0)
				v.bad = (uint64_t)bad;
			off += (uint64_t)r;
		}
		v.received = off;
		if (write_all(fd, &v, sizeof(v)) < 0)
			return -1;
		if (v.bad != ~0ull)
			return fail("sink: byte %" PRIu64 " differs", v.bad);
		if (v.received != h->len)
			return fail("sink: %" PRIu64 " bytes, want %" PRIu64, v.received, h->len);
		return 0;
	case M_SOURCE:
	case M_SOURCE_SLOW:
		while (off < h->len) {
			size_t k = sizeof(buf);

			if (h->mode == M_SOURCE_SLOW) {
				k = 1 + (size_t)(pat(h->seed ^ 0x55, off) * 13 % 3000);
				if ((off / 1000) % 16 == 0)
					usleep(2000);
			}
			if (k > h->len - off)
				k = (size_t)(h->len - off);
			fill(buf, h->seed, off, k);
			if (write_all(fd, buf, k) < 0)
				return 0;	/* the client left early: its own check fails */
			off += k;
		}
		shutdown(fd, SHUT_WR);
		while (read(fd, buf, sizeof(buf)) > 0)
			;
		return 0;
	case M_ECHO:
		while ((r = read(fd, buf, sizeof(buf))) != 0) {
			if (r < 0) {
				if (errno == EINTR)
					continue;
				return 0;	/* reset by the client: its own check fails */
			}
			if (write_all(fd, buf, (size_t)r) < 0)
				return 0;
		}
		shutdown(fd, SHUT_WR);
		return 0;
	case M_CLOSE:
		return 0;
	case M_UNREAD:
	case M_LINGER0:
		if (h->len > sizeof(buf))
			return fail("unread: %" PRIu64 " bytes to echo, at most %zu", h->len, sizeof(buf));
		if (read_full(fd, buf, (size_t)h->len) != (ssize_t)h->len ||
		    write_all(fd, buf, (size_t)h->len) < 0)
			return fail("unread: the echo failed");
		if (h->mode == M_LINGER0) {
			struct linger lg = { 1, 0 };

			if (setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) < 0)
				return FAILE("setsockopt SO_LINGER");
		} else if (wait_fd(fd, POLLIN, TIMEOUT_MS) <= 0) {
			return fail("unread: nothing more came");
		}
		return 0;	/* the caller closes: TCP resets */
	case M_KILL:
		send_pattern(fd, h->seed, 0, h->len);
		usleep(200000);
		raise(SIGKILL);
		return fail("alive after SIGKILL");
	}
	return fail("unknown mode %u", h->mode);
}

/* accept4 with SOCK_NONBLOCK | SOCK_CLOEXEC, or its portable form (-P). */
static int accept_conn(int l)
{
	int fd;

	if (!plain_listener)
		return accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	fd = accept(l, NULL, NULL);
	if (fd >= 0) {
		(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
		if (set_nonblock(fd, 1) < 0) {
			int e = errno;

			close(fd);
			errno = e;
			return -1;
		}
	}
	return fd;
}

struct child {
	pid_t pid;
	uint32_t mode;
};

/* -T: a connection handled by a thread; failures counted in thread_bad. */
struct job {
	int fd;
	struct hdr h;
};

static _Atomic int thread_bad;

static void *handle_thread(void *arg)
{
	struct job *j = arg;

	if (handle(j->fd, &j->h) < 0) {
		printf("FAIL server/mode-%u: %s\n", j->h.mode, why);
		fflush(stdout);
		thread_bad++;
	}
	close(j->fd);
	free(j);
	return NULL;
}

static void join_all(pthread_t *tids, int *n)
{
	while (*n > 0)
		pthread_join(tids[--*n], NULL);
}

static int reap(struct child *kids, int *n, int block)
{
	int bad = 0;

	for (int i = 0; i < *n;) {
		int st;
		pid_t r = waitpid(kids[i].pid, &st, block ? 0 : WNOHANG);

		if (r == 0) {
			i++;
			continue;
		}
		if (r < 0 ||
		    (kids[i].mode == M_KILL ? !(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
					    : !(WIFEXITED(st) && WEXITSTATUS(st) == 0))) {
			printf("FAIL server/mode-%u: handler status %#x\n", kids[i].mode, r < 0 ? -1 : st);
			fflush(stdout);
			bad++;
		}
		kids[i] = kids[--*n];
	}
	return bad;
}

/*
 * Serve until M_DONE. portfd, when not -1, gets the port (a pipe from the
 * loopback mode's parent).
 */
static int serve(const char *addr, int portfd)
{
	struct sockaddr_storage ss;
	struct child kids[64];
	pthread_t tids[256];
	int ntids = 0;
	int nkids = 0, bad = 0, conns = 0, flagbad = 0, one = 1, l;
	socklen_t len;

	signal(SIGPIPE, SIG_IGN);
	if (resolve(addr, port, &ss, &len) < 0)
		goto fatal;
	l = socket(ss.ss_family, SOCK_STREAM | (plain_listener ? 0 : SOCK_CLOEXEC), 0);
	if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(l, (struct sockaddr *)&ss, len) < 0 || listen(l, 64) < 0 ||
	    set_nonblock(l, 1) < 0) {
		FAILE("listen");
		goto fatal;
	}
	len = sizeof(ss);
	getsockname(l, (struct sockaddr *)&ss, &len);
	port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
					      : ((struct sockaddr_in *)&ss)->sin_port);
	if (plain_listener)
		(void)fcntl(l, F_SETFD, FD_CLOEXEC);	/* best effort: rsocket refuses it */
	if (accept_conn(l) >= 0 || errno != EAGAIN) {
		fail("accept4 on an idle nonblocking listener: %s, want EAGAIN", strerror(errno));
		goto fatal;
	}
	if (portfd >= 0) {
		(void)!write(portfd, &port, sizeof(port));
		close(portfd);
	}
	printf("listening on %s port %d\n", addr, port);
	fflush(stdout);
	for (;;) {
		struct hdr h;
		pid_t pid;
		int fd, fl, fdfl;

		bad += reap(kids, &nkids, 0);
		if (wait_fd(l, POLLIN, 1000) <= 0)
			continue;
		fd = accept_conn(l);
		if (fd < 0) {
			if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)
				continue;
			FAILE("accept4");
			goto fatal;
		}
		conns++;
		fl = fcntl(fd, F_GETFL);
		fdfl = fcntl(fd, F_GETFD);
		if (fl < 0 || !(fl & O_NONBLOCK) || fdfl < 0 || (!plain_listener && !(fdfl & FD_CLOEXEC))) {
			if (!flagbad++)
				printf("FAIL server/accept4: flags %#x fd flags %#x, want O_NONBLOCK and FD_CLOEXEC\n",
				       fl, fdfl);
		}
		/* Blocking from here on (ioctl FIONBIO, as nginx does). */
		if ((plain_listener ? set_nonblock(fd, 0) : ioctl(fd, FIONBIO, &(int){ 0 })) < 0 ||
		    read_full(fd, &h, sizeof(h)) != sizeof(h) || h.magic != MAGIC) {
			printf("FAIL server/header: %s\n", why[0] ? why : "bad magic");
			fflush(stdout);
			why[0] = 0;
			bad++;
			close(fd);
			continue;
		}
		if (h.mode == M_DONE) {
			close(fd);
			break;
		}
		if (threads && h.mode != M_KILL) {
			struct job *j = malloc(sizeof(*j));

			if (ntids == (int)(sizeof(tids) / sizeof(tids[0])))
				join_all(tids, &ntids);
			if (!j) {
				FAILE("malloc");
				goto fatal;
			}
			j->fd = fd;
			j->h = h;
			if ((errno = pthread_create(&tids[ntids], NULL, handle_thread, j)) != 0) {
				FAILE("pthread_create");
				goto fatal;
			}
			ntids++;
			continue;
		}
		if (nkids == (int)(sizeof(kids) / sizeof(kids[0])))
			bad += reap(kids, &nkids, 1);
		fflush(stdout);
		pid = fork();
		if (pid == 0) {
			close(l);
			alarm(SCENARIO_S);
			cur = "server";
			if (handle(fd, &h) < 0) {
				printf("FAIL server/mode-%u: %s\n", h.mode, why);
				fflush(stdout);
				_exit(1);
			}
			_exit(0);
		}
		if (pid < 0) {
			FAILE("fork");
			goto fatal;
		}
		kids[nkids].pid = pid;
		kids[nkids++].mode = h.mode;
		close(fd);
	}
	bad += reap(kids, &nkids, 1);
	join_all(tids, &ntids);
	bad += thread_bad;
	close(l);
	if (!flagbad)
		printf("ok server/accept4 (%d connections nonblocking and close-on-exec)\n", conns);
	if (!bad)
		printf("ok server/handlers (%d connections)\n", conns);
	fflush(stdout);
	return bad || flagbad ? 1 : 0;
fatal:
	printf("FAIL server: %s\n", why);
	fflush(stdout);
	return 1;
}

/* ---- client scenarios ---- */

static uint64_t seed_of(int i)
{
	return base_seed * 1000 + (uint64_t)i;
}

static int s_connect_blocking(uint64_t seed)
{
	uint64_t n = 1 << 20;
	int fd = dial(M_SINK, seed, n), r;

	if (fd < 0)
		return -1;
	r = send_pattern(fd, seed, 0, n);
	if (r == 0)
		r = verdict(fd, n);
	close(fd);
	return r;
}

static int s_connect_nonblocking(uint64_t seed)
{
	uint64_t n = 256 << 10;
	int fd = dial_port(port, SOCK_NONBLOCK), err = 0, r, ev;
	socklen_t l = sizeof(err);

	if (fd < 0)
		return -1;
	ev = wait_fd(fd, POLLOUT, TIMEOUT_MS);
	if (ev <= 0) {
		close(fd);
		return fail("not writable after connect");
	}
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0 || err != 0) {
		close(fd);
		return fail("SO_ERROR %s", strerror(err));
	}
	r = send_hdr(fd, M_SOURCE, seed, n);
	if (r == 0)
		r = recv_pattern(fd, seed, 0, n, 1);
	close(fd);
	return r;
}

static int s_connect_refused(uint64_t seed)
{
	struct sockaddr_storage ss;
	int fd, err = 0, r;
	socklen_t len, l = sizeof(err);

	(void)seed;
	if (resolve(host, refused_port, &ss, &len) < 0)
		return -1;
	fd = socket(ss.ss_family, SOCK_STREAM, 0);
	r = connect(fd, (struct sockaddr *)&ss, len);
	err = errno;
	close(fd);
	if (r == 0 || err != ECONNREFUSED)
		return fail("blocking connect to port %d: %s, want ECONNREFUSED",
			    refused_port, r == 0 ? "connected" : strerror(err));
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
	r = connect(fd, (struct sockaddr *)&ss, len);
	if (r == 0 || (errno != EINPROGRESS && errno != ECONNREFUSED)) {
		err = errno;
		close(fd);
		return fail("nonblocking connect: %s, want EINPROGRESS", r == 0 ? "connected" : strerror(err));
	}
	if (errno == EINPROGRESS) {
		if (wait_fd(fd, POLLOUT, TIMEOUT_MS) <= 0) {
			close(fd);
			return fail("nonblocking connect: no answer");
		}
		err = 0;
		getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
		if (err != ECONNREFUSED) {
			close(fd);
			return fail("nonblocking connect: SO_ERROR %s, want ECONNREFUSED", strerror(err));
		}
	}
	close(fd);
	return 0;
}

/* A listener of our own on the loopback, and a connection to it. */
static int s_accept4(uint64_t seed)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int l, c = -1, a = -1, b = -1, c2 = -1, fl, fdfl, r = -1;
	uint8_t buf[100];

	l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (l < 0 || bind(l, (struct sockaddr *)&sa, len) < 0 || listen(l, 4) < 0 ||
	    getsockname(l, (struct sockaddr *)&sa, &len) < 0)
		return FAILE("listen");
	if (accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC) >= 0 || errno != EAGAIN) {
		fail("accept4 with nothing pending: %s, want EAGAIN", strerror(errno));
		goto out;
	}
	c = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(c, (struct sockaddr *)&sa, len) < 0) {
		FAILE("connect");
		goto out;
	}
	if (wait_fd(l, POLLIN, TIMEOUT_MS) <= 0) {
		fail("listener not readable");
		goto out;
	}
	a = accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	fl = fcntl(a, F_GETFL);
	fdfl = fcntl(a, F_GETFD);
	if (a < 0 || fl < 0 || !(fl & O_NONBLOCK) || fdfl < 0 || !(fdfl & FD_CLOEXEC)) {
		fail("accept4: fd %d flags %#x fd flags %#x", a, fl, fdfl);
		goto out;
	}
	if (read(a, buf, sizeof(buf)) != -1 || errno != EAGAIN) {
		fail("read of an empty accepted socket: want EAGAIN");
		goto out;
	}
	fill(buf, seed, 0, sizeof(buf));
	if (write_all(c, buf, sizeof(buf)) < 0 || recv_pattern(a, seed, 0, sizeof(buf), 0) < 0)
		goto out;
	/* accept: blocking and inheritable whatever the listener is. */
	c2 = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(c2, (struct sockaddr *)&sa, len) < 0 || wait_fd(l, POLLIN, TIMEOUT_MS) <= 0) {
		FAILE("second connect");
		goto out;
	}
	b = accept(l, NULL, NULL);
	fl = fcntl(b, F_GETFL);
	fdfl = fcntl(b, F_GETFD);
	if (b < 0 || fl < 0 || (fl & O_NONBLOCK) || fdfl < 0 || (fdfl & FD_CLOEXEC)) {
		fail("accept: fd %d flags %#x fd flags %#x, want neither", b, fl, fdfl);
		goto out;
	}
	r = 0;
out:
	close(l);
	close(c);
	close(a);
	close(b);
	close(c2);
	return r;
}

static int s_partial_read(uint64_t seed)
{
	uint64_t n = 200 << 10, off = 0;
	int fd = dial(M_SOURCE_SLOW, seed, n), reads = 0, shorts = 0, r = 0;
	uint8_t buf[8192];

	if (fd < 0)
		return -1;
	while (off < n) {
		size_t ask = 1 + (size_t)(pat(seed, off) * 31 % sizeof(buf));
		ssize_t k = read(fd, buf, ask);
		int64_t bad;

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			r = k == 0 ? fail("EOF at %" PRIu64, off) : FAILE("read");
			break;
		}
		reads++;
		shorts += (size_t)k < ask;
		if ((bad = mismatch(buf, seed, off, (size_t)k)) >= 0) {
			r = fail("byte %" PRId64 " differs", bad);
			break;
		}
		off += (uint64_t)k;
	}
	if (r == 0 && (r = recv_pattern(fd, seed, n, 0, 1)) == 0 && shorts == 0)
		r = fail("no partial read in %d reads", reads);
	close(fd);
	return r;
}

static int s_partial_write(uint64_t seed)
{
	uint64_t n = 4 << 20, off = 0;
	int fd = dial(M_SINK_LATE, seed, n), partial = 0, r = 0;
	static uint8_t buf[1 << 20];

	if (fd < 0)
		return -1;
	set_nonblock(fd, 1);
	while (off < n) {
		size_t k = n - off < sizeof(buf) ? (size_t)(n - off) : sizeof(buf);
		ssize_t w;

		fill(buf, seed, off, k);
		w = write(fd, buf, k);
		if (w < 0 && errno == EAGAIN) {
			partial++;
			if (wait_fd(fd, POLLOUT, TIMEOUT_MS) <= 0) {
				r = fail("no room for %d s", TIMEOUT_MS / 1000);
				break;
			}
			continue;
		}
		if (w <= 0) {
			r = FAILE("write");
			break;
		}
		partial += (size_t)w < k;
		off += (uint64_t)w;
	}
	set_nonblock(fd, 0);
	if (r == 0 && (r = verdict(fd, n)) == 0 && partial == 0)
		r = fail("neither a short write nor EAGAIN while the peer did not read");
	close(fd);
	return r;
}

static int s_msg_peek(uint64_t seed)
{
	int fd = dial(M_SOURCE, seed, 4096), r = 0;
	uint8_t a[100], b[100];
	ssize_t k, k2;

	if (fd < 0)
		return -1;
	if (wait_fd(fd, POLLIN, TIMEOUT_MS) <= 0)
		r = fail("nothing to read");
	else if ((k = recv(fd, a, sizeof(a), MSG_PEEK)) <= 0)
		r = FAILE("recv MSG_PEEK");
	else if ((k2 = recv(fd, b, (size_t)k, 0)) != k || memcmp(a, b, (size_t)k) != 0)
		r = fail("recv after MSG_PEEK: %zd bytes, not the %zd peeked", k2, k);
	else if (mismatch(b, seed, 0, (size_t)k) >= 0)
		r = fail("peeked bytes differ");
	else
		r = recv_pattern(fd, seed, (uint64_t)k, 4096 - (uint64_t)k, 1);
	close(fd);
	return r;
}

static int s_msg_dontwait(uint64_t seed)
{
	int fd = dial(M_ECHO, seed, 0), r = 0;
	uint8_t buf[100];
	size_t got = 0;

	if (fd < 0)
		return -1;
	if (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) != -1 || errno != EAGAIN) {
		close(fd);
		return fail("recv MSG_DONTWAIT with nothing there: want EAGAIN");
	}
	fill(buf, seed, 0, sizeof(buf));
	if (send(fd, buf, sizeof(buf), MSG_DONTWAIT) != sizeof(buf)) {
		close(fd);
		return FAILE("send MSG_DONTWAIT");
	}
	memset(buf, 0, sizeof(buf));
	while (got < sizeof(buf) && r == 0) {
		ssize_t k;

		if (wait_fd(fd, POLLIN, TIMEOUT_MS) <= 0) {
			r = fail("echo did not come back");
			break;
		}
		k = recv(fd, buf + got, sizeof(buf) - got, MSG_DONTWAIT);
		if (k > 0)
			got += (size_t)k;
		else if (k == 0 || errno != EAGAIN)
			r = fail("recv MSG_DONTWAIT: %zd %s", k, strerror(errno));
	}
	if (r == 0 && mismatch(buf, seed, 0, sizeof(buf)) >= 0)
		r = fail("echoed bytes differ");
	if (r == 0 && (r = shutdown(fd, SHUT_WR)) == 0)
		r = recv_pattern(fd, seed, 0, 0, 1);
	close(fd);
	return r;
}

static int s_msg_waitall(uint64_t seed)
{
	static __thread uint8_t buf[65536];
	int fd = dial(M_SOURCE_SLOW, seed, sizeof(buf)), r = 0;
	ssize_t k;

	if (fd < 0)
		return -1;
	k = recv(fd, buf, sizeof(buf), MSG_WAITALL);
	if (k != (ssize_t)sizeof(buf))
		r = fail("recv MSG_WAITALL returned %zd of %zu", k, sizeof(buf));
	else if (mismatch(buf, seed, 0, sizeof(buf)) >= 0)
		r = fail("bytes differ");
	else
		r = recv_pattern(fd, seed, sizeof(buf), 0, 1);
	close(fd);
	return r;
}

/*
 * A server closing with bytes it never read (close_unread), or with
 * SO_LINGER {1, 0} (linger0), resets the connection: after an echo (and a
 * pause in which the connection may attach), the client's read fails with
 * ECONNRESET, never an end of file.
 */
static int reset_after(enum mode m, uint64_t seed)
{
	uint8_t buf[4096], more[1024];
	int fd = dial(m, seed, sizeof(buf)), r = -1;
	ssize_t k;

	if (fd < 0)
		return -1;
	fill(buf, seed, 0, sizeof(buf));
	if (write_all(fd, buf, sizeof(buf)) < 0 || read_full(fd, buf, sizeof(buf)) != sizeof(buf))
		goto out;
	if (mismatch(buf, seed, 0, sizeof(buf)) >= 0) {
		fail("echoed bytes differ");
		goto out;
	}
	usleep(300000);
	fill(more, seed, sizeof(buf), sizeof(more));
	if (m == M_UNREAD && write_all(fd, more, sizeof(more)) < 0)
		goto out;
	for (;;) {
		k = read(fd, more, sizeof(more));
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN) {
			if (wait_fd(fd, POLLIN, TIMEOUT_MS) <= 0) {
				fail("no reset within %d s", TIMEOUT_MS / 1000);
				goto out;
			}
			continue;
		}
		break;
	}
	if (k == -1 && errno == ECONNRESET)
		r = 0;
	else
		fail("read after the peer's reset: %zd %s, want ECONNRESET", k,
		     k < 0 ? strerror(errno) : "(bytes or end of file)");
out:
	close(fd);
	return r;
}

static int s_close_unread(uint64_t seed)
{
	return reset_after(M_UNREAD, seed);
}

static int s_linger0(uint64_t seed)
{
	return reset_after(M_LINGER0, seed);
}

static volatile sig_atomic_t sigpipes;

static void on_sigpipe(int sig)
{
	(void)sig;
	sigpipes++;
}

static int s_sigpipe(uint64_t seed)
{
	static __thread uint8_t buf[65536];
	int fd = dial(M_CLOSE, seed, 0), r = -1, resets = 0;
	uint64_t end = now_ms() + TIMEOUT_MS;
	ssize_t k;

	if (fd < 0)
		return -1;
	fill(buf, seed, 0, sizeof(buf));
	sigpipes = 0;
	signal(SIGPIPE, on_sigpipe);
	for (;;) {
		k = send(fd, buf, sizeof(buf), MSG_NOSIGNAL);
		if (k < 0 && errno == EPIPE)
			break;
		if (k < 0 && errno == ECONNRESET)
			resets++;
		else if (k < 0) {
			FAILE("send MSG_NOSIGNAL");
			goto out;
		}
		if (now_ms() > end) {
			fail("no EPIPE within %d s", TIMEOUT_MS / 1000);
			goto out;
		}
		usleep(10000);
	}
	if (sigpipes) {
		fail("SIGPIPE despite MSG_NOSIGNAL");
		goto out;
	}
	k = write(fd, buf, sizeof(buf));
	if (k != -1 || errno != EPIPE) {
		fail("write after EPIPE: %zd %s, want EPIPE", k, strerror(errno));
		goto out;
	}
	if (sigpipes != 1) {
		fail("write: %d SIGPIPE, want 1", (int)sigpipes);
		goto out;
	}
	r = 0;
out:
	signal(SIGPIPE, SIG_IGN);
	close(fd);
	return r;
}

/* ---- echo pumps: one I/O method at a time ---- */

enum iom { IO_RW, IO_SENDRECV, IO_TOFROM, IO_VEC, IO_MSG };

static void split3(struct iovec *iov, uint8_t *b, size_t n)
{
	size_t a = n / 5, c = n / 3;

	iov[0] = (struct iovec){ b, a };
	iov[1] = (struct iovec){ b + a, c };
	iov[2] = (struct iovec){ b + a + c, n - a - c };
}

static ssize_t io_send(enum iom m, int fd, uint8_t *b, size_t n)
{
	struct iovec iov[3];
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = 3 };

	switch (m) {
	case IO_RW:
		return write(fd, b, n);
	case IO_SENDRECV:
		return send(fd, b, n, MSG_NOSIGNAL);
	case IO_TOFROM:
		return sendto(fd, b, n, MSG_NOSIGNAL, NULL, 0);
	case IO_VEC:
		split3(iov, b, n);
		return writev(fd, iov, 3);
	case IO_MSG:
		split3(iov, b, n);
		return sendmsg(fd, &msg, MSG_NOSIGNAL);
	}
	return -1;
}

static ssize_t io_recv(enum iom m, int fd, uint8_t *b, size_t n)
{
	struct iovec iov[3];
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = 3 };
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	switch (m) {
	case IO_RW:
		return read(fd, b, n);
	case IO_SENDRECV:
		return recv(fd, b, n, 0);
	case IO_TOFROM:
		return recvfrom(fd, b, n, 0, (struct sockaddr *)&ss, &sl);
	case IO_VEC:
		split3(iov, b, n);
		return readv(fd, iov, 3);
	case IO_MSG:
		split3(iov, b, n);
		return recvmsg(fd, &msg, 0);
	}
	return -1;
}

/*
 * n bytes to an echo server and back, nonblocking, both ways at once;
 * then shut down writing and expect the echo's EOF.
 */
static int pump(enum iom m, uint64_t seed, uint64_t n)
{
	static uint8_t out[65536], in[65536];
	uint64_t sent = 0, got = 0;
	int fd = dial(M_ECHO, seed, 0), r = 0, shut = 0;

	if (fd < 0)
		return -1;
	set_nonblock(fd, 1);
	while (r == 0 && (got < n || !shut)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t k;

		if (sent == n && !shut) {
			if (shutdown(fd, SHUT_WR) < 0)
				r = FAILE("shutdown");
			shut = 1;
			continue;
		}
		if (sent < n)
			p.events |= POLLOUT;
		if (poll(&p, 1, TIMEOUT_MS) <= 0) {
			r = fail("stalled at %" PRIu64 " sent, %" PRIu64 " received", sent, got);
			break;
		}
		if ((p.revents & POLLOUT) && sent < n) {
			size_t c = 1 + (size_t)(pat(seed ^ 0x77, sent) * 257 % sizeof(out));

			if (c > n - sent)
				c = (size_t)(n - sent);
			fill(out, seed, sent, c);
			k = io_send(m, fd, out, c);
			if (k > 0)
				sent += (uint64_t)k;
			else if (k < 0 && errno != EAGAIN)
				r = FAILE("send");
		}
		if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
			k = io_recv(m, fd, in, sizeof(in));
			if (k > 0) {
				int64_t bad = mismatch(in, seed, got, (size_t)k);

				if (bad >= 0 || got + (uint64_t)k > n)
					r = fail("byte %" PRId64 " differs", bad >= 0 ? bad : (int64_t)n);
				got += (uint64_t)k;
			} else if (k == 0) {
				if (got < n)
					r = fail("EOF after %" PRIu64 " of %" PRIu64, got, n);
			} else if (errno != EAGAIN) {
				r = FAILE("recv");
			}
		}
	}
	if (r == 0) {
		set_nonblock(fd, 0);
		r = recv_pattern(fd, seed, n, 0, 1);
	}
	close(fd);
	return r;
}

static int s_half_close(uint64_t seed)
{
	int fd = dial(M_ECHO, seed, 0), r;
	ssize_t k;

	if (fd < 0)
		return -1;
	r = send_pattern(fd, seed, 0, 48 << 10);
	if (r == 0 && shutdown(fd, SHUT_WR) < 0)
		r = FAILE("shutdown");
	if (r == 0 && ((k = send(fd, "x", 1, MSG_NOSIGNAL)) != -1 || errno != EPIPE))
		r = fail("send after SHUT_WR: %zd, want EPIPE", k);
	if (r == 0)
		r = recv_pattern(fd, seed, 0, 48 << 10, 1);
	close(fd);
	return r;
}

static int s_rw(uint64_t seed) { return pump(IO_RW, seed, 2 << 20); }
static int s_send_recv(uint64_t seed) { return pump(IO_SENDRECV, seed, 1 << 20); }
static int s_sendto_recvfrom(uint64_t seed) { return pump(IO_TOFROM, seed, 1 << 20); }
static int s_readv_writev(uint64_t seed) { return pump(IO_VEC, seed, 1 << 20); }
static int s_sendmsg_recvmsg(uint64_t seed) { return pump(IO_MSG, seed, 1 << 20); }

/* sendmmsg of four pieces, then recvmmsg until they are all back. */
static int s_mmsg(uint64_t seed)
{
	uint8_t out[4096], in[4096];
	struct iovec oiov[4], iiov[4];
	struct mmsghdr om[4], im[4];
	uint64_t off = 0;
	int fd = dial(M_ECHO, seed, 0), r = 0;

	if (fd < 0)
		return -1;
	for (int round = 0; round < 32 && r == 0; round++) {
		size_t got = 0;
		int k;

		fill(out, seed, off, sizeof(out));
		for (int i = 0; i < 4; i++) {
			oiov[i] = (struct iovec){ out + i * 1024, 1024 };
			om[i] = (struct mmsghdr){ .msg_hdr = { .msg_iov = &oiov[i], .msg_iovlen = 1 } };
		}
		k = sendmmsg(fd, om, 4, 0);
		if (k != 4) {
			r = fail("sendmmsg sent %d of 4", k);
			break;
		}
		for (int i = 0; i < 4; i++)
			if (om[i].msg_len != 1024)
				r = fail("sendmmsg message %d: %u bytes", i, om[i].msg_len);
		while (r == 0 && got < sizeof(in)) {
			size_t left = sizeof(in) - got, per = (left + 3) / 4;
			int nv = 0;

			for (size_t o = 0; o < left && nv < 4; o += per, nv++) {
				iiov[nv] = (struct iovec){ in + got + o, left - o < per ? left - o : per };
				im[nv] = (struct mmsghdr){ .msg_hdr = { .msg_iov = &iiov[nv], .msg_iovlen = 1 } };
			}
			if (wait_fd(fd, POLLIN, TIMEOUT_MS) <= 0) {
				r = fail("echo did not come back");
				break;
			}
			k = recvmmsg(fd, im, (unsigned)nv, MSG_DONTWAIT, NULL);
			if (k < 0) {
				if (errno != EAGAIN)
					r = FAILE("recvmmsg");
				continue;
			}
			if (k == 0 || im[0].msg_len == 0) {
				r = fail("EOF");
				break;
			}
			/* Each message is a piece of the stream, in order. */
			for (int i = 0; i < k; i++) {
				if (iiov[i].iov_base != in + got) {
					r = fail("recvmmsg: a gap before message %d", i);
					break;
				}
				got += im[i].msg_len;
				if (im[i].msg_len < iiov[i].iov_len)
					break;
			}
		}
		if (r == 0 && mismatch(in, seed, off, sizeof(in)) >= 0)
			r = fail("round %d: bytes differ", round);
		off += sizeof(out);
	}
	if (r == 0 && shutdown(fd, SHUT_WR) == 0)
		r = recv_pattern(fd, seed, off, 0, 1);
	close(fd);
	return r;
}

static int s_sendfile(uint64_t seed)
{
	uint64_t n = 1 << 20, done = 0;
	FILE *f = tmpfile();
	off_t off = 0;
	int fd, r = 0;

	if (!f)
		return FAILE("tmpfile");
	for (uint64_t o = 0; o < n; o += 4096) {
		uint8_t b[4096];

		fill(b, seed, o, sizeof(b));
		fwrite(b, 1, sizeof(b), f);
	}
	if (fflush(f) != 0) {
		fclose(f);
		return FAILE("tmpfile write");
	}
	fd = dial(M_SINK, seed, n);
	if (fd < 0) {
		fclose(f);
		return -1;
	}
	while (done < n) {
		ssize_t k = sendfile(fd, fileno(f), &off, (size_t)(n - done));

		if (k <= 0) {
			r = k == 0 ? fail("sendfile: 0") : FAILE("sendfile");
			break;
		}
		done += (uint64_t)k;
	}
	if (r == 0)
		r = verdict(fd, n);
	close(fd);
	fclose(f);
	return r;
}

/* Echo of 1000 bytes: written on one fd, read back on another. */
static int echo_via(int wfd, int rfd, uint64_t seed, uint64_t *off)
{
	uint8_t b[1000];

	fill(b, seed, *off, sizeof(b));
	if (write_all(wfd, b, sizeof(b)) < 0 || recv_pattern(rfd, seed, *off, sizeof(b), 0) < 0)
		return -1;
	*off += sizeof(b);
	return 0;
}

static int cloexec(int fd)
{
	int f = fcntl(fd, F_GETFD);

	return f >= 0 && (f & FD_CLOEXEC);
}

static int s_dup(uint64_t seed)
{
	int fd = dial(M_ECHO, seed, 0), a, b, c, d, r = -1;
	uint64_t off = 0;

	if (fd < 0)
		return -1;
	a = dup(fd);
	b = dup2(fd, 100);
	c = dup3(fd, 101, O_CLOEXEC);
	d = fcntl(fd, F_DUPFD_CLOEXEC, 102);
	if (a < 0 || b != 100 || c != 101 || d < 102) {
		fail("dup %d, dup2 %d, dup3 %d, F_DUPFD_CLOEXEC %d", a, b, c, d);
		goto out;
	}
	if (cloexec(a) || cloexec(b) || !cloexec(c) || !cloexec(d)) {
		fail("close-on-exec: dup %d dup2 %d dup3 %d F_DUPFD_CLOEXEC %d",
		     cloexec(a), cloexec(b), cloexec(c), cloexec(d));
		goto out;
	}
	if (echo_via(fd, a, seed, &off) < 0)
		goto out;
	close(fd);
	fd = -1;
	if (echo_via(b, c, seed, &off) < 0 || echo_via(a, d, seed, &off) < 0)
		goto out;
	close(a);
	close(b);
	a = b = -1;
	if (echo_via(d, c, seed, &off) < 0)
		goto out;
	/* dup2 over a live alias: the connection stays with the others. */
	if (dup2(d, c) != c || echo_via(c, d, seed, &off) < 0)
		goto out;
	if (shutdown(c, SHUT_WR) < 0) {
		FAILE("shutdown");
		goto out;
	}
	r = recv_pattern(d, seed, off, 0, 1);
out:
	close(fd);
	close(a);
	close(b);
	close(c);
	close(d);
	return r;
}

static int s_nonblock_flags(uint64_t seed)
{
	int fd = dial(M_ECHO, seed, 0), on = 1, off = 0, avail = 0, r = -1;
	uint8_t b[1000];
	uint64_t end;

	if (fd < 0)
		return -1;
	if (set_nonblock(fd, 1) < 0 || !(fcntl(fd, F_GETFL) & O_NONBLOCK) ||
	    read(fd, b, sizeof(b)) != -1 || errno != EAGAIN) {
		fail("fcntl O_NONBLOCK: read of nothing did not fail with EAGAIN");
		goto out;
	}
	if (set_nonblock(fd, 0) < 0 || (fcntl(fd, F_GETFL) & O_NONBLOCK)) {
		fail("fcntl: O_NONBLOCK not cleared");
		goto out;
	}
	if (ioctl(fd, FIONBIO, &on) < 0 || !(fcntl(fd, F_GETFL) & O_NONBLOCK) ||
	    recv(fd, b, sizeof(b), 0) != -1 || errno != EAGAIN) {
		fail("ioctl FIONBIO: recv of nothing did not fail with EAGAIN");
		goto out;
	}
	if (ioctl(fd, FIONBIO, &off) < 0 || (fcntl(fd, F_GETFL) & O_NONBLOCK)) {
		fail("ioctl FIONBIO 0: still nonblocking");
		goto out;
	}
	fill(b, seed, 0, sizeof(b));
	if (write_all(fd, b, sizeof(b)) < 0)
		goto out;
	for (end = now_ms() + TIMEOUT_MS; now_ms() < end; usleep(1000))
		if (ioctl(fd, FIONREAD, &avail) < 0 || avail >= (int)sizeof(b))
			break;
	if (avail != (int)sizeof(b)) {
		fail("FIONREAD %d, want %zu", avail, sizeof(b));
		goto out;
	}
	if (recv_pattern(fd, seed, 0, sizeof(b), 0) < 0)
		goto out;
	if (ioctl(fd, FIONREAD, &avail) < 0 || avail != 0) {
		fail("FIONREAD %d after reading everything", avail);
		goto out;
	}
	r = 0;
out:
	close(fd);
	return r;
}

/* ---- readiness ---- */

enum waiter { W_POLL, W_PPOLL, W_SELECT, W_PSELECT };

/* Is fd ready for events (POLLIN or POLLOUT) within ms? 1, 0, or -1. */
static int ready(enum waiter w, int fd, short events, int ms)
{
	struct pollfd p = { .fd = fd, .events = events };
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
	fd_set rs, ws;
	int r;

	FD_ZERO(&rs);
	FD_ZERO(&ws);
	FD_SET(fd, events == POLLIN ? &rs : &ws);
	switch (w) {
	case W_POLL:
		r = poll(&p, 1, ms);
		break;
	case W_PPOLL:
		r = ppoll(&p, 1, &ts, NULL);
		break;
	case W_SELECT:
		r = select(fd + 1, &rs, &ws, NULL, &tv);
		break;
	case W_PSELECT:
		r = pselect(fd + 1, &rs, &ws, NULL, &ts, NULL);
		break;
	default:
		return -1;
	}
	if (r < 0)
		return -1;
	if (w == W_SELECT || w == W_PSELECT)
		return FD_ISSET(fd, events == POLLIN ? &rs : &ws) ? 1 : 0;
	return r > 0 && (p.revents & events);
}

static int readiness(enum waiter w, uint64_t seed)
{
	int fd = dial(M_ECHO, seed, 0), r = -1;
	uint8_t b[10];

	if (fd < 0)
		return -1;
	if (ready(w, fd, POLLIN, 0) != 0) {
		fail("readable with nothing to read");
		goto out;
	}
	if (ready(w, fd, POLLOUT, 0) != 1) {
		fail("not writable");
		goto out;
	}
	fill(b, seed, 0, sizeof(b));
	if (write_all(fd, b, sizeof(b)) < 0)
		goto out;
	if (ready(w, fd, POLLIN, TIMEOUT_MS) != 1) {
		fail("not readable after the echo");
		goto out;
	}
	if (recv_pattern(fd, seed, 0, sizeof(b), 0) < 0 || shutdown(fd, SHUT_WR) < 0)
		goto out;
	if (ready(w, fd, POLLIN, TIMEOUT_MS) != 1) {
		fail("not readable at EOF");
		goto out;
	}
	r = recv_pattern(fd, seed, sizeof(b), 0, 1);
out:
	close(fd);
	return r;
}

static int s_poll(uint64_t seed) { return readiness(W_POLL, seed); }
static int s_ppoll(uint64_t seed) { return readiness(W_PPOLL, seed); }
static int s_select(uint64_t seed) { return readiness(W_SELECT, seed); }
static int s_pselect(uint64_t seed) { return readiness(W_PSELECT, seed); }

/* Events for fd in ep within ms (epoll_wait, epoll_pwait, epoll_pwait2 in turn). */
static int ep_wait(int ep, int ms, uint32_t *events)
{
	static int turn;
	struct epoll_event ev[4];
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	int n;

	switch (turn++ % 3) {
	case 0:
		n = epoll_wait(ep, ev, 4, ms);
		break;
	case 1:
		n = epoll_pwait(ep, ev, 4, ms, NULL);
		break;
	default:
		n = epoll_pwait2(ep, ev, 4, &ts, NULL);
		if (n < 0 && errno == ENOSYS)
			n = epoll_wait(ep, ev, 4, ms);
		break;
	}
	if (n > 0 && events)
		*events = ev[0].events;
	return n;
}

static int send_echo(int fd, uint64_t seed, uint64_t off, size_t n)
{
	uint8_t b[64];

	fill(b, seed, off, n);
	return write_all(fd, b, n);
}

enum epmode { EP_LEVEL, EP_EDGE, EP_ONESHOT, EP_NESTED };

static int epoll_case(enum epmode m, uint64_t seed)
{
	int fd = dial(M_ECHO, seed, 0), ep = epoll_create1(EPOLL_CLOEXEC), inner = -1, r = -1, n;
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
	uint32_t got = 0;

	if (fd < 0 || ep < 0) {
		fail("socket or epoll_create1");
		goto out;
	}
	if (m == EP_EDGE)
		ev.events |= EPOLLET;
	if (m == EP_ONESHOT)
		ev.events |= EPOLLONESHOT;
	if (m == EP_NESTED) {
		inner = epoll_create(1);
		if (inner < 0 || epoll_ctl(inner, EPOLL_CTL_ADD, fd, &ev) < 0) {
			FAILE("inner epoll");
			goto out;
		}
		ev = (struct epoll_event){ .events = EPOLLIN, .data.fd = inner };
		if (epoll_ctl(ep, EPOLL_CTL_ADD, inner, &ev) < 0) {
			FAILE("epoll_ctl nested");
			goto out;
		}
	} else if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
		FAILE("epoll_ctl");
		goto out;
	}
	if ((n = ep_wait(ep, 0, NULL)) != 0) {
		fail("%d events with nothing to read", n);
		goto out;
	}
	if (send_echo(fd, seed, 0, 10) < 0)
		goto out;
	if (ep_wait(ep, TIMEOUT_MS, &got) != 1 || !(got & EPOLLIN)) {
		fail("no EPOLLIN after the echo");
		goto out;
	}
	/* Nothing read yet: level-triggered (and nested) sets report again. */
	usleep(50000);
	n = ep_wait(ep, 100, NULL);
	if ((m == EP_LEVEL || m == EP_NESTED) && n != 1) {
		fail("level-triggered: no second report of unread data");
		goto out;
	}
	if ((m == EP_EDGE || m == EP_ONESHOT) && n != 0) {
		fail("reported again without a new edge");
		goto out;
	}
	if (send_echo(fd, seed, 10, 10) < 0)
		goto out;
	usleep(50000);
	n = ep_wait(ep, m == EP_ONESHOT ? 300 : TIMEOUT_MS, NULL);
	if (m == EP_ONESHOT) {
		if (n != 0) {
			fail("EPOLLONESHOT: reported again before EPOLL_CTL_MOD");
			goto out;
		}
		ev = (struct epoll_event){ .events = EPOLLIN | EPOLLONESHOT, .data.fd = fd };
		if (epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev) < 0 || ep_wait(ep, TIMEOUT_MS, NULL) != 1) {
			fail("EPOLLONESHOT: not reported after EPOLL_CTL_MOD");
			goto out;
		}
	} else if (n != 1) {
		fail("no report after new data");
		goto out;
	}
	if (recv_pattern(fd, seed, 0, 20, 0) < 0)
		goto out;
	if (m != EP_ONESHOT && (n = ep_wait(ep, 0, NULL)) != 0) {
		fail("%d events after reading everything", n);
		goto out;
	}
	if (shutdown(fd, SHUT_WR) < 0 || recv_pattern(fd, seed, 20, 0, 1) < 0)
		goto out;
	r = 0;
out:
	close(inner);
	close(ep);
	close(fd);
	return r;
}

static int s_epoll_level(uint64_t seed) { return epoll_case(EP_LEVEL, seed); }
static int s_epoll_edge(uint64_t seed) { return epoll_case(EP_EDGE, seed); }
static int s_epoll_oneshot(uint64_t seed) { return epoll_case(EP_ONESHOT, seed); }
static int s_epoll_nested(uint64_t seed) { return epoll_case(EP_NESTED, seed); }

/* ---- processes ---- */

static int child_status(pid_t pid, const char *what)
{
	uint64_t end = now_ms() + TIMEOUT_MS;
	int st;
	pid_t r;

	while ((r = waitpid(pid, &st, WNOHANG)) == 0 && now_ms() < end)
		usleep(2000);
	if (r == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		return fail("%s: still running after %d s", what, TIMEOUT_MS / 1000);
	}
	if (r < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return fail("%s: status %#x", what, r < 0 ? -1 : st);
	return 0;
}

/* fork: the child writes, the parent reads the echo. */
static int s_fork(uint64_t seed)
{
	uint64_t n = 64 << 10;
	int fd = dial(M_ECHO, seed, 0), r;
	pid_t pid;

	if (fd < 0)
		return -1;
	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(send_pattern(fd, seed, 0, n) < 0 ? 1 : 0);
	if (pid < 0) {
		close(fd);
		return FAILE("fork");
	}
	r = recv_pattern(fd, seed, 0, n, 0);
	if (child_status(pid, "writing child") < 0)
		r = -1;
	if (r == 0 && shutdown(fd, SHUT_WR) == 0)
		r = recv_pattern(fd, seed, n, 0, 1);
	close(fd);
	return r;
}

/*
 * exec-child FD CLOEXECFD SEED LEN: run in a new image, read LEN echoed
 * bytes from the inherited FD; CLOEXECFD must be gone.
 */
static int exec_child(char **argv)
{
	int fd = atoi(argv[0]), gone = atoi(argv[1]);
	uint64_t seed = strtoull(argv[2], NULL, 10), n = strtoull(argv[3], NULL, 10);

	alarm(SCENARIO_S);
	if (fcntl(gone, F_GETFD) != -1 || errno != EBADF) {
		fprintf(stderr, "exec-child: fd %d (close-on-exec) survived the exec\n", gone);
		return 1;
	}
	if (recv_pattern(fd, seed, 0, n, 0) < 0) {
		fprintf(stderr, "exec-child: %s\n", why);
		return 1;
	}
	return 0;
}

static int exec_case(int spawn, uint64_t seed)
{
	uint64_t n = 32 << 10;
	int fd = dial(M_ECHO, seed, 0), ce, r = -1;
	char sfd[16], sce[16], sseed[24], sn[24];
	pid_t pid;

	if (fd < 0)
		return -1;
	ce = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (ce < 0 || send_pattern(fd, seed, 0, n) < 0)
		goto out;
	snprintf(sfd, sizeof(sfd), "%d", fd);
	snprintf(sce, sizeof(sce), "%d", ce);
	snprintf(sseed, sizeof(sseed), "%" PRIu64, seed);
	snprintf(sn, sizeof(sn), "%" PRIu64, n);
	fflush(stdout);
	if (spawn) {
		char *argv[] = { "conformance", "exec-child", sfd, sce, sseed, sn, NULL };

		errno = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ);
		if (errno) {
			FAILE("posix_spawn");
			goto out;
		}
	} else {
		pid = fork();
		if (pid == 0) {
			execl("/proc/self/exe", "conformance", "exec-child", sfd, sce, sseed, sn,
			      (char *)NULL);
			_exit(127);
		}
		if (pid < 0) {
			FAILE("fork");
			goto out;
		}
	}
	if (child_status(pid, spawn ? "spawned reader" : "exec'd reader") < 0)
		goto out;
	if (shutdown(fd, SHUT_WR) < 0)
		goto out;
	r = recv_pattern(fd, seed, n, 0, 1);
out:
	close(ce);
	close(fd);
	return r;
}

static int s_exec(uint64_t seed) { return exec_case(0, seed); }
static int s_posix_spawn(uint64_t seed) { return exec_case(1, seed); }

/*
 * SCM_RIGHTS: the connected socket goes to a child over a Unix socket;
 * the parent closes its copy, the child reads the echo and finishes.
 */
static int s_scm_rights(uint64_t seed)
{
	uint64_t n = 16 << 10;
	int fd = dial(M_ECHO, seed, 0), sp[2], r = -1;
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	char one = 'x';
	struct iovec iov = { &one, 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
			      .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf) };
	struct cmsghdr *cm;
	pid_t pid;

	if (fd < 0)
		return -1;
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) < 0) {
		close(fd);
		return FAILE("socketpair");
	}
	if (send_pattern(fd, seed, 0, n) < 0)
		goto out;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		int got;

		close(sp[0]);
		close(fd);
		memset(ctl.buf, 0, sizeof(ctl.buf));
		if (recvmsg(sp[1], &msg, 0) != 1 || !(cm = CMSG_FIRSTHDR(&msg)) ||
		    cm->cmsg_type != SCM_RIGHTS)
			_exit(2);
		memcpy(&got, CMSG_DATA(cm), sizeof(int));
		if (recv_pattern(got, seed, 0, n, 0) < 0 || shutdown(got, SHUT_WR) < 0 ||
		    recv_pattern(got, seed, n, 0, 1) < 0)
			_exit(1);
		_exit(0);
	}
	if (pid < 0) {
		FAILE("fork");
		goto out;
	}
	cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	if (sendmsg(sp[0], &msg, 0) != 1) {
		FAILE("sendmsg SCM_RIGHTS");
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		goto out;
	}
	close(fd);
	fd = -1;
	r = child_status(pid, "receiving child");
out:
	close(sp[0]);
	close(sp[1]);
	close(fd);
	return r;
}

/* The server's process dies by SIGKILL after its bytes: EOF or ECONNRESET. */
static int s_peer_killed(uint64_t seed)
{
	uint64_t n = 64 << 10, got = 0;
	int fd = dial(M_KILL, seed, n), r = 0;
	uint8_t b[8192];

	if (fd < 0)
		return -1;
	/* Bytes the dying peer never reads: its kernel answers with RST. */
	send_pattern(fd, seed ^ 1, 0, 4096);
	for (;;) {
		ssize_t k;

		if (wait_fd(fd, POLLIN, TIMEOUT_MS) <= 0) {
			r = fail("no EOF nor reset %d s after %" PRIu64 " bytes", TIMEOUT_MS / 1000, got);
			break;
		}
		k = read(fd, b, sizeof(b));
		if (k == 0 || (k < 0 && errno == ECONNRESET))
			break;
		if (k < 0) {
			r = FAILE("read");
			break;
		}
		if (mismatch(b, seed, got, (size_t)k) >= 0) {
			r = fail("bytes differ before the end");
			break;
		}
		got += (uint64_t)k;
	}
	close(fd);
	return r;
}

/*
 * glibc's fortified entry points (_FORTIFY_SOURCE=2 with sizes the
 * compiler cannot check): __read_chk, __recv_chk, __recvfrom_chk,
 * __poll_chk, __ppoll_chk.
 */
static int s_fortified(uint64_t seed)
{
	static volatile size_t lim = 1000;
	static volatile nfds_t one = 1;
	struct timespec ts = { TIMEOUT_MS / 1000, 0 };
	struct pollfd p[2] = { { .events = POLLIN } };
	uint8_t b[4096];
	int fd = dial(M_SOURCE, seed, 3000), r = -1;
	uint64_t off = 0;
	ssize_t k;

	if (fd < 0)
		return -1;
	p[0].fd = fd;
	while (off < 3000) {
		if (poll(p, one, TIMEOUT_MS) != 1 || ppoll(p, one, &ts, NULL) != 1) {
			fail("poll, ppoll: not readable");
			goto out;
		}
		switch (off % 3) {
		case 0:
			k = read(fd, b, lim);
			break;
		case 1:
			k = recv(fd, b, lim, 0);
			break;
		default:
			k = recvfrom(fd, b, lim, 0, NULL, NULL);
			break;
		}
		if (k <= 0) {
			fail("read %zd at %" PRIu64, k, off);
			goto out;
		}
		if (mismatch(b, seed, off, (size_t)k) >= 0) {
			fail("bytes differ");
			goto out;
		}
		off += (uint64_t)k;
	}
	r = recv_pattern(fd, seed, off, 0, 1);
out:
	close(fd);
	return r;
}

struct scenario {
	const char *name;
	int (*fn)(uint64_t seed);
};

static const struct scenario scenarios[] = {
	{ "connect_blocking", s_connect_blocking },
	{ "connect_nonblocking", s_connect_nonblocking },
	{ "connect_refused", s_connect_refused },
	{ "accept4", s_accept4 },
	{ "partial_read", s_partial_read },
	{ "partial_write", s_partial_write },
	{ "msg_peek", s_msg_peek },
	{ "msg_dontwait", s_msg_dontwait },
	{ "msg_waitall", s_msg_waitall },
	{ "sigpipe", s_sigpipe },
	{ "half_close", s_half_close },
	{ "close_unread", s_close_unread },
	{ "linger0", s_linger0 },
	{ "read_write", s_rw },
	{ "send_recv", s_send_recv },
	{ "sendto_recvfrom", s_sendto_recvfrom },
	{ "readv_writev", s_readv_writev },
	{ "sendmsg_recvmsg", s_sendmsg_recvmsg },
	{ "sendmmsg_recvmmsg", s_mmsg },
	{ "sendfile", s_sendfile },
	{ "dup", s_dup },
	{ "nonblock_fcntl_ioctl", s_nonblock_flags },
	{ "poll", s_poll },
	{ "ppoll", s_ppoll },
	{ "select", s_select },
	{ "pselect", s_pselect },
	{ "epoll_level", s_epoll_level },
	{ "epoll_edge", s_epoll_edge },
	{ "epoll_oneshot", s_epoll_oneshot },
	{ "epoll_nested", s_epoll_nested },
	{ "fork", s_fork },
	{ "exec", s_exec },
	{ "posix_spawn", s_posix_spawn },
	{ "scm_rights", s_scm_rights },
	{ "peer_killed", s_peer_killed },
	{ "fortified", s_fortified },
};

static int run_client(void)
{
	int fd, n = 0;

	signal(SIGPIPE, SIG_IGN);
	signal(SIGALRM, on_alarm);
	for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
		const struct scenario *s = &scenarios[i];

		if ((only && !strstr(s->name, only)) || (exact && strcmp(s->name, exact)))
			continue;
		cur = s->name;
		why[0] = 0;
		alarm(SCENARIO_S);
		report(s->name, s->fn(seed_of((int)i)));
		alarm(0);
		n++;
	}
	cur = "done";
	alarm(SCENARIO_S);
	fd = dial(M_DONE, 0, 0);
	if (fd < 0) {
		report("done", -1);
	} else {
		/* Wait for the server to close, so it saw M_DONE. */
		wait_fd(fd, POLLIN, TIMEOUT_MS);
		close(fd);
	}
	alarm(0);
	printf("%d scenarios, %d failed\n", n, failures);
	fflush(stdout);
	return failures ? 1 : 0;
}

/* A port nothing listens on, for connect_refused in loopback mode. */
static int free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0), p = 0;

	if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, len) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
		p = ntohs(sa.sin_port);
	close(fd);
	return p;
}

static int loopback(void)
{
	int pp[2], st, rc;
	pid_t pid;

	if (pipe(pp) < 0)
		return 1;
	port = 0;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		close(pp[0]);
		alarm(40 * SCENARIO_S);
		exit(serve("127.0.0.1", pp[1]));
	}
	close(pp[1]);
	if (pid < 0 || read(pp[0], &port, sizeof(port)) != sizeof(port)) {
		printf("FAIL loopback: the server did not start\n");
		return 1;
	}
	close(pp[0]);
	host = "127.0.0.1";
	refused_port = free_port();
	rc = run_client();
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		printf("FAIL loopback: server status %#x\n", st);
		rc = 1;
	}
	return rc;
}

static void usage(void)
{
	fprintf(stderr, "usage: conformance list | loopback | server [-p PORT] [ADDR] | "
			"client [-p PORT] [-r PORT] ADDR  [-s SEED] [-t NAME] [-x NAME]; server -T: threads, -P: plain listener\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *cmd;
	int opt;

	if (argc < 2)
		usage();
	cmd = argv[1];
	if (strcmp(cmd, "exec-child") == 0) {
		if (argc != 6)
			usage();
		return exec_child(argv + 2);
	}
	optind = 2;
	while ((opt = getopt(argc, argv, "p:r:s:t:x:TP")) != -1) {
		switch (opt) {
		case 'p':
			port = atoi(optarg);
			break;
		case 'r':
			refused_port = atoi(optarg);
			break;
		case 's':
			base_seed = strtoull(optarg, NULL, 0);
			break;
		case 't':
			only = optarg;
			break;
		case 'x':
			exact = optarg;
			break;
		case 'T':
			threads = 1;
			break;
		case 'P':
			plain_listener = 1;
			break;
		default:
			usage();
		}
	}
	if (strcmp(cmd, "list") == 0) {
		for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
			printf("%s\n", scenarios[i].name);
		return 0;
	}
	if (strcmp(cmd, "loopback") == 0)
		return loopback();
	if (strcmp(cmd, "server") == 0) {
		alarm(40 * SCENARIO_S);
		return serve(optind < argc ? argv[optind] : "0.0.0.0", -1);
	}
	if (strcmp(cmd, "client") == 0) {
		if (optind >= argc)
			usage();
		host = argv[optind];
		if (!refused_port)
			refused_port = port + 1;
		return run_client();
	}
	usage();
	return 2;
}
