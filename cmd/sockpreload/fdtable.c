/*
 * fdtable.c: the table indexed by fd, and the mutex of every change.
 *
 * Readers (every wrapper) load the table pointer and one slot, without a
 * lock (fdt_load in shim.h). Writers hold shim_lock. The table grows to
 * the next power of two above the fd it must hold (1024 slots at first);
 * growing copies the slots into a new array and publishes it, and the old
 * array is kept forever: a reader that loaded it before the switch reads
 * the values it held then, as if it had run a moment earlier. With
 * doubling, the arrays kept add up to less than the current one.
 */
#include "shim.h"

#include <pthread.h>
#include <stdlib.h>

_Atomic(struct fdarr *) fdtab;

static pthread_mutex_t shim_mutex = PTHREAD_MUTEX_INITIALIZER;

#define FDT_MIN		1024u

static int fdt_grow(size_t need)
{
	struct fdarr *old = atomic_load_explicit(&fdtab, memory_order_relaxed);
	size_t n = old ? old->n : FDT_MIN;
	struct fdarr *a;

	while (n < need)
		n *= 2;
	a = calloc(1, sizeof(*a) + n * sizeof(a->slot[0]));
	if (!a)
		return -1;
	a->n = n;
	if (old)
		for (size_t i = 0; i < old->n; i++)
			atomic_store_explicit(&a->slot[i],
				atomic_load_explicit(&old->slot[i], memory_order_relaxed),
				memory_order_relaxed);
	atomic_store_explicit(&fdtab, a, memory_order_release);
	return 0;
}

/*
 * Set fd's slot (under shim_lock). Growing for SLOT_UNKNOWN is never
 * needed: a slot beyond the table reads as unknown. -1 when the table
 * could not grow (the fd then stays unknown: probed again on each use).
 */
int fdt_store(int fd, uintptr_t v)
{
	struct fdarr *a = atomic_load_explicit(&fdtab, memory_order_relaxed);

	if (fd < 0)
		return -1;
	if (!a || (size_t)fd >= a->n) {
		if (v == SLOT_UNKNOWN)
			return 0;
		if (fdt_grow((size_t)fd + 1) < 0)
			return -1;
		a = atomic_load_explicit(&fdtab, memory_order_relaxed);
	}
	atomic_store_explicit(&a->slot[fd], v, memory_order_release);
	return 0;
}

size_t fdt_size(void)
{
	struct fdarr *a = atomic_load_explicit(&fdtab, memory_order_relaxed);

	return a ? a->n : 0;
}

/*
 * Every signal is blocked while the mutex is held: a handler that calls
 * close() or socket() on the same thread would otherwise wait for itself.
 * In a vfork child the table is the parent's: nothing is locked and the
 * caller changes nothing (it returns 0).
 */
int shim_lock(struct shim_held *h)
{
	sigset_t all;

	h->err = errno;
	if (!shim_owner())
		return 0;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &h->mask);
	pthread_mutex_lock(&shim_mutex);
	return 1;
}

void shim_unlock(struct shim_held *h)
{
	pthread_mutex_unlock(&shim_mutex);
	pthread_sigmask(SIG_SETMASK, &h->mask, NULL);
	errno = h->err;
}

/*
 * fork: the forking thread holds the mutex across fork(), so the child's
 * copy of the table is consistent; the child starts with a fresh mutex.
 */
static sigset_t fork_mask;

void shim_lock_fork_prepare(void)
{
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &fork_mask);
	pthread_mutex_lock(&shim_mutex);
}

void shim_lock_fork_parent(void)
{
	pthread_mutex_unlock(&shim_mutex);
	pthread_sigmask(SIG_SETMASK, &fork_mask, NULL);
}

void shim_lock_fork_child(void)
{
	pthread_mutex_init(&shim_mutex, NULL);
	pthread_sigmask(SIG_SETMASK, &fork_mask, NULL);
}
