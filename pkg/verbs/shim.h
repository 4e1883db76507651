/* Small C helpers for package verbs. The data-path verbs of libibverbs are
 * static inline functions and ibv_query_port is a macro, so cgo cannot call
 * them directly; these wrappers also flatten unions so Go never has to
 * address union members. No helper keeps a pointer to Go memory. */
#ifndef RDMAPLUS_VERBS_SHIM_H
#define RDMAPLUS_VERBS_SHIM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* A send work request without unions, filled by Go in C memory. */
struct shim_swr {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	uint64_t bind_addr;
	uint64_t bind_len;
	uintptr_t ah;       /* struct ibv_ah * */
	uintptr_t mw;       /* struct ibv_mw * */
	uintptr_t bind_mr;  /* struct ibv_mr * */
	uint32_t opcode;
	uint32_t flags;
	uint32_t num_sge;
	uint32_t sge_off;   /* index of the first SGE in the SGE array */
	uint32_t imm;       /* host order; converted to network order */
	uint32_t rkey;      /* RDMA/atomic rkey, new rkey for BIND_MW */
	uint32_t remote_qpn;
	uint32_t remote_qkey;
	uint32_t invalidate_rkey;
	uint32_t bind_access;
};

struct shim_rwr {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t sge_off;
};

/* A work completion without unions. */
struct shim_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm;       /* host order */
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t wc_flags;
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
};

struct shim_async {
	uint32_t type;
	uint32_t port;
	uint32_t qp_num;
	uintptr_t obj; /* the ibv_qp, ibv_cq, ibv_srq or ibv_wq pointer */
};

struct shim_cm_event {
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	int32_t event;
	int32_t status;
	uint8_t private_data[256];
	uint32_t private_data_len;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t retry_count;
	uint8_t rnr_retry_count;
	uint32_t qp_num;
};

/* The data-path helpers take the verbs objects and the work request scratch
 * (structures that hold pointers) as uintptr_t: cgo then has no Go-pointer
 * check to run on every call (the objects live in C memory anyway). The
 * noescape and nocallback directives in cgo.go (noescape takes effect only
 * with nocallback) keep the Go int behind "bad" on the caller's stack:
 * none of these helpers keeps it or calls into Go. */
int shim_post_send(uintptr_t qp, struct shim_swr *w, int n, struct ibv_sge *sges, uintptr_t scratch, int *bad);
int shim_post_recv(uintptr_t qp, struct shim_rwr *w, int n, struct ibv_sge *sges, uintptr_t scratch, int *bad);
int shim_post_srq_recv(uintptr_t srq, struct shim_rwr *w, int n, struct ibv_sge *sges, uintptr_t scratch, int *bad);
int shim_spin_cq(uintptr_t cq, int n, struct ibv_wc *raw, struct shim_wc *out, int polls);
int shim_req_notify(uintptr_t cq, int solicited);
int shim_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
int shim_query_device_ex(struct ibv_context *ctx, struct ibv_device_attr_ex *attr);
ssize_t shim_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *e, size_t n);
int shim_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t idx, struct ibv_gid_entry *e);
struct ibv_mw *shim_alloc_mw(struct ibv_pd *pd, int type);
int shim_dealloc_mw(struct ibv_mw *mw);
int shim_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t wr_id, uint32_t flags, uint64_t addr, uint64_t len, uint32_t access, uint32_t *rkey);
int shim_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq);
int shim_get_async_event(struct ibv_context *ctx, struct shim_async *out);
int shim_get_cm_event(struct rdma_event_channel *ch, struct shim_cm_event *out);
int shim_cm_set_ack_timeout(struct rdma_cm_id *id, uint8_t t);
int shim_cm_connect(struct rdma_cm_id *id, const void *pd, uint8_t pdlen, uint8_t rr, uint8_t id_, uint8_t retry, uint8_t rnr);
int shim_cm_accept(struct rdma_cm_id *id, const void *pd, uint8_t pdlen, uint8_t rr, uint8_t id_, uint8_t rnr);
int shim_errno(void);

#endif
