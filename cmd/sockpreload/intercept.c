/*
 * intercept.c: how the shim reaches libc's own functions, and what it
 * does when it is loaded.
 *
 * Each wrapper calls the real function through REAL(name), which looks
 * the function up with dlsym(RTLD_NEXT) on its first call and keeps it.
 * Nothing is looked up at load: a program that never touches a socket
 * pays for nothing. Two threads resolving one symbol at once store the
 * same pointer.
 *
 * A symbol libc lacks (a glibc older than the one the shim was built for:
 * epoll_pwait2 is 2.35, close_range 2.34) resolves to a stub that fails
 * with ENOSYS, as the system call would on an old kernel.
 */
#include "shim.h"

#include <dlfcn.h>
#include <pthread.h>

_Atomic(void *) shim_real_fn[SYM_NR];

static const char *const shim_sym_name[SYM_NR] = {
#define X(name) [SYM_##name] = #name,
	SHIM_SYMBOLS(X)
#undef X
};

static long shim_enosys(void)
{
	errno = ENOSYS;
	return -1;
}

void *shim_resolve(enum shim_sym sym)
{
	int err = errno;
	void *p = dlsym(RTLD_NEXT, shim_sym_name[sym]);

	if (!p)
		p = (void *)shim_enosys;
	atomic_store_explicit(&shim_real_fn[sym], p, memory_order_relaxed);
	errno = err;
	return p;
}

/*
 * At load: no thread, no signal handler, no lookup. Only the pid whose
 * table this is (process.c), and the fork handlers, so that a forked
 * child knows its inherited connections from the start.
 */
__attribute__((constructor)) static void shim_init(void)
{
	process_init();
}
