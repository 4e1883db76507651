/*
 * exec.c: the exec family (execve, execv, execvp, execvpe, execl,
 * execlp, execle, fexecve, execveat) and posix_spawn, posix_spawnp.
 *
 * Every one calls exec_prepare() and then libc; the execl forms collect
 * their arguments and go through the vector forms (glibc's own execl
 * calls execve internally, out of the shim's reach, so each is wrapped).
 *
 * exec_prepare is where, once attachments exist, every attached
 * connection is demoted before the exec (SOCKPROTO_R_EXEC): an image
 * without the shim (setuid, static, no preload) must find a plain TCP
 * socket, and one with the shim attaches the connections it inherited
 * again from the kernel's byte counts (docs/sockets.md, "fork and
 * exec"). posix_spawn demotes the same way: its file actions are out of
 * the shim's sight. Pass-through mode has nothing to demote; it counts.
 *
 * In a vfork child the table is the parent's: nothing is counted there.
 */
#include "rdma.h"

#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>


struct atts {
	struct att **a;
	int n, cap;
};

/* Under shim_lock: no connection becomes attachable; the attached ones, each with a reference. */
static void gather(struct conn *c, void *arg)
{
	struct atts *v = arg;
	struct att *a = conn_att(c);

	atomic_store(&c->eligible, 0);
	if (!a)
		return;
	if (v->n == v->cap) {
		int cap = v->cap ? 2 * v->cap : 64;
		struct att **p = realloc(v->a, (size_t)cap * sizeof(*p));

		if (!p)
			return;
		v->a = p;
		v->cap = cap;
	}
	atomic_fetch_add(&a->refs, 1);
	v->a[v->n++] = a;
}

/*
 * The attachments of the live connections, each with a reference the
 * caller gives back (att_put), in an array the caller frees: *n of them.
 * Without memory for the array, those left out are not demoted: the new
 * image finds them as they are, and their peer's probe ends them.
 */
static struct att **exec_atts(int *n)
{
	struct atts v = { NULL, 0, 0 };

	conn_foreach_live(gather, &v);
	*n = v.n;
	return v.a;
}

void exec_prepare(int spawn)
{
	if (!shim_owner())
		return;
	stat_add(spawn ? &shim_stats.spawns : &shim_stats.execs, 1);
	if (atomic_load_explicit(&shim_stats.attachable, memory_order_relaxed)) {
		int n;
		struct att **v = exec_atts(&n);

		/* outside the table's lock: a demote takes the attachment's */
		for (int i = 0; i < n; i++) {
			att_demote_wait(v[i], SOCKPROTO_R_EXEC, 5000);
			att_put(v[i]);
		}
		free(v);
	}
}

SHIM_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	exec_prepare(0);
	return REAL(execve)(path, argv, envp);
}

SHIM_EXPORT int execv(const char *path, char *const argv[])
{
	exec_prepare(0);
	return REAL(execv)(path, argv);
}

SHIM_EXPORT int execvp(const char *file, char *const argv[])
{
	exec_prepare(0);
	return REAL(execvp)(file, argv);
}

SHIM_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	exec_prepare(0);
	return REAL(execvpe)(file, argv, envp);
}

SHIM_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	exec_prepare(0);
	return REAL(fexecve)(fd, argv, envp);
}

SHIM_EXPORT int execveat(int dirfd, const char *path, char *const argv[],
			 char *const envp[], int flags)
{
	exec_prepare(0);
	return REAL(execveat)(dirfd, path, argv, envp, flags);
}

/*
 * The execl forms: count the arguments, copy them into a vector on the
 * stack (as glibc does), and take the vector form's path. execle's
 * environment follows the terminating NULL.
 */
#define EXECL_ARGV(first, argv, with_env, envp)				\
	do {								\
		va_list ap;						\
		size_t n = 1;						\
									\
		va_start(ap, first);					\
		while (va_arg(ap, char *))				\
			n++;						\
		va_end(ap);						\
		argv = alloca((n + 1) * sizeof(char *));		\
		argv[0] = (char *)(first);				\
		va_start(ap, first);					\
		for (size_t i = 1; i <= n; i++)				\
			argv[i] = va_arg(ap, char *);			\
		if (with_env)						\
			envp = va_arg(ap, char *const *);		\
		va_end(ap);						\
	} while (0)

SHIM_EXPORT int execl(const char *path, const char *arg, ...)
{
	char *const *envp = NULL;
	char **argv;

	EXECL_ARGV(arg, argv, 0, envp);
	(void)envp;
	exec_prepare(0);
	return REAL(execv)(path, argv);
}

SHIM_EXPORT int execlp(const char *file, const char *arg, ...)
{
	char *const *envp = NULL;
	char **argv;

	EXECL_ARGV(arg, argv, 0, envp);
	(void)envp;
	exec_prepare(0);
	return REAL(execvp)(file, argv);
}

SHIM_EXPORT int execle(const char *path, const char *arg, ...)
{
	char *const *envp = NULL;
	char **argv;

	EXECL_ARGV(arg, argv, 1, envp);
	exec_prepare(0);
	return REAL(execve)(path, argv, envp);
}

/*
 * posix_spawn, posix_spawnp: the child is made by libc inside the call
 * (a CLONE_VM child the shim never runs in). Attached: demote first.
 */
SHIM_EXPORT int posix_spawn(pid_t *pid, const char *path,
			    const posix_spawn_file_actions_t *fa,
			    const posix_spawnattr_t *attr, char *const argv[],
			    char *const envp[])
{
	exec_prepare(1);
	return REAL(posix_spawn)(pid, path, fa, attr, argv, envp);
}

SHIM_EXPORT int posix_spawnp(pid_t *pid, const char *file,
			     const posix_spawn_file_actions_t *fa,
			     const posix_spawnattr_t *attr, char *const argv[],
			     char *const envp[])
{
	exec_prepare(1);
	return REAL(posix_spawnp)(pid, file, fa, attr, argv, envp);
}
