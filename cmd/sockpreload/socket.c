/*
 * socket.c: the life of a socket: socket, bind, listen, connect, accept,
 * accept4, shutdown, the name calls and the socket options.
 *
 * Every connection starts as plain TCP, made by the kernel: these
 * wrappers call libc first and only record what happened. A peer
 * without the shim sees TCP and nothing else.
 */
#include "shim.h"

#include <netinet/in.h>

static int is_tcp(int domain, int type, int protocol)
{
	return (domain == AF_INET || domain == AF_INET6) &&
	       (type & 0xf) == SOCK_STREAM &&
	       (protocol == 0 || protocol == IPPROTO_TCP);
}

/*
 * socket: a TCP socket of AF_INET or AF_INET6 gets a connection object
 * (role new; SOCK_NONBLOCK and SOCK_CLOEXEC recorded). Other sockets are
 * not followed. Attached: the same; nothing is attached before connect or
 * accept.
 */
SHIM_EXPORT int socket(int domain, int type, int protocol)
{
	int fd = REAL(socket)(domain, type, protocol);

	if (fd >= 0) {
		if (is_tcp(domain, type, protocol))
			conn_track_new(fd, domain, type);
		else if (fdt_load(fd) > SLOT_NONE)
			conn_forget(fd);	/* a stale slot: probe it */
	}
	return fd;
}

/* bind: the anchor's own; nothing to record. Attached: the same. */
SHIM_EXPORT int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	return REAL(bind)(fd, addr, len);
}

/*
 * listen: a tracked socket becomes a listener. Attached: the same; the
 * listener stays the kernel's (prefork servers share it), and each
 * accepted connection attaches on its own.
 */
SHIM_EXPORT int listen(int fd, int backlog)
{
	struct conn *c = sock_lookup(fd);
	int r = REAL(listen)(fd, backlog);

	if (r == 0 && c)
		conn_role_move(c, ROLE_NEW, ROLE_LISTENER);
	return r;
}

/*
 * connect: on success the socket is the protocol's client; EINPROGRESS
 * (nonblocking) or EINTR leave it connecting until SO_ERROR, a second
 * connect, or the first byte moved says how it ended. A refusal counts as
 * a failed connect. Attached: the same; conn_established starts the
 * attachment (ATTACH_REQ to rvmad) without delaying the program.
 */
SHIM_EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct conn *c = sock_lookup(fd);
	int r = REAL(connect)(fd, addr, len);
	int err = errno;

	if (!c)
		return r;
	if (r == 0 || err == EINPROGRESS || err == EINTR || err == EALREADY || err == EISCONN) {
		conn_role_move(c, ROLE_NEW, ROLE_CONNECTING);
		conn_connect_result(c, fd, r == 0 ? 0 : err);
	} else {
		/* Refused, unreachable, timed out (or a bad call). */
		conn_role_move(c, ROLE_CONNECTING, ROLE_NEW);
		stat_add(&shim_stats.connect_failed, 1);
	}
	errno = err;
	return r;
}

/*
 * accept, accept4: an fd accepted from a tracked listener is the
 * protocol's server side (SOCK_NONBLOCK and SOCK_CLOEXEC of accept4
 * recorded; accept's new socket is blocking, as Linux makes it). From
 * any other listener, the fd is not followed. Attached: the same; the
 * accepted connection is published for rvmad's owner lookup and waits
 * for the client's ATTACH_REQ.
 */
static int accepted(int lfd, struct conn *l, int fd, int flags)
{
	int err = errno;

	(void)lfd;
	if (fd < 0)
		return fd;
	if (l)
		conn_track_accepted(fd, l, flags);
	else if (fdt_load(fd) > SLOT_NONE)
		conn_forget(fd);
	errno = err;
	return fd;
}

SHIM_EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	struct conn *l = sock_lookup(fd);

	return accepted(fd, l, REAL(accept)(fd, addr, len), 0);
}

SHIM_EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	struct conn *l = sock_lookup(fd);

	return accepted(fd, l, REAL(accept4)(fd, addr, len, flags), flags);
}

/*
 * shutdown: records which directions were shut. Attached: SHUT_WR of a
 * direction on the ring sends FIN(sent) after the last ring write and
 * shuts the anchor once everything off it was credited; SHUT_RD stops
 * reading the ring as the kernel stops reading the anchor.
 */
SHIM_EXPORT int shutdown(int fd, int how)
{
	struct conn *c = sock_lookup(fd);
	int r;

	if (c && conn_att(c) && (how == SHUT_WR || how == SHUT_RDWR) && conn_shut_wr(c))
		r = how == SHUT_RDWR ? REAL(shutdown)(fd, SHUT_RD) : 0;
	else
		r = REAL(shutdown)(fd, how);

	if (r == 0 && c) {
		if (how == SHUT_RD || how == SHUT_RDWR)
			conn_set_flag(c, CONN_SHUT_RD, 1);
		if (how == SHUT_WR || how == SHUT_RDWR)
			conn_set_flag(c, CONN_SHUT_WR, 1);
	}
	return r;
}

/* getpeername, getsockname: the anchor's names are the connection's. */
SHIM_EXPORT int getpeername(int fd, struct sockaddr *addr, socklen_t *len)
{
	return REAL(getpeername)(fd, addr, len);
}

SHIM_EXPORT int getsockname(int fd, struct sockaddr *addr, socklen_t *len)
{
	return REAL(getsockname)(fd, addr, len);
}

/*
 * getsockopt: the anchor's. SO_ERROR ends a connect in progress. Attached:
 * the same, except SO_ERROR also reports an ABORT from the peer
 * (ECONNRESET), and TCP_INFO-style counters stay the anchor's.
 */
SHIM_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	struct conn *c = sock_lookup(fd);
	int r = REAL(getsockopt)(fd, level, name, val, len);
	int err = errno;

	if (c && r == 0 && level == SOL_SOCKET && name == SO_ERROR &&
	    atomic_load(&c->role) == ROLE_CONNECTING && len && *len >= sizeof(int))
		conn_connect_result(c, fd, *(int *)val);
	errno = err;
	return r;
}

/*
 * setsockopt: the anchor's; SO_LINGER {1, 0} is recorded (close resets).
 * Attached: SO_RCVBUF and SO_SNDBUF also size the ring and the send
 * buffer of the next attachment, and a linger of zero makes close send
 * ABORT{linger0} before the kernel's RST.
 */
SHIM_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	struct conn *c = sock_lookup(fd);
	int r = REAL(setsockopt)(fd, level, name, val, len);

	if (c && r == 0 && level == SOL_SOCKET && name == SO_LINGER &&
	    len >= sizeof(struct linger)) {
		const struct linger *lg = val;

		conn_set_flag(c, CONN_LINGER0, lg->l_onoff && lg->l_linger == 0);
	}
	return r;
}
