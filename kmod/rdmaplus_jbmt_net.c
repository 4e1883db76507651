// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus JBMT connections (docs/jbmt.md): one reliable connection per
 * peer host, made by kernel rdma_cm and shared by every process of this
 * host, over any RDMA device. The module listens on jbmt_port; a process
 * asks for a peer by address (RDMAPLUS_IOC_JBMT_CONNECT) and gets its id,
 * connecting it if it is not up. A connection that goes down (the peer
 * disconnects or dies, the device goes) is torn down and made again by
 * the next request. Each carries 64-byte control messages (SEND and
 * RECV) for the transfers of rdmaplus_jbmt_xfer.c, and their RDMA WRITEs.
 *
 * Locking: jbmt_net_mutex guards the peer table and the kept ids (and
 * is held while a connection is started, never while one is awaited or
 * destroyed); rdma_cm calls jbmt_cm_handler() for one id at a time, in a
 * work item, and it takes the peer's spinlock for its state (and the
 * mutex to put an accepted peer in the table). Each event holds its
 * peer. Resources are freed once (peer->torn): by the teardown work, by
 * a device-removal event, or at unload. A connection whose port is down
 * when it is torn down keeps its rdma_cm id until the port is up
 * (jbmt_park()). Whatever uses a connection's QP, CQ, PD and sinks
 * (an operation, a request's work) is a user of the peer
 * (jbmt_peer_enter()); freeing them marks the peer dead, drains the QP,
 * fails the sections waiting on it and waits for its users to leave.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/in.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/netdevice.h>
#include <linux/slab.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <rdma/ib_cache.h>
#include <rdma/ib_cm.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <rdma/rdma_cm.h>

#include "uapi/rdmaplus.h"
#include "rdmaplus.h"
#include "rdmaplus_jbmt.h"

static ushort jbmt_port = 7470;
module_param(jbmt_port, ushort, 0444);
MODULE_PARM_DESC(jbmt_port, "port JBMT listens on and connects to (rdma_cm, TCP port space)");

static unsigned int max_jbmt_peers = 1024;
module_param(max_jbmt_peers, uint, 0644);
MODULE_PARM_DESC(max_jbmt_peers, "connections to and from peer hosts this host keeps at most (ENOSPC beyond; requests beyond are rejected)");

#define JBMT_RESOLVE_MS		2000
/*
 * How often the ids of connections that went while their port was down
 * are looked at, and for how many ticks in a row their port must be up
 * before one is destroyed (its DREQ or DREP sent): the port comes up
 * with the link, the link's routes a moment after.
 */
#define JBMT_PARK_MS		500
#define JBMT_PARK_TICKS		2

/* what a connection request carries (rdma_cm private data) */
struct jbmt_hello {
	__be32 magic;
	u8 version;
	u8 reserved[3];
	__be32 budget;		/* the sender's pin budget, pages */
};

static DEFINE_MUTEX(jbmt_net_mutex);
static LIST_HEAD(jbmt_peers_list);
static DEFINE_XARRAY_ALLOC1(jbmt_peers);
static unsigned int jbmt_npeers;	/* in the table, under jbmt_net_mutex */
static atomic_t jbmt_peers_alive;	/* allocated: 0 again at unload */
static u32 jbmt_next_peer;		/* ids are not reused at once */
static struct rdma_cm_id *jbmt_listener;
static struct workqueue_struct *jbmt_wq;	/* teardowns */
static LIST_HEAD(jbmt_parked);		/* peers keeping their id; mutex */
static bool jbmt_park_closed;		/* unloading: none kept; mutex */
static void jbmt_park_tick(struct work_struct *w);
static DECLARE_DELAYED_WORK(jbmt_park_work, jbmt_park_tick);

static struct {
	atomic64_t peers;		/* up now */
	atomic64_t connects;		/* made by this host, since load */
	atomic64_t accepts;		/* made by peers, since load */
	atomic64_t connect_errors;	/* attempts that failed */
	atomic64_t disconnects;		/* connections that went down */
} jbmt_net_st;

/* ---- peers -------------------------------------------------------------- */

/* Free p's receive buffers (unmapped): at the end, or once it is torn. */
static void jbmt_peer_free_rx(struct jbmt_peer *p)
{
	int i;

	if (p->rx)
		for (i = 0; i < JBMT_RECV_DEPTH; i++)
			kfree(p->rx[i].data);
	kfree(p->rx);
	p->rx = NULL;
}

void jbmt_peer_put(struct jbmt_peer *p)
{
	if (refcount_dec_and_test(&p->ref)) {
		xa_destroy(&p->xids);
		xa_destroy(&p->grants);
		jbmt_peer_free_rx(p);
		kfree(p);
		atomic_dec(&jbmt_peers_alive);
	}
}

/* The peer with this id, held, or NULL. */
struct jbmt_peer *jbmt_peer_get(u32 id)
{
	struct jbmt_peer *p;

	mutex_lock(&jbmt_net_mutex);
	p = xa_load(&jbmt_peers, id);
	if (p)
		refcount_inc(&p->ref);
	mutex_unlock(&jbmt_net_mutex);
	return p;
}

bool jbmt_peer_enter(struct jbmt_peer *p)
{
	unsigned long flags;
	bool ok;

	spin_lock_irqsave(&p->lock, flags);
	ok = !p->dead && p->cm && p->cm->qp;
	if (ok)
		atomic_inc(&p->users);
	spin_unlock_irqrestore(&p->lock, flags);
	return ok;
}

void jbmt_peer_leave(struct jbmt_peer *p)
{
	if (atomic_dec_and_test(&p->users))
		wake_up_all(&p->wq);
}

/* ---- messages ----------------------------------------------------------- */

struct jbmt_tx *jbmt_tx_alloc_data(struct jbmt_peer *p, u32 len, gfp_t gfp)
{
	struct jbmt_tx *tx;

	if (WARN_ON_ONCE(len > JBMT_INLINE_MAX))
		return NULL;
	tx = kzalloc(struct_size(tx, data, len), gfp);
	if (tx) {
		tx->p = p;
		tx->data_len = len;
	}
	return tx;
}

struct jbmt_tx *jbmt_tx_alloc(struct jbmt_peer *p, gfp_t gfp)
{
	return jbmt_tx_alloc_data(p, 0, gfp);
}

void jbmt_tx_free(struct jbmt_tx *tx)
{
	if (tx && tx->dma)
		ib_dma_unmap_single(tx->p->pd->device, tx->dma,
				    sizeof(tx->msg) + tx->data_len,
				    DMA_TO_DEVICE);
	kfree(tx);
}

/*
 * A WR of p failed: the QP is in error, so the connection is lost (a flush
 * means it was already going).
 */
void jbmt_wc_error(struct jbmt_peer *p, struct ib_wc *wc, const char *what)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_warn_ratelimited("JBMT: %pI4: %s failed: %s (vendor error %#x)\n",
				    &p->addr, what,
				    ib_wc_status_msg(wc->status),
				    wc->vendor_err);
	jbmt_peer_down(p, -ECONNRESET);
}


static void jbmt_tx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct jbmt_tx *tx = container_of(wc->wr_cqe, struct jbmt_tx, cqe);

	if (wc->status != IB_WC_SUCCESS)
		jbmt_wc_error(tx->p, wc, "a send");
	if (tx->done)
		tx->done(tx, wc);
	jbmt_tx_free(tx);
}

int jbmt_tx_prepare(struct jbmt_tx *tx, u32 inv_rkey)
{
	struct ib_device *dev = tx->p->pd->device;

	tx->dma = ib_dma_map_single(dev, &tx->msg,
				    sizeof(tx->msg) + tx->data_len,
				    DMA_TO_DEVICE);
	if (ib_dma_mapping_error(dev, tx->dma)) {
		tx->dma = 0;
		return -ENOMEM;
	}
	tx->sge.addr = tx->dma;
	tx->sge.length = sizeof(tx->msg) + tx->data_len;
	tx->sge.lkey = tx->p->pd->local_dma_lkey;
	tx->cqe.done = jbmt_tx_done;
	tx->wr.wr_cqe = &tx->cqe;
	tx->wr.sg_list = &tx->sge;
	tx->wr.num_sge = 1;
	tx->wr.send_flags = IB_SEND_SIGNALED;
	tx->wr.opcode = inv_rkey ? IB_WR_SEND_WITH_INV : IB_WR_SEND;
	tx->wr.ex.invalidate_rkey = inv_rkey;
	return 0;
}

/*
 * Messages are posted with bottom halves off. A kernel QP's post only
 * schedules the device's send task; on rxe of 6.1 that is a tasklet,
 * which from process context wakes ksoftirqd to run the requester (and,
 * over loopback, the receiving side) after a context switch. With bottom
 * halves off the tasklet runs when they come back on, in this thread, and
 * the completion work it queues for the peer's answer finds this CPU's
 * worker pool already busy (the answer to a small request is handled by
 * the worker that sent it, without a wake-up): a small get takes about
 * 40 % less time. Other devices (rxe of 6.12 on: a work item; hardware)
 * post the same. A section's RDMA writes (rdma_rw_ctx_post) are posted
 * as before: moving them in the poster gained nothing. Process context
 * only, interrupts on.
 */
int jbmt_post_send(struct ib_qp *qp, const struct ib_send_wr *wr)
{
	int ret;

	local_bh_disable();
	ret = ib_post_send(qp, wr, NULL);
	local_bh_enable();
	return ret;
}

int jbmt_send(struct jbmt_peer *p, const struct jbmt_msg *m, u32 inv_rkey)
{
	struct jbmt_tx *tx = jbmt_tx_alloc(p, GFP_KERNEL);
	int ret;

	if (!tx)
		return -ENOMEM;
	tx->msg = *m;
	ret = jbmt_tx_prepare(tx, inv_rkey);
	if (!ret)
		ret = jbmt_post_send(p->cm->qp, &tx->wr);
	if (ret)
		jbmt_tx_free(tx);
	return ret;
}

static int jbmt_rx_post(struct jbmt_rx *rx)
{
	struct ib_sge sge[2] = {
		{
			.addr = rx->dma,
			.length = sizeof(rx->buf),
			.lkey = rx->p->pd->local_dma_lkey,
		}, {
			.addr = rx->data_dma,
			.length = JBMT_INLINE_MAX,
			.lkey = rx->p->pd->local_dma_lkey,
		},
	};
	struct ib_recv_wr wr = {
		.wr_cqe = &rx->cqe,
		.sg_list = sge,
		.num_sge = ARRAY_SIZE(sge),
	};

	return ib_post_recv(rx->p->cm->qp, &wr, NULL);
}

void jbmt_rx_repost(struct jbmt_rx *rx)
{
	if (READ_ONCE(rx->p->dead))
		return;		/* drained: the QP is going */
	if (rx->data_len)
		ib_dma_sync_single_for_device(rx->p->pd->device, rx->data_dma,
					      rx->data_len, DMA_FROM_DEVICE);
	rx->data_len = 0;
	if (jbmt_rx_post(rx))
		jbmt_peer_down(rx->p, -ECONNRESET);
}

static void jbmt_rx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct jbmt_rx *rx = container_of(wc->wr_cqe, struct jbmt_rx, cqe);
	struct jbmt_peer *p = rx->p;

	if (wc->status != IB_WC_SUCCESS) {
		jbmt_wc_error(p, wc, "a receive");
		return;
	}
	ib_dma_sync_single_for_cpu(p->pd->device, rx->dma, sizeof(rx->buf),
				   DMA_FROM_DEVICE);
	/* a header, and data whose length each message's handler checks */
	if (wc->byte_len < sizeof(rx->buf) ||
	    wc->byte_len > sizeof(rx->buf) + JBMT_INLINE_MAX) {
		pr_warn_ratelimited("JBMT: %pI4: a %u-byte message\n",
				    &p->addr, wc->byte_len);
		jbmt_peer_down(p, -EPROTO);
		return;
	}
	rx->data_len = wc->byte_len - sizeof(rx->buf);
	if (rx->data_len)
		ib_dma_sync_single_for_cpu(p->pd->device, rx->data_dma,
					   rx->data_len, DMA_FROM_DEVICE);
	WRITE_ONCE(p->rx_count, p->rx_count + 1);	/* the probe's clock */
	rx->msg = rx->buf;
	rx->wc_flags = wc->wc_flags;
	rx->inv_rkey = wc->wc_flags & IB_WC_WITH_INVALIDATE ?
		       wc->ex.invalidate_rkey : 0;
	ib_dma_sync_single_for_device(p->pd->device, rx->dma, sizeof(rx->buf),
				      DMA_FROM_DEVICE);
	/* the data stays in place until the buffer is posted again */
	switch (rx->msg.type) {
	case JBMT_MSG_GRANT:
	case JBMT_MSG_DONE:
		/* a response: it only wakes the section's operation */
		jbmt_xfer_response(p, rx);
		jbmt_rx_repost(rx);
		break;
	case JBMT_MSG_PING:
		jbmt_rx_repost(rx);	/* it only had to arrive */
		break;
	default:
		/*
		 * A request: served here when its pages are resident, else
		 * in a work item, after which the buffer is posted again.
		 */
		if (!jbmt_peer_enter(p))
			break;
		if (jbmt_xfer_serve_inline(p, rx)) {
			jbmt_rx_repost(rx);
			jbmt_peer_leave(p);
		} else {
			queue_work(jbmt_xfer_wq, &rx->work);
		}
		break;
	}
}

/* ---- peers -------------------------------------------------------------- */

/* Free p's verbs resources, once. Any context that may sleep. */
static void jbmt_peer_free_ib(struct jbmt_peer *p, bool destroy_id)
{
	unsigned long flags;
	int i;

	spin_lock_irqsave(&p->lock, flags);
	p->dead = true;			/* nobody enters now */
	spin_unlock_irqrestore(&p->lock, flags);
	wake_up_all(&p->wq);		/* operations waiting for credits */
	cancel_delayed_work_sync(&p->probe);	/* even as it requeues */
	if (p->cm && p->cm->qp) {
		/* registrations first: their completions post on the QP */
		if (p->regqp_ready)
			ib_drain_qp(p->regqp);
		/* every posted request completes, flushed if need be */
		ib_drain_qp(p->cm->qp);
		jbmt_xfer_fail_peer(p);
		wait_event(p->wq, !atomic_read(&p->users));
		jbmt_xfer_release_grants(p);
		ib_mr_pool_destroy(p->cm->qp, &p->mrs);
		rdma_destroy_qp(p->cm);
	}
	if (p->regqp)
		ib_destroy_qp(p->regqp);
	p->regqp = NULL;
	p->regqp_ready = false;
	if (p->rx) {
		for (i = 0; i < JBMT_RECV_DEPTH; i++) {
			if (p->rx[i].dma)
				ib_dma_unmap_single(p->pd->device, p->rx[i].dma,
						    sizeof(p->rx[i].buf),
						    DMA_FROM_DEVICE);
			if (p->rx[i].data_dma)
				ib_dma_unmap_single(p->pd->device,
						    p->rx[i].data_dma,
						    JBMT_INLINE_MAX,
						    DMA_FROM_DEVICE);
			p->rx[i].dma = 0;
			p->rx[i].data_dma = 0;
		}
	}
	if (p->cq)
		ib_free_cq(p->cq);
	if (p->pd)
		ib_dealloc_pd(p->pd);
	p->cq = NULL;
	p->pd = NULL;
	if (destroy_id && p->cm)
		rdma_destroy_id(p->cm);	/* waits for its handler */
	p->cm = NULL;
}

/* Claim p's teardown: false if someone else has. */
static bool jbmt_peer_claim(struct jbmt_peer *p)
{
	unsigned long flags;
	bool mine;

	spin_lock_irqsave(&p->lock, flags);
	mine = !p->torn;
	p->torn = true;
	spin_unlock_irqrestore(&p->lock, flags);
	return mine;
}

/* Take p out of the table; jbmt_net_mutex held. */
static void jbmt_peer_unlink(struct jbmt_peer *p)
{
	if (list_empty(&p->node))
		return;
	list_del_init(&p->node);
	xa_erase(&jbmt_peers, p->id);
	jbmt_npeers--;
	jbmt_peer_put(p);		/* the table's reference */
}

/*
 * Whether cm's port could not send a message now: it is not ACTIVE, or
 * its network device is not up. The device goes down first when its
 * link is taken down: routes through it fail from then on (rxe's sends
 * too), and rxe marks its port down only in the notifier that follows.
 */
static bool jbmt_cm_port_down(struct rdma_cm_id *cm)
{
	int ifindex = cm->route.addr.dev_addr.bound_dev_if;
	struct net_device *ndev;
	enum ib_port_state state;
	bool up;

	if (!cm->device)
		return false;
	if (!ib_get_cached_port_state(cm->device, cm->port_num, &state) &&
	    state != IB_PORT_ACTIVE)
		return true;
	if (!ifindex)
		return false;
	rcu_read_lock();
	ndev = dev_get_by_index_rcu(cm->route.addr.dev_addr.net, ifindex);
	up = ndev && netif_running(ndev);
	rcu_read_unlock();
	return !up;
}

/*
 * Keep cm, the id of p (torn, its verbs resources freed), until its port
 * is up again: destroying it now would make the CM send a DREQ (a DREP,
 * a REJ) on a port that cannot send, and rxe then moves its QP1 to the
 * error state, for good (ib_mad only takes a QP1 out of SQE, and rxe's
 * error flushes QP1's receives, which ib_mad does not post again): that
 * device would take no connection until it is deleted and added again.
 * False if p's device is going or the module is: the caller destroys cm.
 */
static bool jbmt_park(struct jbmt_peer *p, struct rdma_cm_id *cm)
{
	mutex_lock(&jbmt_net_mutex);
	if (p->removed || jbmt_park_closed) {
		mutex_unlock(&jbmt_net_mutex);
		return false;
	}
	refcount_inc(&p->ref);		/* the list's */
	p->park_cm = cm;
	p->kept = true;
	p->park_active = 0;
	list_add_tail(&p->park_node, &jbmt_parked);
	queue_delayed_work(jbmt_wq, &jbmt_park_work,
			   msecs_to_jiffies(JBMT_PARK_MS));
	mutex_unlock(&jbmt_net_mutex);
	pr_info_ratelimited("JBMT: connection %s %pI4:%u: its port is down, the connection manager's id is kept until it is up\n",
			    p->inbound ? "from" : "to", &p->addr,
			    ntohs(p->port));
	return true;
}

/* Take p off jbmt_parked onto list; jbmt_net_mutex held. */
static void jbmt_unpark(struct jbmt_peer *p, struct list_head *list)
{
	p->kept = false;
	list_move_tail(&p->park_node, list);
}

/* Destroy the ids of the peers on list (taken off jbmt_parked). */
static void jbmt_park_release(struct list_head *list)
{
	struct jbmt_peer *p, *n;

	list_for_each_entry_safe(p, n, list, park_node) {
		list_del_init(&p->park_node);
		rdma_destroy_id(p->park_cm);	/* its DREQ or DREP, now */
		p->park_cm = NULL;
		jbmt_peer_put(p);		/* the list's */
	}
}

/* Destroy the kept ids whose port has been up for JBMT_PARK_TICKS. */
static void jbmt_park_tick(struct work_struct *w)
{
	struct jbmt_peer *p, *n;
	LIST_HEAD(ready);

	mutex_lock(&jbmt_net_mutex);
	list_for_each_entry_safe(p, n, &jbmt_parked, park_node) {
		if (jbmt_cm_port_down(p->park_cm))
			p->park_active = 0;
		else if (++p->park_active >= JBMT_PARK_TICKS)
			jbmt_unpark(p, &ready);
	}
	if (!list_empty(&jbmt_parked) && !jbmt_park_closed)
		queue_delayed_work(jbmt_wq, &jbmt_park_work,
				   msecs_to_jiffies(JBMT_PARK_MS));
	mutex_unlock(&jbmt_net_mutex);
	jbmt_park_release(&ready);
}

static void jbmt_peer_teardown_work(struct work_struct *w)
{
	struct jbmt_peer *p = container_of(w, struct jbmt_peer, teardown);
	struct rdma_cm_id *cm;
	bool park;

	mutex_lock(&jbmt_net_mutex);
	jbmt_peer_unlink(p);
	mutex_unlock(&jbmt_net_mutex);
	if (jbmt_peer_claim(p)) {
		cm = p->cm;
		/* an id that never sent or took a REQ goes without a message */
		park = cm && READ_ONCE(p->cm_talked) && jbmt_cm_port_down(cm);
		if (cm && !park)
			rdma_disconnect(cm);
		jbmt_peer_free_ib(p, !park);
		if (park) {
			jbmt_peer_free_rx(p);	/* not needed while kept */
			if (!jbmt_park(p, cm))
				rdma_destroy_id(cm);
		}
	}
	jbmt_peer_put(p);		/* the work's reference */
}

/* Mark p down with err and have it torn down; any context. */
void jbmt_peer_down(struct jbmt_peer *p, int err)
{
	unsigned long flags;
	bool was_up, first;

	spin_lock_irqsave(&p->lock, flags);
	was_up = p->state == JBMT_PEER_UP;
	first = p->state != JBMT_PEER_DOWN;
	p->state = JBMT_PEER_DOWN;
	if (!p->err)
		p->err = err;
	spin_unlock_irqrestore(&p->lock, flags);
	if (!first)
		return;
	if (was_up) {
		atomic64_dec(&jbmt_net_st.peers);
		atomic64_inc(&jbmt_net_st.disconnects);
		pr_info_ratelimited("JBMT: connection %s %pI4:%u down (%d)\n",
				    p->inbound ? "from" : "to", &p->addr,
				    ntohs(p->port), err);
	} else {
		atomic64_inc(&jbmt_net_st.connect_errors);
	}
	complete_all(&p->done);
	wake_up_all(&p->wq);
	refcount_inc(&p->ref);
	if (!queue_work(jbmt_wq, &p->teardown))
		jbmt_peer_put(p);
}

static void jbmt_probe_done(struct jbmt_tx *tx, struct ib_wc *wc)
{
	struct jbmt_peer *p = tx->p;
	unsigned long flags;

	spin_lock_irqsave(&p->lock, flags);
	p->probing = false;
	spin_unlock_irqrestore(&p->lock, flags);
}

/* Send p a PING; p entered. */
static int jbmt_probe_send(struct jbmt_peer *p)
{
	struct jbmt_tx *tx = jbmt_tx_alloc(p, GFP_KERNEL);
	int ret;

	if (!tx)
		return -ENOMEM;
	tx->msg.type = JBMT_MSG_PING;
	tx->done = jbmt_probe_done;
	ret = jbmt_tx_prepare(tx, 0);
	if (!ret)
		ret = jbmt_post_send(p->cm->qp, &tx->wr);
	if (ret)
		jbmt_tx_free(tx);
	return ret;
}

/*
 * The probe's tick (docs/jbmt.md, "Connections"): with our sections in
 * flight and nothing received from p for a whole period, a PING. If p is
 * unreachable its retries run out and the QP fails (jbmt_tx_done), which
 * fails those sections: an operation waiting for answers learns within
 * about a period and the QP's retries. It stops when p's resources go
 * (jbmt_peer_free_ib cancels it).
 */
static void jbmt_peer_probe_work(struct work_struct *w)
{
	struct jbmt_peer *p = container_of(to_delayed_work(w),
					   struct jbmt_peer, probe);
	unsigned int seen = READ_ONCE(p->rx_count);
	unsigned long flags;
	bool send;
	int ret = -ENOTCONN;

	spin_lock_irqsave(&p->lock, flags);
	send = p->state == JBMT_PEER_UP && !p->dead && p->inflight &&
	       !p->probing && seen == p->probe_seen;
	p->probe_seen = seen;
	p->probing |= send;
	spin_unlock_irqrestore(&p->lock, flags);
	if (send) {
		if (jbmt_peer_enter(p)) {
			ret = jbmt_probe_send(p);
			jbmt_peer_leave(p);
		}
		if (ret) {
			spin_lock_irqsave(&p->lock, flags);
			p->probing = false;
			spin_unlock_irqrestore(&p->lock, flags);
		}
	}
	if (!READ_ONCE(p->dead))
		queue_delayed_work(jbmt_wq, &p->probe,
				   msecs_to_jiffies(JBMT_PROBE_MS));
}

static struct jbmt_peer *jbmt_peer_new(__be32 addr, __be16 port, bool inbound)
{
	struct jbmt_peer *p = kzalloc(sizeof(*p), GFP_KERNEL);

	if (!p)
		return NULL;
	p->rx = kcalloc(JBMT_RECV_DEPTH, sizeof(*p->rx), GFP_KERNEL);
	if (!p->rx) {
		kfree(p);
		return NULL;
	}
	INIT_LIST_HEAD(&p->node);
	INIT_LIST_HEAD(&p->park_node);
	p->addr = addr;
	p->port = port;
	p->inbound = inbound;
	spin_lock_init(&p->lock);
	init_waitqueue_head(&p->wq);
	init_completion(&p->done);
	INIT_LIST_HEAD(&p->mrs);
	xa_init_flags(&p->xids, XA_FLAGS_ALLOC1);
	xa_init_flags(&p->grants, XA_FLAGS_ALLOC1);
	INIT_WORK(&p->teardown, jbmt_peer_teardown_work);
	INIT_DELAYED_WORK(&p->probe, jbmt_peer_probe_work);
	refcount_set(&p->ref, 1);
	atomic_inc(&jbmt_peers_alive);
	return p;
}

/*
 * Put p in the table, which takes over the reference p was made with:
 * -ENOSPC beyond max_jbmt_peers (every user of the host shares them);
 * jbmt_net_mutex held.
 */
static int jbmt_peer_link(struct jbmt_peer *p)
{
	int ret;

	if (jbmt_npeers >= READ_ONCE(max_jbmt_peers))
		return -ENOSPC;
	ret = xa_alloc_cyclic(&jbmt_peers, &p->id, p, xa_limit_31b,
			      &jbmt_next_peer, GFP_KERNEL);
	if (ret < 0)
		return ret;
	jbmt_npeers++;
	list_add_tail(&p->node, &jbmt_peers_list);
	return 0;
}

/* Post every receive of p, and make its sinks. */
static int jbmt_peer_post_rx(struct jbmt_peer *p)
{
	struct ib_device *dev = p->pd->device;
	int i, ret;

	for (i = 0; i < JBMT_RECV_DEPTH; i++) {
		struct jbmt_rx *rx = &p->rx[i];

		rx->p = p;
		rx->cqe.done = jbmt_rx_done;
		INIT_WORK(&rx->work, jbmt_xfer_request);
		rx->dma = ib_dma_map_single(dev, &rx->buf, sizeof(rx->buf),
					    DMA_FROM_DEVICE);
		if (ib_dma_mapping_error(dev, rx->dma)) {
			rx->dma = 0;
			return -ENOMEM;
		}
		if (!rx->data)
			rx->data = kmalloc(JBMT_INLINE_MAX, GFP_KERNEL);
		if (!rx->data)
			return -ENOMEM;
		rx->data_dma = ib_dma_map_single(dev, rx->data, JBMT_INLINE_MAX,
						 DMA_FROM_DEVICE);
		if (ib_dma_mapping_error(dev, rx->data_dma)) {
			rx->data_dma = 0;
			return -ENOMEM;
		}
		ret = jbmt_rx_post(rx);
		if (ret)
			return ret;
	}
	/* our gets' sinks, and the sinks granted to the peer's puts */
	ret = ib_mr_pool_init(p->cm->qp, &p->mrs, 2 * JBMT_CREDITS,
			      IB_MR_TYPE_MEM_REG, JBMT_SECT_SPAN, 0);
	if (!ret)
		p->nmrs = 2 * JBMT_CREDITS;
	return ret;
}

static void jbmt_qp_event(struct ib_event *ev, void *ctx)
{
	struct jbmt_peer *p = ctx;

	switch (ev->event) {
	case IB_EVENT_QP_FATAL:
	case IB_EVENT_QP_REQ_ERR:
	case IB_EVENT_QP_ACCESS_ERR:
		pr_warn_ratelimited("JBMT: %pI4: %s\n", &p->addr,
				    ib_event_msg(ev->event));
		jbmt_peer_down(p, -ECONNRESET);
		break;
	default:
		break;
	}
}

/*
 * A PD, a CQ and an RC QP on cm's device for p, its receives posted. The
 * send queue holds every WR of a full window each way (a get's sink
 * registration and request, a put's request, its writes and FIN, and
 * as much as the peer's sections need of us) and the drain's.
 */
static int jbmt_peer_create_qp(struct jbmt_peer *p, struct rdma_cm_id *cm)
{
	struct ib_device *dev = cm->device;
	u32 writes, send_wr;
	struct ib_qp_init_attr attr = {
		.cap = {
			.max_recv_wr = JBMT_RECV_DEPTH + 1,
			.max_recv_sge = 2,	/* a header, data */
			.max_rdma_ctxs = 2 * JBMT_CREDITS,
		},
		.sq_sig_type = IB_SIGNAL_REQ_WR,
		.qp_type = IB_QPT_RC,
		.port_num = cm->port_num,
	};
	int ret;

	attr.event_handler = jbmt_qp_event;
	attr.qp_context = p;
	p->max_sge = clamp_t(u32, dev->attrs.max_send_sge, 1, 16);
	writes = DIV_ROUND_UP(JBMT_SECT_SPAN, p->max_sge);
	send_wr = JBMT_CREDITS * (2 * writes + 5) + 2;	/* a PING, a drain */
	attr.cap.max_send_wr = send_wr;
	attr.cap.max_send_sge = p->max_sge;
	p->pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(p->pd)) {
		ret = PTR_ERR(p->pd);
		p->pd = NULL;
		return ret;
	}
	p->cq = ib_alloc_cq(dev, p, send_wr + JBMT_RECV_DEPTH + 2 +
			    JBMT_REG_DEPTH + 2, 0, IB_POLL_WORKQUEUE);
	if (IS_ERR(p->cq)) {
		ret = PTR_ERR(p->cq);
		p->cq = NULL;
		return ret;
	}
	attr.send_cq = p->cq;
	attr.recv_cq = p->cq;
	ret = rdma_create_qp(cm, p->pd, &attr);
	if (ret)
		return ret;
	memset(&attr, 0, sizeof(attr));
	attr.event_handler = jbmt_qp_event;
	attr.qp_context = p;
	attr.send_cq = p->cq;
	attr.recv_cq = p->cq;
	attr.cap.max_send_wr = JBMT_REG_DEPTH + 1;	/* and a drain's */
	attr.cap.max_recv_wr = 1;			/* a drain's */
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;	/* rxe registers on RC QPs only */
	attr.port_num = cm->port_num;
	p->regqp = ib_create_qp(p->pd, &attr);
	if (IS_ERR(p->regqp)) {
		ret = PTR_ERR(p->regqp);
		p->regqp = NULL;
		return ret;
	}
	return jbmt_peer_post_rx(p);
}

/*
 * Bring the registration QP to RTS with the connection's attributes, once
 * it is established: it never sends, so where it points does not matter.
 */
static int jbmt_regqp_ready(struct jbmt_peer *p)
{
	static const enum ib_qp_state states[] = {
		IB_QPS_INIT, IB_QPS_RTR, IB_QPS_RTS,
	};
	struct ib_qp_attr qa;
	int i, mask, ret;

	for (i = 0; i < ARRAY_SIZE(states); i++) {
		memset(&qa, 0, sizeof(qa));
		qa.qp_state = states[i];
		ret = rdma_init_qp_attr(p->cm, &qa, &mask);
		if (!ret)
			ret = ib_modify_qp(p->regqp, &qa, mask);
		if (ret)
			return ret;
		/* from INIT on, a drain can take it to ERR */
		p->regqp_ready = true;
	}
	return 0;
}

/* a registration executed: send what follows it */
static void jbmt_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct jbmt_tx *tx = container_of(wc->wr_cqe, struct jbmt_tx, reg_cqe);
	struct jbmt_peer *p = tx->p;

	if (wc->status == IB_WC_SUCCESS && !READ_ONCE(p->dead) &&
	    !jbmt_post_send(p->cm->qp, &tx->wr))
		return;
	if (wc->status != IB_WC_SUCCESS)
		jbmt_wc_error(p, wc, "a registration");
	else
		jbmt_peer_down(p, -ECONNRESET);
	if (tx->done)
		tx->done(tx, wc);
	jbmt_tx_free(tx);
}

int jbmt_post_reg_then(struct jbmt_peer *p, struct ib_reg_wr *reg,
		       struct jbmt_tx *tx)
{
	tx->reg_cqe.done = jbmt_reg_done;
	reg->wr.wr_cqe = &tx->reg_cqe;
	reg->wr.send_flags = IB_SEND_SIGNALED;
	reg->wr.next = NULL;
	return jbmt_post_send(p->regqp, &reg->wr);
}

/*
 * The QP's local ACK timeout, 4.096 us * 2^JBMT_ACK_TIMEOUT (about 0.54 s;
 * rdma_cm would give RoCE 2^19, about 2.1 s), and its retries: a send the
 * peer does not acknowledge fails the QP after JBMT_RETRY_CNT + 1
 * timeouts, about 3.8 s, which bounds how long a lost peer goes unnoticed
 * (with the probe's period, docs/jbmt.md "Failures").
 */
#define JBMT_ACK_TIMEOUT	17
#define JBMT_RETRY_CNT		6

static void jbmt_conn_param(struct rdma_conn_param *cp, struct jbmt_hello *h)
{
	memset(h, 0, sizeof(*h));
	h->magic = cpu_to_be32(JBMT_MAGIC);
	h->version = JBMT_PROTO;
	h->budget = cpu_to_be32(jbmt_pin_budget());
	memset(cp, 0, sizeof(*cp));
	cp->private_data = h;
	cp->private_data_len = sizeof(*h);
	cp->responder_resources = 1;
	cp->initiator_depth = 1;
	/*
	 * Not 7, the most a count can say: rxe takes a retry count of 7 for
	 * "retry for ever", as 7 means for RNR retries, and a peer that is
	 * gone would never fail the QP. An RNR NAK (a receive not posted
	 * again yet) is retried for ever.
	 */
	cp->retry_count = JBMT_RETRY_CNT;
	cp->rnr_retry_count = 7;
}

/* A peer asks to connect: the child id cm gets a peer of its own. */
static int jbmt_accept(struct rdma_cm_id *cm, struct rdma_cm_event *ev)
{
	const struct jbmt_hello *h = ev->param.conn.private_data;
	struct sockaddr_in *sin = (struct sockaddr_in *)&cm->route.addr.dst_addr;
	struct rdma_conn_param cp;
	struct jbmt_hello mine;
	struct jbmt_peer *p;
	int ret;

	if (ev->param.conn.private_data_len < sizeof(*h) ||
	    be32_to_cpu(h->magic) != JBMT_MAGIC || h->version != JBMT_PROTO ||
	    sin->sin_family != AF_INET) {
		rdma_reject(cm, NULL, 0, IB_CM_REJ_CONSUMER_DEFINED);
		return 1;	/* rdma_cm destroys the child id */
	}
	p = jbmt_peer_new(sin->sin_addr.s_addr, sin->sin_port, true);
	if (!p) {
		rdma_reject(cm, NULL, 0, IB_CM_REJ_CONSUMER_DEFINED);
		return 1;
	}
	p->cm = cm;
	p->cm_talked = true;	/* its id ends with a REJ or a DREQ */
	p->remote_budget = max(be32_to_cpu(h->budget), 1U);
	cm->context = p;
	ret = jbmt_peer_create_qp(p, cm);
	if (!ret) {
		mutex_lock(&jbmt_net_mutex);
		ret = jbmt_peer_link(p);
		mutex_unlock(&jbmt_net_mutex);
	}
	if (!ret)
		ret = rdma_set_ack_timeout(cm, JBMT_ACK_TIMEOUT);
	if (!ret) {
		jbmt_conn_param(&cp, &mine);
		ret = rdma_accept(cm, &cp);
	}
	if (ret) {
		bool linked;

		p->torn = true;
		jbmt_peer_free_ib(p, false);
		mutex_lock(&jbmt_net_mutex);
		linked = !list_empty(&p->node);
		jbmt_peer_unlink(p);	/* the table's reference, if linked */
		mutex_unlock(&jbmt_net_mutex);
		if (!linked)
			jbmt_peer_put(p);
		return 1;	/* rdma_cm destroys the child id */
	}
	return 0;
}

/*
 * The device of p (torn) goes: its id, if kept, is rdma_cm's to destroy
 * now (1), which removal waits for; if it is not kept yet, the teardown
 * destroys it instead of keeping it.
 */
static int jbmt_unpark_removed(struct jbmt_peer *p)
{
	bool kept;

	mutex_lock(&jbmt_net_mutex);
	kept = p->kept;
	if (kept) {
		p->kept = false;
		list_del_init(&p->park_node);
		p->park_cm = NULL;
	} else {
		p->removed = true;
	}
	mutex_unlock(&jbmt_net_mutex);
	if (!kept)
		return 0;
	jbmt_peer_put(p);	/* the list's; the handler holds p too */
	return 1;
}

/* jbmt_cm_handler() for a peer's id, p held. */
static int jbmt_cm_event(struct jbmt_peer *p, struct rdma_cm_id *cm,
			 struct rdma_cm_event *ev)
{
	struct rdma_conn_param cp;
	struct jbmt_hello h;
	unsigned long flags;
	bool up;
	int ret;

	/* torn, maybe keeping its id: only the device's removal matters */
	if (READ_ONCE(p->torn) && ev->event != RDMA_CM_EVENT_DEVICE_REMOVAL)
		return 0;

	switch (ev->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		ret = rdma_resolve_route(cm, JBMT_RESOLVE_MS);
		if (ret)
			jbmt_peer_down(p, ret);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		/* no REQ on a port that cannot send it (jbmt_park()) */
		if (jbmt_cm_port_down(cm)) {
			jbmt_peer_down(p, -EHOSTUNREACH);
			break;
		}
		ret = jbmt_peer_create_qp(p, cm);
		if (!ret)
			ret = rdma_set_ack_timeout(cm, JBMT_ACK_TIMEOUT);
		if (!ret) {
			jbmt_conn_param(&cp, &h);
			/* in the handler: its mutex is held */
			ret = rdma_connect_locked(cm, &cp);
			if (!ret)
				WRITE_ONCE(p->cm_talked, true);
		}
		if (ret)
			jbmt_peer_down(p, ret);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (!p->inbound) {	/* the listener's hello */
			const struct jbmt_hello *rh = ev->param.conn.private_data;

			if (ev->param.conn.private_data_len < sizeof(*rh) ||
			    be32_to_cpu(rh->magic) != JBMT_MAGIC) {
				jbmt_peer_down(p, -EPROTO);
				break;
			}
			p->remote_budget = max(be32_to_cpu(rh->budget), 1U);
		}
		ret = jbmt_regqp_ready(p);
		if (ret) {
			jbmt_peer_down(p, ret);
			break;
		}
		spin_lock_irqsave(&p->lock, flags);
		up = p->state == JBMT_PEER_CONNECTING;
		if (up) {
			p->state = JBMT_PEER_UP;
			atomic64_inc(&jbmt_net_st.peers);
			atomic64_inc(p->inbound ? &jbmt_net_st.accepts :
				     &jbmt_net_st.connects);
		}
		spin_unlock_irqrestore(&p->lock, flags);
		if (up) {
			struct ib_qp_init_attr init;
			struct ib_qp_attr qa = {};

			/* what bounds the failure of an unreachable peer */
			if (ib_query_qp(cm->qp, &qa, IB_QP_TIMEOUT |
					IB_QP_RETRY_CNT, &init))
				qa.timeout = qa.retry_cnt = 0;
			pr_info_ratelimited("JBMT: connection %s %pI4:%u up (ACK timeout %u, %u retries)\n",
					    p->inbound ? "from" : "to",
					    &p->addr, ntohs(p->port),
					    qa.timeout, qa.retry_cnt);
			/* not once jbmt_peer_free_ib() may have cancelled it */
			spin_lock_irqsave(&p->lock, flags);
			if (!p->dead)
				queue_delayed_work(jbmt_wq, &p->probe,
						   msecs_to_jiffies(JBMT_PROBE_MS));
			spin_unlock_irqrestore(&p->lock, flags);
		}
		complete_all(&p->done);
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		jbmt_peer_down(p, -EHOSTUNREACH);
		break;
	case RDMA_CM_EVENT_UNREACHABLE:
		jbmt_peer_down(p, -ETIMEDOUT);
		break;
	case RDMA_CM_EVENT_REJECTED:
		jbmt_peer_down(p, -ECONNREFUSED);
		break;
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
		jbmt_peer_down(p, -ECONNRESET);
		break;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		/* free what uses the device now; rdma_cm destroys the id */
		jbmt_peer_down(p, -ENODEV);
		if (jbmt_peer_claim(p)) {
			jbmt_peer_free_ib(p, false);
			return 1;
		}
		return jbmt_unpark_removed(p);
	default:
		break;
	}
	return 0;
}

static int jbmt_cm_handler(struct rdma_cm_id *cm, struct rdma_cm_event *ev)
{
	struct jbmt_peer *p = cm->context;
	int ret;

	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
		return jbmt_accept(cm, ev);
	if (!p)
		return 0;	/* the listener's own events */

	/*
	 * A teardown that another event queued may free p meanwhile unless
	 * it destroys this id, which waits for this call: hold p.
	 */
	refcount_inc(&p->ref);
	ret = jbmt_cm_event(p, cm, ev);
	jbmt_peer_put(p);
	return ret;
}

/* ---- connect ------------------------------------------------------------ */

/*
 * The id of an up connection to addr:port, made now if there is none,
 * waiting at most timeout jiffies. -ETIMEDOUT, -EHOSTUNREACH,
 * -ECONNREFUSED (nothing listens there), -ENOMEM, -EINTR.
 */
static int jbmt_connect_peer(__be32 addr, __be16 port, unsigned long timeout,
			     u32 *id)
{
	struct sockaddr_in sin = {
		.sin_family = AF_INET,
		.sin_addr.s_addr = addr,
		.sin_port = port,
	};
	struct rdma_cm_id *cm;
	struct jbmt_peer *p, *found = NULL;
	long left;
	int ret;

	mutex_lock(&jbmt_net_mutex);
	list_for_each_entry(p, &jbmt_peers_list, node) {
		if (!p->inbound && p->addr == addr && p->port == port &&
		    READ_ONCE(p->state) != JBMT_PEER_DOWN) {
			found = p;
			refcount_inc(&p->ref);
			break;
		}
	}
	if (!found) {
		p = jbmt_peer_new(addr, port, false);
		ret = p ? jbmt_peer_link(p) : -ENOMEM;
		if (ret) {
			if (p)
				jbmt_peer_put(p);
			mutex_unlock(&jbmt_net_mutex);
			return ret;
		}
		refcount_inc(&p->ref);	/* ours, while we wait */
		cm = rdma_create_id(&init_net, jbmt_cm_handler, p, RDMA_PS_TCP,
				    IB_QPT_RC);
		if (IS_ERR(cm)) {
			ret = PTR_ERR(cm);
			jbmt_peer_unlink(p);
			mutex_unlock(&jbmt_net_mutex);
			jbmt_peer_put(p);
			return ret;
		}
		p->cm = cm;
		ret = rdma_resolve_addr(cm, NULL, (struct sockaddr *)&sin,
					JBMT_RESOLVE_MS);
		if (ret)
			jbmt_peer_down(p, ret);
		found = p;
	}
	mutex_unlock(&jbmt_net_mutex);

	p = found;
	left = wait_for_completion_interruptible_timeout(&p->done, timeout);
	if (left < 0) {		/* a signal: the connection goes on */
		jbmt_peer_put(p);
		return -EINTR;
	}
	if (!left && READ_ONCE(p->state) == JBMT_PEER_CONNECTING)
		jbmt_peer_down(p, -ETIMEDOUT);
	spin_lock_irq(&p->lock);
	if (p->state == JBMT_PEER_UP) {
		*id = p->id;
		ret = 0;
	} else {
		ret = p->err ? p->err : -ECONNRESET;
	}
	spin_unlock_irq(&p->lock);
	jbmt_peer_put(p);
	return ret;
}

long rdmaplus_jbmt_connect(void __user *arg)
{
	struct rdmaplus_jbmt_connect a;
	unsigned long timeout;
	long ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if (a.flags || a.reserved || !a.addr || a.peer ||
	    a.timeout_ms > RDMAPLUS_JBMT_CONNECT_MAX_MS)
		return -EINVAL;
	if (!jbmt_listener)
		return -EOPNOTSUPP;
	timeout = msecs_to_jiffies(a.timeout_ms ? a.timeout_ms :
				   RDMAPLUS_JBMT_CONNECT_MAX_MS);
	ret = jbmt_connect_peer(a.addr, a.port ? a.port : htons(jbmt_port),
				timeout, &a.peer);
	if (ret)
		return ret;
	return rdmaplus_copy_out(arg, &a, sizeof(a));
}

/* ---- sysfs and load ----------------------------------------------------- */

#define JBMT_NET_ATTR(name) \
	RDMAPLUS_COUNTER(jbmt_net_attr_##name, name, &jbmt_net_st.name)

JBMT_NET_ATTR(peers);
JBMT_NET_ATTR(connects);
JBMT_NET_ATTR(accepts);
JBMT_NET_ATTR(connect_errors);
JBMT_NET_ATTR(disconnects);

static struct attribute *jbmt_net_attrs[] = {
	&jbmt_net_attr_peers.kattr.attr,
	&jbmt_net_attr_connects.kattr.attr,
	&jbmt_net_attr_accepts.kattr.attr,
	&jbmt_net_attr_connect_errors.kattr.attr,
	&jbmt_net_attr_disconnects.kattr.attr,
	NULL,
};

/* merged into registration's /sys/kernel/rdmaplus/jbmt */
static const struct attribute_group jbmt_net_group = {
	.name = "jbmt",
	.attrs = jbmt_net_attrs,
};

/*
 * Listen on every RDMA device's addresses, now and to come. A failure to
 * listen leaves registration working and CONNECT refused (EOPNOTSUPP).
 */
int rdmaplus_jbmt_net_init(void)
{
	struct sockaddr_in any = {
		.sin_family = AF_INET,
		.sin_addr.s_addr = htonl(INADDR_ANY),
		.sin_port = htons(jbmt_port),
	};
	struct rdma_cm_id *cm;
	int ret;

	jbmt_wq = alloc_workqueue("rdmaplus_jbmt", WQ_UNBOUND, 0);
	if (!jbmt_wq)
		return -ENOMEM;
	ret = sysfs_merge_group(rdmaplus_kobj(), &jbmt_net_group);
	if (ret) {
		destroy_workqueue(jbmt_wq);
		return ret;
	}
	cm = rdma_create_id(&init_net, jbmt_cm_handler, NULL, RDMA_PS_TCP,
			    IB_QPT_RC);
	if (IS_ERR(cm)) {
		pr_warn("JBMT: cannot create a listening id: %ld\n",
			PTR_ERR(cm));
		return 0;
	}
	ret = rdma_bind_addr(cm, (struct sockaddr *)&any);
	if (!ret)
		ret = rdma_listen(cm, 64);
	if (ret) {
		pr_warn("JBMT: cannot listen on port %u: %d\n", jbmt_port, ret);
		rdma_destroy_id(cm);
		return 0;
	}
	jbmt_listener = cm;
	return 0;
}

/* No file is open: no process waits in CONNECT. */
void rdmaplus_jbmt_net_exit(void)
{
	struct jbmt_peer *p, *n;
	LIST_HEAD(gone);

	if (jbmt_listener)
		rdma_destroy_id(jbmt_listener);	/* no new peer after this */
	jbmt_listener = NULL;
	for (;;) {
		mutex_lock(&jbmt_net_mutex);
		p = list_first_entry_or_null(&jbmt_peers_list, struct jbmt_peer,
					     node);
		if (p) {
			refcount_inc(&p->ref);
			jbmt_peer_unlink(p);
		}
		mutex_unlock(&jbmt_net_mutex);
		if (!p)
			break;
		jbmt_peer_down(p, -ESHUTDOWN);
		flush_work(&p->teardown);
		jbmt_peer_put(p);
	}
	/*
	 * Every teardown has run and none keeps an id after this: the kept
	 * ones go now, whatever their port (a port still down loses its
	 * QP1 to their messages, as it would to any connection's end).
	 */
	flush_workqueue(jbmt_wq);
	mutex_lock(&jbmt_net_mutex);
	jbmt_park_closed = true;
	list_for_each_entry_safe(p, n, &jbmt_parked, park_node)
		jbmt_unpark(p, &gone);
	mutex_unlock(&jbmt_net_mutex);
	cancel_delayed_work_sync(&jbmt_park_work);
	jbmt_park_release(&gone);
	destroy_workqueue(jbmt_wq);
	WARN_ON(!xa_empty(&jbmt_peers));
	WARN_ON(atomic_read(&jbmt_peers_alive));	/* a reference leaked */
	sysfs_unmerge_group(rdmaplus_kobj(), &jbmt_net_group);
}
