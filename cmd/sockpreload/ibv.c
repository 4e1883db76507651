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
 * address as a RoCE v2 GID (::ffff:a.b.c.d for IPv4). A device is opened
 * (with a PD) by the first attachment that needs it and closed when the
 * last one is released, so that a process with no attachment holds no
 * device: rxe cannot take a device away from a process that has it open,
 * and its removal (`rdma link delete`) waits until every process closed
 * it. When rvmad says a device is being removed (DEVICE), it takes no new
 * attachment and the progress thread demotes those it has (progress.c).
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
static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rdev devs[MAXDEV];	/* under dev_mu; a slot is free when ctx is NULL */

static void ibv_load(void)
{
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!h)
		return;
#define L(field, sym) if (!(ibv.field = dlsym(h, sym))) return;
	L(get_device_list, "ibv_get_device_list")
	L(free_device_list, "ibv_free_device_list")
	L(get_device_name, "ibv_get_device_name")
	L(open_device, "ibv_open_device")
	L(close_device, "ibv_close_device")
	L(alloc_pd, "ibv_alloc_pd")
	L(dealloc_pd, "ibv_dealloc_pd")
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
	ibv_loaded = 1;
}

static int ibv_ready(void)
{
	int err = errno;

	pthread_once(&ibv_once, ibv_load);
	errno = err;
	return ibv_loaded;
}

/*
 * In a forked child: the devices are the parent's (its CQ events go to
 * the parent's channels, and the parent's attachments hold them); the
 * child opens its own on first use and never closes the parent's.
 */
void ibv_fork_child(void)
{
	pthread_mutex_init(&dev_mu, NULL);
	memset(devs, 0, sizeof(devs));
}

/* Under dev_mu: closes d, whose last attachment went. */
static void dev_close(struct rdev *d)
{
	if (d->pd)
		ibv.dealloc_pd(d->pd);
	ibv.close_device(d->ctx);
	memset(d, 0, sizeof(*d));
}

/* Under dev_mu: the open device named name, or NULL. */
static struct rdev *dev_named(const char *name)
{
	for (int k = 0; k < MAXDEV; k++)
		if (devs[k].ctx && !strcmp(devs[k].name, name))
			return &devs[k];
	return NULL;
}

/* Under dev_mu: opens every listed device not open yet, into free slots. */
static void dev_open_all(void)
{
	struct ibv_device **list;
	int n = 0;

	list = ibv.get_device_list(&n);
	if (!list)
		return;
	for (int i = 0; i < n; i++) {
		const char *name = ibv.get_device_name(list[i]);
		struct ibv_port_attr pa;
		struct rdev *d = NULL;

		if (!name || strlen(name) >= sizeof(d->name) || dev_named(name))
			continue;
		for (int k = 0; k < MAXDEV && !d; k++)
			if (!devs[k].ctx)
				d = &devs[k];
		if (!d)
			break;
		d->ctx = ibv.open_device(list[i]);	/* a device being removed: fails */
		if (!d->ctx)
			continue;
		snprintf(d->name, sizeof(d->name), "%s", name);
		memset(&pa, 0, sizeof(pa));
		if (ibv.query_port(d->ctx, 1, &pa) || !(d->pd = ibv.alloc_pd(d->ctx))) {
			dev_close(d);
			continue;
		}
		d->mtu = pa.active_mtu;
		d->gid_tbl_len = pa.gid_tbl_len;
	}
	ibv.free_device_list(list);
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

/* Under dev_mu: the RoCE v2 GID index of addr on open device d, or -1. */
static int dev_gid(struct rdev *d, const uint8_t addr[16])
{
	for (int i = 0; i < d->gid_tbl_len && i < 256; i++) {
		union ibv_gid g;

		if (ibv.query_gid(d->ctx, 1, i, &g) == 0 && !memcmp(g.raw, addr, 16) && gid_v2(d, i))
			return i;
	}
	return -1;
}

/* Under dev_mu: the open device, not being removed, with addr's GID. */
static struct rdev *dev_find(const uint8_t addr[16], int *gidx)
{
	for (int k = 0; k < MAXDEV; k++) {
		struct rdev *d = &devs[k];

		if (d->ctx && !d->gone && (*gidx = dev_gid(d, addr)) >= 0)
			return d;
	}
	return NULL;
}

/*
 * The device and RoCE v2 GID index of the local address addr (16 bytes,
 * IPv4 mapped), with a reference the attachment gives back with
 * ibv_dev_put: 0 and *dev, *gidx set; -1 when no device has it. The
 * devices already open are searched first; only when none has it are
 * the others opened, and those no attachment holds are closed again.
 */
int ibv_dev_get(const uint8_t addr[16], struct rdev **dev, int *gidx)
{
	int err = errno;
	struct rdev *d;

	if (!ibv_ready())
		return -1;
	pthread_mutex_lock(&dev_mu);
	d = dev_find(addr, gidx);
	if (!d) {
		dev_open_all();
		d = dev_find(addr, gidx);
	}
	if (d)
		d->refs++;
	for (int k = 0; k < MAXDEV; k++)
		if (devs[k].ctx && !devs[k].refs)
			dev_close(&devs[k]);
	pthread_mutex_unlock(&dev_mu);
	errno = err;
	if (!d)
		return -1;
	*dev = d;
	return 0;
}

/* An attachment's reference to d goes; the last closes the device. */
void ibv_dev_put(struct rdev *d)
{
	int err = errno;

	pthread_mutex_lock(&dev_mu);
	if (d->ctx && d->refs > 0 && --d->refs == 0)
		dev_close(d);
	pthread_mutex_unlock(&dev_mu);
	errno = err;
}

/*
 * rvmad's DEVICE: the device name is being removed; no attachment takes
 * it from now on. 1 when the process holds it (its attachments through it
 * are to be demoted), else 0.
 */
int ibv_dev_gone(const char *name)
{
	struct rdev *d;

	if (!ibv_loaded)
		return 0;
	pthread_mutex_lock(&dev_mu);
	d = dev_named(name);
	if (d)
		d->gone = 1;
	pthread_mutex_unlock(&dev_mu);
	return d != NULL;
}
