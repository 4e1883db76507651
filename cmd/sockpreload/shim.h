/*
 * shim.h: the internals of librdmaplus-sockets.so, the LD_PRELOAD shim of
 * sockets over RDMA (docs/sockets.md, "The shim").
 *
 * The shim keeps one table indexed by file descriptor. A slot says what
 * the shim knows of the fd: nothing yet (UNKNOWN), not a TCP socket it
 * follows (NONE), or a pointer to the connection object of a TCP socket
 * of AF_INET or AF_INET6 (struct conn), with the fd's own close-on-exec
 * bit. dup'ed fds point at the same connection object, which counts them.
 *
 * Reading a slot takes no lock: a wrapper loads the table pointer and the
 * slot, and a slot of NONE sends the call straight to libc. Every change
 * (a new socket, an alias, a close) is made under one mutex, with every
 * signal blocked so that a signal handler calling close() cannot deadlock
 * against its own thread. Tables only grow; an old table is never freed,
 * so a reader holding it stays safe. Connection objects are recycled
 * through a free list and never returned to malloc: a reader racing with
 * a close (a bug of the program) may count a byte on the wrong object,
 * never touch freed memory.
 *
 * A connection established in this process may become attachable
 * (conn_maybe_attach): its attachment (struct att, rdma.h) then holds the
 * state machine, the stream's offsets and the RDMA resources; until then,
 * and without rvmad, every byte goes through the kernel socket (the
 * anchor) and the connection object counts them.
 */
#ifndef SHIM_H
#define SHIM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

struct conn;
struct att;

#define SHIM_EXPORT	__attribute__((visibility("default")))
#define likely(x)	__builtin_expect(!!(x), 1)
#define unlikely(x)	__builtin_expect(!!(x), 0)

/*
 * glibc's fortified entry points (_FORTIFY_SOURCE) that take a socket or
 * a set of fds; their headers declare them only under fortification.
 */
ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen);
ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags);
ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags,
		       struct sockaddr *addr, socklen_t *alen);
int __poll_chk(struct pollfd *fds, nfds_t nfds, int timeout, size_t fdslen);
int __ppoll_chk(struct pollfd *fds, nfds_t nfds, const struct timespec *ts,
		const sigset_t *ss, size_t fdslen);

/* ---- intercept.c: the real functions, resolved lazily ---- */

/*
 * Every function the shim wraps, resolved with dlsym(RTLD_NEXT) on its
 * first call. One list: the enum, the name table and the pointer table
 * are made from it.
 */
#define SHIM_SYMBOLS(X)							\
	X(socket) X(bind) X(listen) X(connect) X(accept) X(accept4)	\
	X(shutdown) X(getpeername) X(getsockname) X(getsockopt)		\
	X(setsockopt)							\
	X(close) X(close_range) X(closefrom) X(dup) X(dup2) X(dup3)	\
	X(fcntl) X(fcntl64) X(ioctl)					\
	X(read) X(recv) X(recvfrom) X(recvmsg) X(readv) X(recvmmsg)	\
	X(write) X(send) X(sendto) X(sendmsg) X(writev) X(sendmmsg)	\
	X(__read_chk) X(__recv_chk) X(__recvfrom_chk)			\
	X(sendfile) X(sendfile64) X(splice) X(tee) X(vmsplice) X(fdopen) \
	X(select) X(pselect) X(poll) X(ppoll) X(__poll_chk) X(__ppoll_chk) \
	X(epoll_create) X(epoll_create1) X(epoll_ctl) X(epoll_wait)	\
	X(epoll_pwait) X(epoll_pwait2)					\
	X(clone) X(prctl)						\
	X(execve) X(execv) X(execvp) X(execvpe) X(fexecve) X(execveat)	\
	X(posix_spawn) X(posix_spawnp)

enum shim_sym {
#define X(name) SYM_##name,
	SHIM_SYMBOLS(X)
#undef X
	SYM_NR
};

extern _Atomic(void *) shim_real_fn[SYM_NR];
void *shim_resolve(enum shim_sym sym);

static inline void *shim_real(enum shim_sym sym)
{
	void *p = atomic_load_explicit(&shim_real_fn[sym], memory_order_relaxed);

	return likely(p) ? p : shim_resolve(sym);
}

/* REAL(read)(fd, buf, n): libc's read, typed as our declaration of it. */
#define REAL(name)	((__typeof__(&name))shim_real(SYM_##name))

/* The monotonic clock in milliseconds (attach delays, retries, waits). */
static inline int64_t shim_now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ---- process.c: the owner of the table, fork and clone ---- */

/*
 * The pid whose table this is. A vfork child (or any clone sharing our
 * memory without being a thread) has another pid but our memory: it must
 * not change the table, so every change first checks shim_owner().
 */
extern _Atomic pid_t shim_pid;

static inline int shim_owner(void)
{
	return getpid() == atomic_load_explicit(&shim_pid, memory_order_relaxed);
}

void process_init(void);

/*
 * The process installed a seccomp filter (prctl PR_SET_SECCOMP): any
 * system call the shim adds may kill it (sshd's pre-authentication
 * child), so from then on it probes, registers and attaches nothing.
 */
extern _Atomic int shim_sandboxed;

static inline int shim_sandbox(void)
{
	return atomic_load_explicit(&shim_sandboxed, memory_order_relaxed);
}

/* ---- fdtable.c: the table indexed by fd ---- */

#define SLOT_UNKNOWN	((uintptr_t)0)	/* never seen: probe on first use */
#define SLOT_NONE	((uintptr_t)1)	/* not a TCP socket the shim follows */
#define SLOT_CLOEXEC	((uintptr_t)2)	/* bit: the fd is close-on-exec */
#define SLOT_FLAGS	((uintptr_t)7)

struct fdarr {
	size_t n;
	_Atomic uintptr_t slot[];
};

extern _Atomic(struct fdarr *) fdtab;

/* The slot of fd, without a lock: one array lookup. */
static inline uintptr_t fdt_load(int fd)
{
	struct fdarr *a = atomic_load_explicit(&fdtab, memory_order_acquire);

	if (unlikely(fd < 0))
		return SLOT_NONE;
	if (unlikely(!a || (size_t)fd >= a->n))
		return SLOT_UNKNOWN;
	return atomic_load_explicit(&a->slot[fd], memory_order_acquire);
}

static inline struct conn *slot_conn(uintptr_t v)
{
	return v > SLOT_NONE ? (struct conn *)(v & ~SLOT_FLAGS) : NULL;
}

int fdt_store(int fd, uintptr_t v);		/* under shim_lock */
size_t fdt_size(void);				/* under shim_lock */

/*
 * The mutex of every change. shim_lock() blocks every signal and
 * returns 0 without locking in a vfork child (see shim_owner); both keep
 * errno.
 */
struct shim_held {
	sigset_t mask;
	int err;
};
int shim_lock(struct shim_held *h);
void shim_unlock(struct shim_held *h);
void shim_lock_fork_prepare(void);
void shim_lock_fork_parent(void);
void shim_lock_fork_child(void);

/* ---- conn.c: connection objects ---- */

/* What a tracked socket is to the program. */
enum conn_role {
	ROLE_NEW,		/* socket(): neither connected nor listening */
	ROLE_LISTENER,		/* listen() */
	ROLE_CONNECTING,	/* connect() in progress (EINPROGRESS, EINTR) */
	ROLE_CLIENT,		/* connected by connect(): the protocol's client */
	ROLE_SERVER,		/* connected by accept(): the protocol's server */
	ROLE_ADOPTED,		/* found open: inherited across exec, or received */
	ROLE_NR
};

/* The state machine's phase (pkg/sockets/internal/proto.Phase). */
enum conn_phase { PHASE_PLAIN, PHASE_ATTACHING, PHASE_ATTACHED, PHASE_DEMOTING };
/* The incoming direction: the anchor, the anchor then the ring, the ring. */
enum conn_in { IN_TCP, IN_SWITCHING, IN_RING };

/* conn.flags */
#define CONN_NONBLOCK	0x01u	/* O_NONBLOCK on the open file description */
#define CONN_SHUT_RD	0x02u	/* shutdown(SHUT_RD) succeeded */
#define CONN_SHUT_WR	0x04u	/* shutdown(SHUT_WR) succeeded */
#define CONN_FOREIGN	0x08u	/* inherited by fork: the parent created it */
#define CONN_LINGER0	0x10u	/* SO_LINGER {1, 0}: close resets */
#define CONN_V6		0x20u	/* AF_INET6 (else AF_INET) */
#define CONN_KOFF	0x40u	/* not followed from its start: offsets from the kernel, answers only */
#define CONN_NEVER	0x80u	/* handed to the kernel or stdio (conn_demote): never attaches */

/*
 * A connection: one kernel socket (open file description), shared by the
 * fds that alias it. refs counts those fds; it and the list links change
 * under shim_lock only. role and flags are read without the lock and
 * changed atomically; the byte counters are this process's statistics.
 */
struct conn {
	int refs;
	unsigned id;			/* this process's number, from 1 */
	_Atomic int role;		/* enum conn_role */
	_Atomic unsigned flags;		/* CONN_* */

	_Atomic(struct att *) att;	/* registered with rvmad: attachable (rdma.h) */
	/*
	 * An epoll registration made before the connection was established
	 * (epoll.c moves it to the attachment then); ep_sets counts the sets
	 * holding it: more than one, and it never attaches.
	 */
	int ep_sets, ep_epfd, ep_fd;
	struct epoll_event ep_ev;
	/*
	 * Established in this process: may become attachable once it lived
	 * RDMAPLUS_SOCKETS_ATTACH_MS or moved 64 KiB (short connections never
	 * cost rvmad anything); tx and rx count its stream until then.
	 */
	_Atomic int eligible;
	int64_t t_est;
	_Atomic uint64_t tx, rx;
	_Atomic int inflight;		/* plain reads and writes under way */
	_Atomic int attaching;		/* conn_maybe_attach at work */

	/* Statistics of this process. */
	_Atomic uint64_t rbytes;	/* read by the program */
	_Atomic uint64_t wbytes;	/* written by the program */

	struct conn *next, *prev;	/* live list; next is the free list's link */
};

/* The slot's connection, probing an fd never seen; NULL: not followed. */
struct conn *conn_probe(int fd);

static inline struct conn *sock_lookup(int fd)
{
	uintptr_t v = fdt_load(fd);

	if (likely(v == SLOT_NONE))
		return NULL;
	if (unlikely(v == SLOT_UNKNOWN))
		return conn_probe(fd);
	return slot_conn(v);
}

static inline unsigned conn_flags(struct conn *c)
{
	return atomic_load_explicit(&c->flags, memory_order_relaxed);
}

void conn_set_flag(struct conn *c, unsigned flag, int on);
int conn_role_move(struct conn *c, enum conn_role from, enum conn_role to);
void conn_connect_result(struct conn *c, int fd, int err);
void conn_check_connected(struct conn *c, int fd);

/*
 * Before a read or write on a connection still connecting: if the kernel
 * says it is connected (a program that writes without asking SO_ERROR),
 * the connect completed. Tracked path only.
 */
struct att *conn_maybe_attach(struct conn *c, int fd);

static inline void conn_moved(struct conn *c, int fd)
{
	if (unlikely(atomic_load_explicit(&c->role, memory_order_relaxed) == ROLE_CONNECTING))
		conn_check_connected(c, fd);
}

/* The connection's attachable state, or NULL (plain: the kernel's socket alone). */
static inline struct att *conn_att(struct conn *c)
{
	return atomic_load_explicit(&c->att, memory_order_acquire);
}

/* Table changes; each keeps errno and does nothing in a vfork child. */
void conn_track_new(int fd, int family, int type);
void conn_track_accepted(int fd, struct conn *listener, int flags);
void conn_alias(int oldfd, struct conn *c, int newfd, int cloexec);
void conn_untrack(int fd);
void conn_untrack_range(unsigned first, unsigned last);
void conn_forget(int fd);
void conn_set_cloexec(int fd, int on);
void conn_set_cloexec_range(unsigned first, unsigned last);

/* Where the attachment acts (conn.c). */
void conn_close_prepare(struct conn *c);
void conn_established(struct conn *c, int fd);
void conn_demote(struct conn *c, int reason);
int conn_shut_wr(struct conn *c);

void conn_fork_parent(void);
void conn_fork_child(void);
void epoll_conn_established(struct conn *c, struct att *a);
void conn_foreach_live(void (*fn)(struct conn *c, void *arg), void *arg);

/* ---- kcount.c: the kernel's byte counts ---- */

int kcount_offsets(int fd, uint64_t *written, uint64_t *read);

/* ---- io.c ---- */

void io_received_fds(struct msghdr *msg);

/* ---- exec.c ---- */

void exec_prepare(int spawn);

/* ---- stats.c, segment.c: per-process counters ---- */

/*
 * The process's counters: struct sockproto_stats_counters (sockproto.h)
 * as atomics, field for field. They live in a private block until the
 * process's first connection registers with rvmad, then in its
 * statistics segment (segment.c), which rvmad reads: shim_stats names
 * whichever is current.
 */
struct shim_counters {
	_Atomic uint64_t created[8];		/* sockets by role (enum conn_role) */
	_Atomic uint64_t connect_failed;
	_Atomic uint64_t inherited;		/* live at fork, in the child */
	_Atomic uint64_t live;
	_Atomic uint64_t bytes_in;		/* read by the program, all paths */
	_Atomic uint64_t bytes_out;		/* written by the program, all paths */
	_Atomic uint64_t ring_read;		/* bytes read from rings */
	_Atomic uint64_t ring_written;		/* bytes written into peers' rings */
	_Atomic uint64_t rdma_writes;		/* RDMA WRITEs of data posted */
	_Atomic uint64_t attachable;		/* registered with rvmad */
	_Atomic uint64_t attached;		/* attachments made */
	_Atomic uint64_t demoted;		/* demotes, this side's and answers */
	_Atomic uint64_t fd_passed;		/* sent away with SCM_RIGHTS */
	_Atomic uint64_t fdopen;
	_Atomic uint64_t splice;		/* sendfile, splice */
	_Atomic uint64_t execs;
	_Atomic uint64_t spawns;
	_Atomic uint64_t demotes[32];		/* by enum sockproto_reason */
	_Atomic uint64_t fallbacks[32];		/* attachments refused or failed, by reason */
};

extern struct shim_counters *_Atomic shim_statsp;
#define shim_stats (*atomic_load_explicit(&shim_statsp, memory_order_relaxed))

static inline void stat_add(_Atomic uint64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* n bytes read (rd) or written by the program on connection c. */
static inline void conn_count(struct conn *c, int rd, uint64_t n)
{
	stat_add(rd ? &c->rbytes : &c->wbytes, n);
	stat_add(rd ? &shim_stats.bytes_in : &shim_stats.bytes_out, n);
}

void stats_arm(void);				/* under shim_lock */
extern int shim_debug;
void shim_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define TRACE(...) do { if (unlikely(shim_debug >= 2)) shim_trace(__VA_ARGS__); } while (0)
void stats_conn_released(struct conn *c);	/* under shim_lock */
void stats_fork_child(void);			/* under shim_lock */

#endif /* SHIM_H */
