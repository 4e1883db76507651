/*
 * ibv.c: libibverbs, loaded on first attachment.
 *
 * The shim links against libc only: a program that never attaches a
 * connection never loads libibverbs, and a host without it (or without an
 * RDMA device) simply stays on TCP. The first attachment dlopen()s
 * libibverbs.so.1 and looks up the few functions it calls; the data-path
 * calls (post_send, post_recv, poll_cq, req_notify_cq) are the inline
 * wrappers of <infiniband/verbs.h>, which go through the context's
 * function table and need no symbol.
 *
 * Each attachment has its own completion channel (attach.c), so that a
 * thread waiting for one connection wakes for that connection only.
 *
 * The device: the one whose GID table holds the connection's local
 * address as a RoCE v2 GID (::ffff:a.b.c.d for IPv4), found per
 * attachment among the devices opened once per process.
 */
#include "rdma.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct ibv_fns ibv;

static pthread_once_t ibv_once = PTHREAD_ONCE_INIT;
static int ibv_loaded;

#define MAXDEV 8
static struct rdev devs[MAXDEV];
static int ndevs;

static void ibv_load(void)
{
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	struct ibv_device **list;
	int n = 0;

	if (!h)
		return;
#define L(field, sym) if (!(ibv.field = dlsym(h, sym))) return;
	L(get_device_list, "ibv_get_device_list")
	L(free_device_list, "ibv_free_device_list")
	L(get_device_name, "ibv_get_device_name")
	L(open_device, "ibv_open_device")
	L(alloc_pd, "ibv_alloc_pd")
	L(reg_mr, "ibv_reg_mr")
	L(dereg_mr, "ibv_dereg_mr")
	L(create_comp_channel, "ibv_create_comp_channel")
	L(destroy_comp_channel, "ibv_destroy_comp_channel")
	L(create_cq, "ibv_create_cq")
	L(destroy_cq, "ibv_destroy_cq")
	L(get_cq_event, "ibv_get_cq_event")
	L(ack_cq_events, "ibv_ack_cq_events")
	L(create_qp, "ibv_create_qp")
	L(modify_qp, "ibv_modify_qp")
	L(destroy_qp, "ibv_destroy_qp")
	L(query_gid, "ibv_query_gid")
	L(query_port, "ibv_query_port")
#undef L
	list = ibv.get_device_list(&n);
	if (!list)
		return;
	for (int i = 0; i < n && ndevs < MAXDEV; i++) {
		struct rdev *d = &devs[ndevs];
		struct ibv_port_attr pa;

		d->ctx = ibv.open_device(list[i]);
		if (!d->ctx)
			continue;
		snprintf(d->name, sizeof(d->name), "%s", ibv.get_device_name(list[i]));
		memset(&pa, 0, sizeof(pa));
		if (ibv.query_port(d->ctx, 1, &pa) || !(d->pd = ibv.alloc_pd(d->ctx)))
			continue;	/* leaks a context on a broken device: once */
		d->mtu = pa.active_mtu;
		d->gid_tbl_len = pa.gid_tbl_len;
		ndevs++;
	}
	ibv.free_device_list(list);
	ibv_loaded = ndevs > 0;
}

int ibv_ready(void)
{
	int err = errno;

	pthread_once(&ibv_once, ibv_load);
	errno = err;
	return ibv_loaded;
}

/*
 * In a forked child: the devices are the parent's (its CQ events go to
 * the parent's channels); the child opens its own on first use.
 */
void ibv_fork_child(void)
{
	ibv_once = (pthread_once_t)PTHREAD_ONCE_INIT;
	ibv_loaded = 0;
	ndevs = 0;
	memset(devs, 0, sizeof(devs));
}

int ibv_ndevs(void)
{
	return ibv_ready() ? ndevs : 0;
}

struct rdev *ibv_dev(int i)
{
	return &devs[i];
}

/* Is GID index i of d's port 1 RoCE v2? (sysfs; an absent file: no.) */
static int gid_v2(struct rdev *d, int i)
{
	char path[160], buf[32] = "";
	int fd, n;

	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/gid_attrs/types/%d",
		 d->name, i);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = (int)REAL(read)(fd, buf, sizeof(buf) - 1);
	REAL(close)(fd);
	return n > 0 && strstr(buf, "v2") != NULL;
}

/*
 * The device and RoCE v2 GID index of the local address addr (16 bytes,
 * IPv4 mapped): 0 and *dev, *gidx set; -1 when no device has it.
 */
int ibv_find_gid(const uint8_t addr[16], struct rdev **dev, int *gidx)
{
	int err = errno;

	if (!ibv_ready())
		return -1;
	for (int k = 0; k < ndevs; k++) {
		struct rdev *d = &devs[k];

		for (int i = 0; i < d->gid_tbl_len && i < 256; i++) {
			union ibv_gid g;

			if (ibv.query_gid(d->ctx, 1, i, &g) || memcmp(g.raw, addr, 16))
				continue;
			if (!gid_v2(d, i))
				continue;
			*dev = d;
			*gidx = i;
			errno = err;
			return 0;
		}
	}
	errno = err;
	return -1;
}
