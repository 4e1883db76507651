#include "shim.h"
#include <arpa/inet.h>

int shim_errno(void) { return errno; }

static void fill_send(struct ibv_send_wr *d, const struct shim_swr *s, struct ibv_sge *sges)
{
	memset(d, 0, sizeof(*d));
	d->wr_id = s->wr_id;
	d->sg_list = s->num_sge ? &sges[s->sge_off] : NULL;
	d->num_sge = (int)s->num_sge;
	d->opcode = (enum ibv_wr_opcode)s->opcode;
	d->send_flags = s->flags;
	switch (s->opcode) {
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		d->imm_data = htonl(s->imm);
		break;
	case IBV_WR_SEND_WITH_INV:
	case IBV_WR_LOCAL_INV:
		d->invalidate_rkey = s->invalidate_rkey;
		break;
	}
	switch (s->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		d->wr.rdma.remote_addr = s->remote_addr;
		d->wr.rdma.rkey = s->rkey;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		d->wr.atomic.remote_addr = s->remote_addr;
		d->wr.atomic.rkey = s->rkey;
		d->wr.atomic.compare_add = s->compare_add;
		d->wr.atomic.swap = s->swap;
		break;
	case IBV_WR_BIND_MW:
		d->bind_mw.mw = (struct ibv_mw *)s->mw;
		d->bind_mw.rkey = s->rkey;
		d->bind_mw.bind_info.mr = (struct ibv_mr *)s->bind_mr;
		d->bind_mw.bind_info.addr = s->bind_addr;
		d->bind_mw.bind_info.length = s->bind_len;
		d->bind_mw.bind_info.mw_access_flags = s->bind_access;
		break;
	}
	if (s->ah) {
		d->wr.ud.ah = (struct ibv_ah *)s->ah;
		d->wr.ud.remote_qpn = s->remote_qpn;
		d->wr.ud.remote_qkey = s->remote_qkey;
	}
}

/* post_result turns a post's return code into an errno and sets *bad to
 * the index of the first request not posted (bad_index), or -1 when all
 * were posted.
 */
static int post_result(int rc, int bad_index, int *bad)
{
	*bad = -1;
	if (rc) {
		*bad = bad_index;
		if (rc < 0)
			rc = errno ? errno : EINVAL;
	}
	return rc;
}

/* Posts n send WRs as one chain; on failure *bad is the index of the first
 * WR not posted and the return value is the errno. */
int shim_post_send(uintptr_t qph, struct shim_swr *w, int n, struct ibv_sge *sges,
		   uintptr_t scratchh, int *bad)
{
	struct ibv_qp *qp = (struct ibv_qp *)qph;
	struct ibv_send_wr *scratch = (struct ibv_send_wr *)scratchh;
	struct ibv_send_wr *badwr = NULL;
	int i, rc;

	for (i = 0; i < n; i++) {
		fill_send(&scratch[i], &w[i], sges);
		scratch[i].next = (i + 1 < n) ? &scratch[i + 1] : NULL;
	}
	rc = ibv_post_send(qp, scratch, &badwr);
	return post_result(rc, badwr ? (int)(badwr - scratch) : 0, bad);
}

static void fill_recv(struct ibv_recv_wr *scratch, struct shim_rwr *w, int n, struct ibv_sge *sges)
{
	int i;

	for (i = 0; i < n; i++) {
		scratch[i].wr_id = w[i].wr_id;
		scratch[i].sg_list = w[i].num_sge ? &sges[w[i].sge_off] : NULL;
		scratch[i].num_sge = (int)w[i].num_sge;
		scratch[i].next = (i + 1 < n) ? &scratch[i + 1] : NULL;
	}
}

int shim_post_recv(uintptr_t qph, struct shim_rwr *w, int n, struct ibv_sge *sges,
		   uintptr_t scratchh, int *bad)
{
	struct ibv_qp *qp = (struct ibv_qp *)qph;
	struct ibv_recv_wr *scratch = (struct ibv_recv_wr *)scratchh;
	struct ibv_recv_wr *badwr = NULL;
	int rc;

	fill_recv(scratch, w, n, sges);
	rc = ibv_post_recv(qp, scratch, &badwr);
	return post_result(rc, badwr ? (int)(badwr - scratch) : 0, bad);
}

int shim_post_srq_recv(uintptr_t srqh, struct shim_rwr *w, int n, struct ibv_sge *sges,
		       uintptr_t scratchh, int *bad)
{
	struct ibv_srq *srq = (struct ibv_srq *)srqh;
	struct ibv_recv_wr *scratch = (struct ibv_recv_wr *)scratchh;
	struct ibv_recv_wr *badwr = NULL;
	int rc;

	fill_recv(scratch, w, n, sges);
	rc = ibv_post_srq_recv(srq, scratch, &badwr);
	return post_result(rc, badwr ? (int)(badwr - scratch) : 0, bad);
}

static void conv_wc(const struct ibv_wc *r, struct shim_wc *o)
{
	o->wr_id = r->wr_id;
	o->status = r->status;
	o->opcode = r->opcode;
	o->vendor_err = r->vendor_err;
	o->byte_len = r->byte_len;
	o->imm = (r->wc_flags & IBV_WC_WITH_IMM) ? ntohl(r->imm_data) :
		 (r->wc_flags & IBV_WC_WITH_INV) ? r->invalidated_rkey : 0;
	o->qp_num = r->qp_num;
	o->src_qp = r->src_qp;
	o->wc_flags = r->wc_flags;
	o->pkey_index = r->pkey_index;
	o->slid = r->slid;
	o->sl = r->sl;
	o->dlid_path_bits = r->dlid_path_bits;
}

/* Polls for up to n completions, up to polls times until one arrives, and
 * converts them into out. Returns their count (0 if none arrived) or the
 * negative errno of ibv_poll_cq. */
int shim_spin_cq(uintptr_t cq, int n, struct ibv_wc *raw, struct shim_wc *out, int polls)
{
	int i, got = 0;

	while (polls-- > 0 && (got = ibv_poll_cq((struct ibv_cq *)cq, n, raw)) == 0)
		;
	if (got < 0)
		return got;
	for (i = 0; i < got; i++)
		conv_wc(&raw[i], &out[i]);
	return got;
}

int shim_req_notify(uintptr_t cq, int solicited)
{
	return ibv_req_notify_cq((struct ibv_cq *)cq, solicited);
}

int shim_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	return ibv_query_port(ctx, port, attr);
}

int shim_query_device_ex(struct ibv_context *ctx, struct ibv_device_attr_ex *attr)
{
	int rc;

	memset(attr, 0, sizeof(*attr));
	rc = ibv_query_device_ex(ctx, NULL, attr);
	if (rc == EOPNOTSUPP || rc == ENOSYS) {
		memset(attr, 0, sizeof(*attr));
		rc = ibv_query_device(ctx, &attr->orig_attr);
	}
	return rc;
}

ssize_t shim_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *e, size_t n)
{
	ssize_t rc = ibv_query_gid_table(ctx, e, n, 0);

	return rc < 0 ? rc : rc;
}

int shim_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t idx, struct ibv_gid_entry *e)
{
	return ibv_query_gid_ex(ctx, port, idx, e, 0);
}

struct ibv_mw *shim_alloc_mw(struct ibv_pd *pd, int type)
{
	return ibv_alloc_mw(pd, (enum ibv_mw_type)type);
}

int shim_dealloc_mw(struct ibv_mw *mw)
{
	return ibv_dealloc_mw(mw);
}

int shim_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t wr_id,
		 uint32_t flags, uint64_t addr, uint64_t len, uint32_t access, uint32_t *rkey)
{
	struct ibv_mw_bind b;
	int rc;

	memset(&b, 0, sizeof(b));
	b.wr_id = wr_id;
	b.send_flags = flags;
	b.bind_info.mr = mr;
	b.bind_info.addr = addr;
	b.bind_info.length = len;
	b.bind_info.mw_access_flags = access;
	rc = ibv_bind_mw(qp, mw, &b);
	*rkey = mw->rkey;
	return rc;
}

/* Returns 0 and the CQ, or an errno (EAGAIN when nothing is pending on a
 * non-blocking channel). The event is acknowledged at once. */
int shim_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq)
{
	void *cq_ctx;

	if (ibv_get_cq_event(ch, cq, &cq_ctx))
		return errno ? errno : EIO;
	ibv_ack_cq_events(*cq, 1);
	return 0;
}

int shim_get_async_event(struct ibv_context *ctx, struct shim_async *out)
{
	struct ibv_async_event ev;

	if (ibv_get_async_event(ctx, &ev))
		return errno ? errno : EIO;
	memset(out, 0, sizeof(*out));
	out->type = ev.event_type;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->obj = (uintptr_t)ev.element.qp;
		out->qp_num = ev.element.qp ? ev.element.qp->qp_num : 0;
		break;
	case IBV_EVENT_CQ_ERR:
		out->obj = (uintptr_t)ev.element.cq;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		out->obj = (uintptr_t)ev.element.srq;
		break;
	case IBV_EVENT_WQ_FATAL:
		out->obj = (uintptr_t)ev.element.wq;
		break;
	default:
		out->port = (uint32_t)ev.element.port_num;
	}
	ibv_ack_async_event(&ev);
	return 0;
}

/* Copies one CM event out and acknowledges it. */
int shim_get_cm_event(struct rdma_event_channel *ch, struct shim_cm_event *out)
{
	struct rdma_cm_event *ev;
	const struct rdma_conn_param *c;

	if (rdma_get_cm_event(ch, &ev))
		return errno ? errno : EIO;
	memset(out, 0, sizeof(*out));
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	out->event = ev->event;
	out->status = ev->status;
	if (ev->id && ev->id->ps != RDMA_PS_UDP && ev->id->ps != RDMA_PS_IPOIB) {
		c = &ev->param.conn;
		if (c->private_data && c->private_data_len) {
			memcpy(out->private_data, c->private_data, c->private_data_len);
			out->private_data_len = c->private_data_len;
		}
		out->responder_resources = c->responder_resources;
		out->initiator_depth = c->initiator_depth;
		out->retry_count = c->retry_count;
		out->rnr_retry_count = c->rnr_retry_count;
		out->qp_num = c->qp_num;
	}
	rdma_ack_cm_event(ev);
	return 0;
}

/* rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT) with the value in C memory. */
int shim_cm_set_ack_timeout(struct rdma_cm_id *id, uint8_t t)
{
	return rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT,
			       &t, sizeof(t)) ? (errno ? errno : EIO) : 0;
}

int shim_cm_connect(struct rdma_cm_id *id, const void *pd, uint8_t pdlen, uint8_t rr,
		    uint8_t id_, uint8_t retry, uint8_t rnr)
{
	struct rdma_conn_param p;

	memset(&p, 0, sizeof(p));
	p.private_data = pdlen ? pd : NULL;
	p.private_data_len = pdlen;
	p.responder_resources = rr;
	p.initiator_depth = id_;
	p.retry_count = retry;
	p.rnr_retry_count = rnr;
	return rdma_connect(id, &p) ? (errno ? errno : EIO) : 0;
}

int shim_cm_accept(struct rdma_cm_id *id, const void *pd, uint8_t pdlen, uint8_t rr,
		   uint8_t id_, uint8_t rnr)
{
	struct rdma_conn_param p;

	memset(&p, 0, sizeof(p));
	p.private_data = pdlen ? pd : NULL;
	p.private_data_len = pdlen;
	p.responder_resources = rr;
	p.initiator_depth = id_;
	p.rnr_retry_count = rnr;
	return rdma_accept(id, &p) ? (errno ? errno : EIO) : 0;
}
