/*
 * attach.c: one connection's attachment (docs/sockets.md, "Data plane",
 * "Demote", "Close and shutdown").
 *
 * An attachable connection (struct att) exists from the moment a
 * connection is established and registered with rvmad. Its RDMA
 * resources exist only while an attachment is live: a CQ and an RC QP,
 * the remote-writable memory (the control block the peer credits into,
 * and the ring it writes into), and the local memory (64-byte receive
 * buffers for records, a scratch page for credits, and the send buffer
 * that keeps every byte put into the peer's ring until it is credited).
 *
 * Every function here runs under a->mu (or before anyone else sees a).
 * Whoever needs the CQ polls it: the program's threads inline, the
 * progress thread for closed connections. The CQ is armed only by a
 * thread about to sleep (it then polls once more, so nothing slips
 * between), which sleeps on the attachment's own completion channel: a
 * reply wakes the thread that waits for it and nobody else. A completion
 * one thread polls on another's behalf (a credit the reader found while
 * a writer sleeps) is passed on through that one's eventfd. Send WRs are
 * signaled one in 16 (and records always): a completion says every WR
 * before it completed too.
 */
#include "rdma.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>

#define WR_RECV		(1ull << 63)

static void tuple_addr(uint8_t out[16], const struct sockaddr_storage *ss, uint16_t *port)
{
	memset(out, 0, 16);
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)ss;

		out[10] = out[11] = 0xff;
		memcpy(out + 12, &in->sin_addr, 4);
		*port = ntohs(in->sin_port);
	} else {
		const struct sockaddr_in6 *in6 = (const void *)ss;

		memcpy(out, &in6->sin6_addr, 16);
		*port = ntohs(in6->sin6_port);
	}
}

/*
 * A new attachable connection for fd (just connected or accepted): its
 * tuple, a private dup of the socket (so that a lingering attachment
 * keeps the connection after the program's close), its eventfds. NULL
 * when any of that fails: the connection stays plain.
 */
struct att *att_new(struct conn *c, int fd, int client)
{
	struct sockaddr_storage l, r;
	socklen_t ll = sizeof(l), rl = sizeof(r);
	uint16_t lp, rp;
	struct att *a;
	int err = errno;

	(void)c;
	if (getsockname(fd, (struct sockaddr *)&l, &ll) < 0 ||
	    REAL(getpeername)(fd, (struct sockaddr *)&r, &rl) < 0 || l.ss_family != r.ss_family)
		goto fail0;
	a = calloc(1, sizeof(*a));
	if (!a)
		goto fail0;
	a->anchor = REAL(fcntl)(fd, F_DUPFD_CLOEXEC, 600);
	if (a->anchor < 0)
		a->anchor = REAL(fcntl)(fd, F_DUPFD_CLOEXEC, 3);
	a->rd_ev = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	a->wr_ev = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (a->anchor < 0 || a->rd_ev < 0 || a->wr_ev < 0)
		goto fail;
	atomic_store(&a->refs, 1);
	pthread_mutex_init(&a->mu, NULL);
	pthread_mutex_init(&a->rmu, NULL);
	pthread_mutex_init(&a->wmu, NULL);
	sockproto_put16(&a->tuple.family, l.ss_family == AF_INET6 ? SOCKPROTO_AF_INET6 : SOCKPROTO_AF_INET);
	tuple_addr(a->tuple.local_addr, &l, &lp);
	tuple_addr(a->tuple.remote_addr, &r, &rp);
	sockproto_put16(&a->tuple.local_port, lp);
	sockproto_put16(&a->tuple.remote_port, rp);
	a->client = client;
	a->pid = getpid();
	a->phase = PHASE_PLAIN;
	a->out = AOUT_TCP;
	a->in = IN_TCP;
	a->fin_in = SOCKPROTO_NO_FIN;
	errno = err;
	return a;
fail:
	if (a->anchor >= 0)
		REAL(close)(a->anchor);
	if (a->rd_ev >= 0)
		REAL(close)(a->rd_ev);
	if (a->wr_ev >= 0)
		REAL(close)(a->wr_ev);
	free(a);
fail0:
	errno = err;
	return NULL;
}

void att_put(struct att *a)
{
	if (atomic_fetch_sub(&a->refs, 1) != 1)
		return;
	pthread_mutex_lock(&a->mu);
	if (a->qp || a->rmem)
		att_release(a);
	if (a->anchor >= 0)
		REAL(close)(a->anchor);
	pthread_mutex_unlock(&a->mu);
	stats_slot_close(a);
	REAL(close)(a->rd_ev);
	REAL(close)(a->wr_ev);
	pthread_mutex_destroy(&a->mu);
	pthread_mutex_destroy(&a->rmu);
	pthread_mutex_destroy(&a->wmu);
	free(a);
}

void att_signal(struct att *a, int rd, int wr)
{
	uint64_t one = 1;
	int err = errno;

	if (rd && REAL(write)(a->rd_ev, &one, sizeof(one)) < 0) {
		/* full counter: already signalled */
	}
	if (wr && REAL(write)(a->wr_ev, &one, sizeof(one)) < 0) {
		/* likewise */
	}
	/* after the write: a drain that sees the mark finds the signal */
	if (rd)
		atomic_store_explicit(&a->rd_sig, 1, memory_order_release);
	if (wr)
		atomic_store_explicit(&a->wr_sig, 1, memory_order_release);
	errno = err;
}

static unsigned ring_log2(void)
{
	const char *e = getenv("RDMAPLUS_SOCKETS_RING_LOG2");
	long v = e ? strtol(e, NULL, 10) : 18;

	if (v < SOCKPROTO_RING_LOG2_MIN || v > 24)
		v = 18;
	return (unsigned)v;
}

static int post_recv(struct att *a, unsigned i)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)a->lmem + ATT_RBUF_OFF + i * ATT_RECV_SZ,
		.length = ATT_RECV_SZ,
		.lkey = a->lmr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = WR_RECV | i, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(a->qp, &wr, &bad);
}

/*
 * The attachment's resources, the QP in INIT with every receive posted.
 * -1 with errno ENODEV (no device has the local address as a RoCE v2
 * GID) or ENOMEM.
 */
int att_setup(struct att *a)
{
	struct ibv_qp_init_attr qia;
	struct ibv_qp_attr qa;
	size_t ring;
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

	if (ibv_dev_get(a->tuple.local_addr, &a->dev, &a->gidx) < 0) {
		errno = ENODEV;
		return -1;
	}
	a->log2 = ring_log2();
	ring = (size_t)1 << a->log2;
	a->rlen = ATT_RING_OFF + ring;
	a->llen = ATT_SBUF_OFF + ring;
	a->rmem = mmap(NULL, a->rlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	a->lmem = mmap(NULL, a->llen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a->rmem == MAP_FAILED || a->lmem == MAP_FAILED) {
		if (a->rmem == MAP_FAILED)
			a->rmem = NULL;
		if (a->lmem == MAP_FAILED)
			a->lmem = NULL;
		goto fail;
	}
	a->rmr = ibv.reg_mr(a->dev->pd, a->rmem, a->rlen, acc);
	a->lmr = ibv.reg_mr(a->dev->pd, a->lmem, a->llen, IBV_ACCESS_LOCAL_WRITE);
	a->chan = ibv.create_comp_channel(a->dev->ctx);
	if (!a->chan)
		goto fail;
	fcntl(a->chan->fd, F_SETFL, fcntl(a->chan->fd, F_GETFL) | O_NONBLOCK);
	fcntl(a->chan->fd, F_SETFD, FD_CLOEXEC);
	a->chan_gen++;
	a->cq = ibv.create_cq(a->dev->ctx, ATT_RQ + ATT_SQ + 16, a, a->chan, 0);
	if (!a->rmr || !a->lmr || !a->cq)
		goto fail;
	memset(&qia, 0, sizeof(qia));
	qia.send_cq = qia.recv_cq = a->cq;
	qia.qp_type = IBV_QPT_RC;
	qia.cap.max_send_wr = ATT_SQ;
	qia.cap.max_recv_wr = ATT_RQ;
	qia.cap.max_send_sge = 1;
	qia.cap.max_recv_sge = 1;
	qia.cap.max_inline_data = 64;
	a->qp = ibv.create_qp(a->dev->pd, &qia);
	if (!a->qp)
		goto fail;
	memset(&qa, 0, sizeof(qa));
	qa.qp_state = IBV_QPS_INIT;
	qa.port_num = 1;
	qa.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv.modify_qp(a->qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		goto fail;
	for (unsigned i = 0; i < ATT_RQ; i++)
		if (post_recv(a, i))
			goto fail;
	a->psn = (uint32_t)(random() & SOCKPROTO_PSN_MAX);
	{
		struct sockproto_ring *h = (void *)((char *)a->rmem + ATT_RHDR_OFF);

		sockproto_put32(&h->magic, SOCKPROTO_RING_MAGIC);
		sockproto_put16(&h->version, SOCKPROTO_VERSION);
		h->log2size = (uint8_t)a->log2;
		sockproto_put32(&h->epoch, a->epoch);
		sockproto_put64(&h->fin, SOCKPROTO_NO_FIN);
	}
	a->sq_posted = a->sq_done = a->sq_signaled = 0;
	a->qp_dead = 0;
	if (a->ep_regs > 0) {
		ibv_req_notify_cq(a->cq, 0);
		progress_watch(a);
	}
	a->credit = a->credited = a->peer_blocked = a->blocked_sent = 0;
	a->fin_in = SOCKPROTO_NO_FIN;
	a->fin_sent = 0;
	return 0;
fail:
	att_release(a);
	errno = ENOMEM;
	return -1;
}

void att_local_endpoint(struct att *a, struct sockproto_endpoint *ep)
{
	union ibv_gid g;

	memset(ep, 0, sizeof(*ep));
	if (ibv.query_gid(a->dev->ctx, 1, a->gidx, &g) == 0)
		memcpy(ep->gid, g.raw, 16);
	sockproto_put32(&ep->qpn, a->qp->qp_num);
	sockproto_put32(&ep->psn, a->psn);
	sockproto_put64(&ep->ring_addr, (uintptr_t)att_ring(a));
	sockproto_put32(&ep->ring_rkey, a->rmr->rkey);
	ep->ring_log2 = (uint8_t)a->log2;
	ep->mtu = (uint8_t)(a->dev->mtu >= SOCKPROTO_MTU_MIN && a->dev->mtu <= SOCKPROTO_MTU_MAX ?
			    a->dev->mtu : IBV_MTU_1024);
	sockproto_put64(&ep->ctrl_addr, (uintptr_t)att_ctrl(a));
	sockproto_put32(&ep->ctrl_rkey, a->rmr->rkey);
}

/* The QP to RTR and RTS towards the peer's endpoint. */
int att_connect(struct att *a, const struct sockproto_endpoint *p)
{
	struct ibv_qp_attr qa;
	int mtu = p->mtu < a->dev->mtu ? p->mtu : a->dev->mtu;

	a->peer = *p;
	a->peer_ring = sockproto_get64(&p->ring_addr);
	a->peer_ring_rkey = sockproto_get32(&p->ring_rkey);
	a->peer_ctrl = sockproto_get64(&p->ctrl_addr);
	a->peer_ctrl_rkey = sockproto_get32(&p->ctrl_rkey);
	a->win = (uint64_t)1 << (p->ring_log2 < a->log2 ? p->ring_log2 : a->log2);
	memset(&qa, 0, sizeof(qa));
	qa.qp_state = IBV_QPS_RTR;
	qa.path_mtu = mtu;
	qa.dest_qp_num = sockproto_get32(&p->qpn);
	qa.rq_psn = sockproto_get32(&p->psn);
	qa.max_dest_rd_atomic = 1;
	qa.min_rnr_timer = 12;
	qa.ah_attr.is_global = 1;
	memcpy(qa.ah_attr.grh.dgid.raw, p->gid, 16);
	qa.ah_attr.grh.sgid_index = (uint8_t)a->gidx;
	qa.ah_attr.grh.hop_limit = 64;
	qa.ah_attr.port_num = 1;
	if (ibv.modify_qp(a->qp, &qa, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	memset(&qa, 0, sizeof(qa));
	qa.qp_state = IBV_QPS_RTS;
	qa.timeout = 17;	/* 0.54 s a try: a busy host is not a dead one */
	qa.retry_cnt = 6;	/* rxe retries 7 forever: a dead peer must fail the QP */
	qa.rnr_retry = 7;
	qa.sq_psn = a->psn;
	qa.max_rd_atomic = 1;
	return ibv.modify_qp(a->qp, &qa, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) ? -1 : 0;
}

/* Room for one more send WR: poll the CQ for at most 2 s. 0: room. */
static int sq_room(struct att *a)
{
	struct timespec t0, t;

	if (a->sq_posted - a->sq_done < ATT_SQ)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (a->sq_posted - a->sq_done >= ATT_SQ && !a->qp_dead) {
		att_poll_cq(a);
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 2)
			return -1;
		sched_yield();
	}
	return a->qp_dead ? -1 : 0;
}

static int post(struct att *a, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	uint64_t seq;

	if (a->qp_dead || sq_room(a) < 0)
		return -1;
	seq = a->sq_posted + 1;
	wr->wr_id = seq;
	if (wr->opcode == IBV_WR_SEND || seq % 16 == 0)
		wr->send_flags |= IBV_SEND_SIGNALED;
	if (ibv_post_send(a->qp, wr, &bad))
		return -1;
	a->sq_posted = seq;
	if (wr->send_flags & IBV_SEND_SIGNALED)
		a->sq_signaled = seq;
	return 0;
}

static int post_record(struct att *a, const void *rec, size_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)rec, .length = (uint32_t)len };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_INLINE,
	};

	return post(a, &wr);
}

/* An 8-byte field of the peer's control block, with IMM(CTRL, 8). */
static int post_ctrl(struct att *a, size_t off, uint64_t v)
{
	uint64_t le;
	struct ibv_sge sge = { .addr = (uintptr_t)&le, .length = 8 };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
		.send_flags = IBV_SEND_INLINE,
		.imm_data = htonl(SOCKPROTO_IMM(SOCKPROTO_IMM_CTRL, 8)),
	};

	sockproto_put64(&le, v);
	wr.wr.rdma.remote_addr = a->peer_ctrl + off;
	wr.wr.rdma.rkey = a->peer_ctrl_rkey;
	return post(a, &wr);
}

/* Stream bytes [from, from + len) of the send buffer into the peer's ring. */
int att_post_data(struct att *a, uint64_t from, uint64_t len)
{
	while (len) {
		uint64_t pos = from & (a->win - 1), n = a->win - pos;
		uint64_t rpos = from & (((uint64_t)1 << a->peer.ring_log2) - 1);
		struct ibv_sge sge = { .addr = (uintptr_t)att_sbuf(a) + pos, .lkey = a->lmr->lkey };
		struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE_WITH_IMM };

		if (n > len)
			n = len;
		sge.length = (uint32_t)n;
		wr.imm_data = htonl(SOCKPROTO_IMM(SOCKPROTO_IMM_DATA, n));
		wr.wr.rdma.remote_addr = a->peer_ring + rpos;
		wr.wr.rdma.rkey = a->peer_ring_rkey;
		if (n <= 64)
			wr.send_flags = IBV_SEND_INLINE;
		if (post(a, &wr) < 0)
			return -1;
		stats_rdma_write(a);
		from += n;
		len -= n;
	}
	return 0;
}

static void offset_record(struct sockproto_offset_rec *r, int type, uint32_t epoch, uint64_t off)
{
	sockproto_init(r, (unsigned)type, epoch);
	sockproto_put64(&r->offset, off);
}

/* Under mu and wmu: my outgoing direction goes to the peer's ring. */
void att_switch(struct att *a)
{
	struct sockproto_offset_rec r;

	a->want_switch = 0;
	if (a->out != AOUT_TCP || a->phase != PHASE_ATTACHED || a->shut_wr || a->closing)
		return;
	if (a->forked || a->shared) {
		uint64_t w = 0, rd;

		/* another process may have written: the switch offset must be the kernel's */
		if (kcount_offsets(a->anchor, &w, &rd) < 0 && errno == EAGAIN) {
			a->want_switch = 1;	/* the counts were moving: at the next write */
			return;
		}
		if (w != a->tx) {
			att_demote(a, SOCKPROTO_R_TCP_AFTER_SWITCH);
			return;
		}
	}
	offset_record(&r, SOCKPROTO_SWITCH, a->epoch, a->tx);
	if (post_record(a, &r, sizeof(r)) < 0) {
		att_demote(a, SOCKPROTO_R_QP_ERROR);
		return;
	}
	a->sw_out = a->tx;
	a->out = AOUT_RING;
	stats_slot_sync(a);
	TRACE("SWITCH(%llu) sent", (unsigned long long)a->tx);
}

/* Switch now if no anchor write is under way, else at its end. */
void att_try_switch(struct att *a)
{
	if (pthread_mutex_trylock(&a->wmu) == 0) {
		att_switch(a);
		pthread_mutex_unlock(&a->wmu);
	} else {
		a->want_switch = 1;
	}
}

void att_post_fin(struct att *a)
{
	struct sockproto_offset_rec r;

	if (a->fin_sent || a->out != AOUT_RING)
		return;
	offset_record(&r, SOCKPROTO_FIN, a->epoch, a->tx);
	if (post_record(a, &r, sizeof(r)) == 0)
		a->fin_sent = 1;
}

/*
 * The program closed with bytes it never read, or with SO_LINGER {1, 0}:
 * TCP would reset the connection. ABORT(reason) on the QP (the peer's
 * reads and writes then fail with ECONNRESET), nothing more goes out,
 * and the anchor is closed with SO_LINGER {1, 0}, so that it resets too.
 * Under mu.
 */
void att_abort(struct att *a, int reason)
{
	struct sockproto_reason_rec r;
	struct linger lg = { 1, 0 };

	sockproto_init(&r, SOCKPROTO_ABORT, a->epoch);
	sockproto_put16(&r.reason, (uint16_t)reason);
	if (a->qp && !a->qp_dead && post_record(a, &r, sizeof(r)) == 0)
		TRACE("ABORT sent, reason %d", reason);
	a->fin_sent = 1;
	a->reset = ECONNRESET;
	if (a->anchor >= 0)
		REAL(setsockopt)(a->anchor, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
}

/* Credit the peer for what the program consumed of the ring, when due. */
void att_credit_check(struct att *a)
{
	uint64_t quarter = ((uint64_t)1 << a->log2) / 4;

	if (a->phase != PHASE_ATTACHED || a->in != IN_RING || a->rx <= a->credited || a->qp_dead)
		return;
	if (a->rx - a->credited >= quarter || a->peer_blocked > a->credited ||
	    a->rx == a->fin_in || a->rx == a->prod) {
		if (a->rx - a->credited < quarter && a->rx == a->prod && a->peer_blocked <= a->credited &&
		    a->rx != a->fin_in)
			return;	/* caught up, nobody waits: batch */
		if (post_ctrl(a, offsetof(struct sockproto_ctrl, credit), a->rx) == 0)
			a->credited = a->rx;
	}
}

/* A sender with no room tells the receiver once per offset. */
void att_blocked(struct att *a)
{
	if (a->blocked_sent == a->tx + 1 || a->qp_dead)
		return;
	if (post_ctrl(a, offsetof(struct sockproto_ctrl, blocked), a->tx) == 0)
		a->blocked_sent = a->tx + 1;
}

static void on_record(struct att *a, const unsigned char *p, uint32_t len)
{
	const struct sockproto_hdr *h = (const void *)p;
	uint64_t off;

	if (sockproto_check(p, len) < 0) {
		att_demote(a, SOCKPROTO_R_PROTOCOL);
		return;
	}
	if (sockproto_get32(&h->epoch) != a->epoch || a->phase != PHASE_ATTACHED)
		return;
	switch (h->type) {
	case SOCKPROTO_SWITCH:
		off = sockproto_get64(p + offsetof(struct sockproto_offset_rec, offset));
		if (a->in != IN_TCP || off < a->rx) {
			att_demote(a, SOCKPROTO_R_PROTOCOL);
			return;
		}
		TRACE("SWITCH(%llu) received", (unsigned long long)off);
		a->sw_in = a->prod = off;
		a->credited = off;
		a->in = a->rx == off ? IN_RING : IN_SWITCHING;
		if (!a->client && a->out == AOUT_TCP)
			att_try_switch(a);
		break;
	case SOCKPROTO_FIN:
		off = sockproto_get64(p + offsetof(struct sockproto_offset_rec, offset));
		if (a->in == IN_TCP || off < a->prod) {
			att_demote(a, SOCKPROTO_R_PROTOCOL);
			return;
		}
		a->fin_in = off;
		break;
	case SOCKPROTO_ABORT:
		a->reset = ECONNRESET;
		break;
	default:
		att_demote(a, SOCKPROTO_R_PROTOCOL);
	}
}

/* Poll the CQ dry; the number of completions. */
int att_poll_cq(struct att *a)
{
	struct ibv_wc wc[16];
	int n, total = 0;

	if (!a->cq)
		return 0;
	while ((n = ibv_poll_cq(a->cq, 16, wc)) > 0) {
		total += n;
		for (int i = 0; i < n; i++) {
			struct ibv_wc *w = &wc[i];

			if (!(w->wr_id & WR_RECV)) {
				if (w->wr_id > a->sq_done)
					a->sq_done = w->wr_id;
				a->chg_wr = 1;
				if (w->status != IBV_WC_SUCCESS && !a->qp_dead) {
					a->qp_dead = 1;
					a->chg_rd = 1;
					if (a->phase == PHASE_ATTACHED)
						att_demote(a, SOCKPROTO_R_QP_ERROR);
				}
				continue;
			}
			if (w->status != IBV_WC_SUCCESS) {
				if (!a->qp_dead) {
					a->qp_dead = 1;
					a->chg_rd = a->chg_wr = 1;
					if (a->phase == PHASE_ATTACHED)
						att_demote(a, SOCKPROTO_R_QP_ERROR);
				}
				continue;
			}
			unsigned idx = (unsigned)(w->wr_id & 0xffff);

			if (w->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
				uint32_t imm = ntohl(w->imm_data);

				if (SOCKPROTO_IMM_TYPE(imm) == SOCKPROTO_IMM_DATA) {
					uint64_t len = SOCKPROTO_IMM_LEN(imm);
					uint64_t cons = a->rx > a->sw_in ? a->rx : a->sw_in;

					if (a->phase != PHASE_ATTACHED || a->in == IN_TCP)
						; /* after a demote: the anchor brings it again */
					else if (a->prod + len - cons > ((uint64_t)1 << a->log2) ||
						 a->prod + len > a->fin_in)
						att_demote(a, SOCKPROTO_R_PROTOCOL);
					else
						a->prod += len;
					a->chg_rd = 1;
				} else if (SOCKPROTO_IMM_TYPE(imm) == SOCKPROTO_IMM_CTRL) {
					struct sockproto_ctrl *c = att_ctrl(a);
					uint64_t cr = sockproto_get64(&c->credit);
					uint64_t bl = sockproto_get64(&c->blocked);

					if (cr > a->credit && cr <= a->tx) {
						a->credit = cr;
						a->chg_wr = 1;
					}
					if (bl > a->peer_blocked)
						a->peer_blocked = bl;
				}
			} else if (w->opcode == IBV_WC_RECV) {
				a->chg_rd = a->chg_wr = 1;
				on_record(a, (unsigned char *)a->lmem + ATT_RBUF_OFF + idx * ATT_RECV_SZ,
					  w->byte_len);
			}
			if (!a->qp_dead && idx < ATT_RQ && post_recv(a, idx))
				a->qp_dead = 1;
		}
	}
	if (a->in == IN_SWITCHING && a->rx == a->sw_in)
		a->in = IN_RING;
	att_credit_check(a);
	{
		/*
		 * A sleeping thread wakes for any change, and looks; an epoll
		 * registration's eventfd says only what is there to report.
		 */
		int rd = a->chg_rd && (a->rd_sleepers ||
				       (a->ep_rd && (att_rd_ready(a) || att_rd_behind(a))));
		int wr = a->chg_wr && (a->wr_sleepers || (a->ep_wr && att_wr_ready(a)));

		if (rd || wr)
			att_signal(a, rd, wr);
	}
	a->chg_rd = a->chg_wr = 0;
	if (a->shut_wr && a->out == AOUT_RING && a->fin_sent && a->credit >= a->tx &&
	    !a->anchor_shut && a->anchor >= 0) {
		REAL(shutdown)(a->anchor, SHUT_WR);
		a->anchor_shut = 1;
	}
	if (a->want_switch)
		att_try_switch(a);
	return total;
}

/*
 * Demote (this side asks): DEMOTE(consumed) through rvmad; the incoming
 * direction reads the anchor only from now on, the outgoing one is held
 * if it had switched. Without rvmad the connection is reset.
 */
void att_demote(struct att *a, int reason)
{
	struct sockproto_demote d;

	if (a->phase != PHASE_ATTACHED && a->phase != PHASE_ATTACHING)
		return;
	sockproto_init(&d, SOCKPROTO_DEMOTE, a->epoch);
	sockproto_put64(&d.consumed, a->rx);
	sockproto_put16(&d.reason, (uint16_t)reason);
	TRACE("DEMOTE sent, reason %d, consumed %llu", reason, (unsigned long long)a->rx);
	a->phase = PHASE_DEMOTING;
	a->in = IN_TCP;
	if (a->out == AOUT_RING)
		a->out = AOUT_HELD;
	a->want_switch = 0;
	if (broker_send_routed(a, &d, sizeof(d)) < 0)
		a->reset = ECONNRESET;
	stats_demote(a, reason);
	att_wake(a);
}

/*
 * The attachment is up (under mu): an epoll set that holds the connection
 * hears of its completions from now on. The CQ is armed; a set that keeps
 * the completion channel in its shadow takes the new channel at its next
 * look, which the eventfds cause; for a nested set the progress thread
 * watches the channel.
 */
void att_ep_attached(struct att *a)
{
	if (!a->ep_regs || !a->cq)
		return;
	ibv_req_notify_cq(a->cq, 0);
	if (a->ep_nested)
		progress_watch(a);
	else
		att_signal(a, a->ep_rd > 0, a->ep_wr > 0);
}

/*
 * The attachment's state changed (under mu): every sleeping thread looks
 * again; an epoll registration hears only of what it would report, or,
 * for writers, that the anchor takes their bytes again (the set then
 * asks the kernel for the anchor's EPOLLOUT), so that a set nested in
 * another never looks readable with nothing to read.
 */
void att_wake(struct att *a)
{
	int rd = a->rd_sleepers || (a->ep_rd && (att_rd_ready(a) || att_rd_behind(a)));
	int wr = a->wr_sleepers || (a->ep_wr && (att_wr_ready(a) || a->out == AOUT_TCP));

	if (rd || wr)
		att_signal(a, rd, wr);
}

/*
 * The peer's DEMOTE(consumed): answer with ours if we had not sent one,
 * then send the kept bytes from max(consumed, my switch) on the anchor
 * and carry on with plain TCP.
 */
void att_on_peer_demote(struct att *a, uint64_t consumed)
{
	if (a->phase == PHASE_ATTACHED) {
		struct sockproto_demote d;

		sockproto_init(&d, SOCKPROTO_DEMOTE, a->epoch);
		sockproto_put64(&d.consumed, a->rx);
		sockproto_put16(&d.reason, SOCKPROTO_R_PEER);
		a->in = IN_TCP;
		if (broker_send_routed(a, &d, sizeof(d)) < 0)
			a->reset = ECONNRESET;
		stats_demote(a, SOCKPROTO_R_PEER);
	}
	a->phase = PHASE_PLAIN;
	a->want_switch = 0;
	if (a->out == AOUT_RING || a->out == AOUT_HELD) {
		uint64_t from = consumed > a->sw_out ? consumed : a->sw_out;

		a->flushed = from > a->tx ? a->tx : from;
		a->out = AOUT_FLUSH;
	}
	att_flush(a);
}

/*
 * AOUT_FLUSH: kept bytes to the anchor, without blocking; then plain TCP
 * (and the anchor shut if the program shut its writing). 1: done.
 */
int att_flush(struct att *a)
{
	uint64_t start = a->flushed;

	while (a->out == AOUT_FLUSH && a->flushed < a->tx) {
		uint64_t pos = a->flushed & (a->win - 1), n = a->win - pos;
		ssize_t r;

		if (n > a->tx - a->flushed)
			n = a->tx - a->flushed;
		r = REAL(send)(a->anchor, att_sbuf(a) + pos, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (r < 0) {
			if (errno == EAGAIN || errno == EINTR) {
				/* the progress thread goes on when the anchor has room */
				if (a->flushed != start && a->wr_sleepers)
					att_signal(a, 0, 1);
				progress_watch(a);
				return 0;
			}
			a->reset = errno == EPIPE ? EPIPE : ECONNRESET;
			a->flushed = a->tx;
			break;
		}
		a->flushed += (uint64_t)r;
	}
	if (a->out == AOUT_FLUSH) {
		a->out = AOUT_TCP;
		if (a->shut_wr || (a->closing && !a->handoff)) {
			REAL(shutdown)(a->anchor, SHUT_WR);
			a->anchor_shut = 1;
		}
		att_signal(a, 0, 1);
		progress_watch(a);
	}
	if (a->phase == PHASE_PLAIN && a->out == AOUT_TCP && a->qp)
		att_release(a);
	return 1;
}

/* Wait (polling) until every send WR completed, at most ms. */
void att_drain_sends(struct att *a, int ms)
{
	struct timespec t0, t;

	if (a->qp && !a->qp_dead && a->sq_posted > a->sq_signaled) {
		/* a signaled WR after the last one: a zero-length write */
		struct ibv_send_wr wr = { .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };

		wr.wr.rdma.remote_addr = a->peer_ctrl;
		wr.wr.rdma.rkey = a->peer_ctrl_rkey;
		if (post(a, &wr) == 0)
			a->sq_signaled = a->sq_posted;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (a->qp && a->sq_done < a->sq_posted && !a->qp_dead) {
		att_poll_cq(a);
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > ms)
			break;
		sched_yield();
	}
}

/*
 * A closed connection (the program has no fd left): FIN on the ring, the
 * anchor shut once nothing more can be asked of it, what still arrives
 * read and dropped; released when both directions ended.
 */
void att_linger_step(struct att *a)
{
	char junk[4096];
	int in_done;

	if (a->anchor < 0)
		return;
	if (a->handoff) {
		/*
		 * Another process may hold the socket: nothing is read or shut
		 * here. Once the demote is through and the kept bytes are on
		 * the anchor, the private copy of the socket is let go.
		 */
		if (a->out == AOUT_FLUSH)
			att_flush(a);
		if (!((a->phase == PHASE_PLAIN && a->out == AOUT_TCP) || a->reset)) {
			progress_watch(a);
			return;
		}
		if (a->qp || a->rmem)
			att_release(a);
		a->closing = 2;
		progress_watch(a);
		REAL(close)(a->anchor);
		a->anchor = -1;
		broker_unregister(a);
		return;
	}
	if (a->cq)
		ibv_req_notify_cq(a->cq, 0);	/* the progress thread hears of what comes */
	att_poll_cq(a);
	if (a->out == AOUT_RING)
		att_post_fin(a);
	if (a->out == AOUT_FLUSH)
		att_flush(a);
	/* a reset closes without FIN: the anchor's RST says it all */
	if (!a->anchor_shut && !a->linger0 && !a->reset && (a->out == AOUT_TCP ||
				(a->out == AOUT_RING && a->credit >= a->tx))) {
		REAL(shutdown)(a->anchor, SHUT_WR);
		a->anchor_shut = 1;
	}
	/*
	 * Bytes that come after the program closed: TCP answers them with a
	 * reset, and so does the shim (the peer's writes then fail, as they
	 * would with TCP); the bytes are dropped either way.
	 */
	if (a->in == IN_RING && a->prod > a->rx && !a->reset && a->phase == PHASE_ATTACHED)
		att_abort(a, SOCKPROTO_R_CLOSE_UNREAD);
	if (a->in == IN_RING || a->in == IN_SWITCHING) {
		if (a->in == IN_SWITCHING)
			a->rx = a->sw_in;
		a->in = IN_RING;
		a->rx = a->prod;
		att_credit_check(a);
	}
	for (;;) {
		ssize_t r = REAL(recv)(a->anchor, junk, sizeof(junk), MSG_DONTWAIT);

		if (r > 0) {
			if (!a->reset && a->phase == PHASE_ATTACHED)
				att_abort(a, SOCKPROTO_R_CLOSE_UNREAD);
			continue;
		}
		if (r == 0 || (errno != EAGAIN && errno != EINTR))
			a->anchor_eof = 1;
		break;
	}
	in_done = a->anchor_eof || (a->in == IN_RING && a->rx == a->fin_in);
	if (a->phase == PHASE_DEMOTING && !a->reset && !a->anchor_eof)
		return;
	if ((a->anchor_shut && in_done) || a->reset || (a->anchor_eof && a->qp_dead)) {
		att_drain_sends(a, 100);
		if (a->qp || a->rmem)
			att_release(a);
		a->closing = 2;		/* done: nothing to watch */
		progress_watch(a);
		REAL(close)(a->anchor);
		a->anchor = -1;
		broker_unregister(a);
		return;
	}
	progress_watch(a);
}

/* Ring bytes, the end or a reset for a reader (under mu). */
int att_rd_ready(struct att *a)
{
	return a->in == IN_RING &&
	       (a->prod > a->rx || a->rx == a->fin_in || a->reset || a->anchor_eof);
}

/*
 * Ring bytes behind the anchor's last ones (under mu): news for an epoll
 * registration (an edge-triggered one reports every arrival, as the
 * kernel does for each segment), though a reader takes the anchor's
 * bytes first.
 */
int att_rd_behind(struct att *a)
{
	return a->in == IN_SWITCHING && a->prod > a->sw_in;
}

/*
 * Room for more of my stream (under mu): in the peer's ring, from the
 * larger of its credit and my switch offset; while flushing, in the send
 * buffer, from what reached the anchor. 0 on TCP.
 */
uint64_t att_send_space(struct att *a)
{
	uint64_t base = a->out == AOUT_FLUSH ? a->flushed :
		(a->credit > a->sw_out ? a->credit : a->sw_out);

	return a->out == AOUT_TCP ? 0 : a->win - (a->tx - base);
}

/* Room in the peer's ring (or the send buffer), or a reset (under mu). */
int att_wr_ready(struct att *a)
{
	return a->out != AOUT_TCP && (att_send_space(a) > 0 || a->reset);
}

/* An epoll registration's eventfds made to say exactly what is there. */
void att_ep_sync(struct att *a)
{
	uint64_t v;

	if (a->ep_rd) {
		if (att_rd_ready(a) || att_rd_behind(a))
			att_signal(a, 1, 0);
		else if (REAL(read)(a->rd_ev, &v, sizeof(v)) < 0) {
			/* not signalled */
		}
	}
	if (a->ep_wr) {
		if (att_wr_ready(a))
			att_signal(a, 0, 1);
		else if (REAL(read)(a->wr_ev, &v, sizeof(v)) < 0) {
			/* not signalled */
		}
	}
}

/* Events of the attachment's channel: taken and acknowledged. */
void att_take_events(struct att *a)
{
	struct ibv_cq *cq;
	void *ctx;

	int n = 0;

	while (a->chan && ibv.get_cq_event(a->chan, &cq, &ctx) == 0) {
		ibv.ack_cq_events(cq, 1);
		n++;
	}
	if (n && a->ep_regs > 0 && a->cq && !a->releasing) {
		/* an epoll set waits on the channel: armed again, and what came */
		ibv_req_notify_cq(a->cq, 0);
		att_poll_cq(a);
	}
}

/*
 * A thread about to wait in poll for this connection (rd: readable, wr:
 * writable): the CQ armed and polled once more; the readiness found now
 * (POLLIN, POLLOUT bits); it counts as a sleeper until att_poll_leave.
 * *chanfd: the completion channel to wait on, or -1.
 */
int att_poll_enter(struct att *a, int rd, int wr, int *chanfd)
{
	int ready = 0;

	pthread_mutex_lock(&a->mu);
	*chanfd = -1;
	if (a->cq) {
		ibv_req_notify_cq(a->cq, 0);
		if (att_poll_cq(a))
			ready |= ATT_POLLED;
		*chanfd = a->chan->fd;
	}
	if (rd && att_rd_ready(a))
		ready |= POLLIN;
	if (wr && att_wr_ready(a))
		ready |= POLLOUT;
	a->rd_sleepers += rd;
	a->wr_sleepers += wr;
	pthread_mutex_unlock(&a->mu);
	return ready;
}

void att_poll_leave(struct att *a, int rd, int wr, int chan_fired)
{
	pthread_mutex_lock(&a->mu);
	a->rd_sleepers -= rd;
	a->wr_sleepers -= wr;
	if (chan_fired)
		att_take_events(a);
	pthread_mutex_unlock(&a->mu);
}

/*
 * The program closed the connection's last fd (under shim_lock, from
 * conn_put): rvmad forgets it, and a plain connection lets go of its
 * private anchor at once; an attached one lingers in the progress thread
 * until both directions ended. Drops the connection's reference.
 */
void att_closed(struct att *a)
{
	pthread_mutex_lock(&a->mu);
	a->closing = 1;
	if (a->phase == PHASE_PLAIN && a->out == AOUT_TCP && !a->qp) {
		broker_unregister(a);
		if (a->anchor >= 0)
			REAL(close)(a->anchor);
		a->anchor = -1;
	} else {
		if ((a->forked || a->shared) && a->phase != PHASE_PLAIN) {
			a->handoff = 1;
			att_demote(a, SOCKPROTO_R_SHUTDOWN);
		} else if (a->phase == PHASE_ATTACHING) {
			/* the acceptor may attach meanwhile: it must hear of this */
			att_demote(a, SOCKPROTO_R_SHUTDOWN);
		}
		att_linger_step(a);
	}
	stats_slot_sync(a);
	pthread_mutex_unlock(&a->mu);
	att_put(a);
}

/* The RDMA resources go (the QP first: nothing lands after), then the device's reference. */
void att_release(struct att *a)
{
	if (a->watched) {
		a->releasing = 1;
		progress_watch(a);	/* leaves the epoll: nothing to watch */
		a->releasing = 0;
	}
	if (a->qp)
		ibv.destroy_qp(a->qp);
	if (a->cq) {
		a->releasing = 1;
		att_take_events(a);
		a->releasing = 0;
		ibv.destroy_cq(a->cq);
	}
	if (a->chan)
		ibv.destroy_comp_channel(a->chan);
	if (a->rmr)
		ibv.dereg_mr(a->rmr);
	if (a->lmr)
		ibv.dereg_mr(a->lmr);
	if (a->rmem)
		munmap(a->rmem, a->rlen);
	if (a->lmem)
		munmap(a->lmem, a->llen);
	a->qp = NULL;
	a->cq = NULL;
	a->chan = NULL;
	a->rmr = a->lmr = NULL;
	a->rmem = a->lmem = NULL;
	if (a->dev)
		ibv_dev_put(a->dev);
	a->dev = NULL;
	a->released = 1;
}
