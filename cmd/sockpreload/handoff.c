/*
 * handoff.c: the calls that hand a socket's bytes to someone the shim
 * cannot follow: the kernel moving them itself (sendfile, splice; tee and
 * vmsplice take only pipes) or stdio (fdopen).
 *
 * Each is counted and goes to libc; on an attachable connection it demotes
 * the connection first (SOCKPROTO_R_SPLICE, SOCKPROTO_R_FDOPEN): after a
 * demote the anchor holds exactly the bytes the program has not read, in
 * order, so the kernel or stdio can carry on with it.
 */
#include "shim.h"

#include <fcntl.h>
#include <sys/sendfile.h>

#include "sockproto.h"

/* A tracked socket among a splice's ends: counted, demoted once attached. */
static struct conn *handoff(int fd, int reason, _Atomic uint64_t *counter)
{
	struct conn *c = sock_lookup(fd);

	if (likely(!c))
		return NULL;
	stat_add(counter, 1);
	conn_demote(c, reason);
	return c;
}

/*
 * sendfile, sendfile64: the kernel copies a file into the socket. Counted
 * as written. Attached: demote first, then the kernel's.
 */
SHIM_EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t n)
{
	struct conn *c = handoff(out, SOCKPROTO_R_SPLICE, &shim_stats.splice);
	ssize_t r = REAL(sendfile)(out, in, off, n);

	if (c && r > 0)
		conn_count(c, 0, (uint64_t)r);
	return r;
}

SHIM_EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t n)
{
	struct conn *c = handoff(out, SOCKPROTO_R_SPLICE, &shim_stats.splice);
	ssize_t r = REAL(sendfile64)(out, in, off, n);

	if (c && r > 0)
		conn_count(c, 0, (uint64_t)r);
	return r;
}

/*
 * splice: a pipe and a socket (either way). Counted as read or written.
 * Attached: demote first, then the kernel's.
 */
SHIM_EXPORT ssize_t splice(int in, loff_t *inoff, int out, loff_t *outoff, size_t n,
			   unsigned int flags)
{
	struct conn *ci = handoff(in, SOCKPROTO_R_SPLICE, &shim_stats.splice);
	struct conn *co = handoff(out, SOCKPROTO_R_SPLICE, &shim_stats.splice);
	ssize_t r = REAL(splice)(in, inoff, out, outoff, n, flags);

	if (r > 0) {
		if (ci)
			conn_count(ci, 1, (uint64_t)r);
		if (co)
			conn_count(co, 0, (uint64_t)r);
	}
	return r;
}

/*
 * tee: both ends are pipes (the kernel refuses anything else), so never a
 * socket the shim follows: libc's, attached or not.
 */
SHIM_EXPORT ssize_t tee(int in, int out, size_t n, unsigned int flags)
{
	return REAL(tee)(in, out, n, flags);
}

/* vmsplice: a pipe only, as tee. */
SHIM_EXPORT ssize_t vmsplice(int fd, const struct iovec *iov, size_t n, unsigned int flags)
{
	return REAL(vmsplice)(fd, iov, n, flags);
}

/*
 * fdopen: stdio takes the fd and will read, write and close it behind
 * the shim's back (glibc's own calls). The shim lets go of it: the slot
 * becomes unknown. Attached: demote first.
 */
SHIM_EXPORT FILE *fdopen(int fd, const char *mode)
{
	struct conn *c = handoff(fd, SOCKPROTO_R_FDOPEN, &shim_stats.fdopen);
	FILE *f = REAL(fdopen)(fd, mode);

	if (f && c) {
		int err = errno;

		conn_forget(fd);
		errno = err;
	}
	return f;
}
