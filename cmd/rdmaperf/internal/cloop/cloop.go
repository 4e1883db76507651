// Package cloop runs perftest's latency loops entirely in C on pkg/verbs
// objects (through their CPtr accessors): one cgo call per run, so the
// figures measure the device and provider the way perftest does.
package cloop

/*
#cgo LDFLAGS: -libverbs
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <infiniband/verbs.h>

static inline uint64_t cyc(void)
{
#if defined(__x86_64__)
	uint32_t lo, hi;
	__asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
	return ((uint64_t)hi << 32) | lo;
#else
	return 0;
#endif
}

static int spin_cq(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(cq, 1, &wc);
	} while (n == 0);
	if (n < 0)
		return -EIO;
	return wc.status == IBV_WC_SUCCESS ? 0 : -1000 - (int)wc.status;
}

// perftest's write latency loop (run_iter_lat_write) in C. send and recv
// are the local send and receive areas; stamps[i] is the time stamp of
// post i. Returns 0, a negative errno, or -1000-status for a failed
// completion.
static int c_write_lat(struct ibv_qp *qp, struct ibv_cq *scq, uint64_t send, uint64_t recv,
		       uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t size, int iters,
		       int client, int cq_mod, int inl, uint64_t *stamps)
{
	volatile uint8_t *post_buf = (volatile uint8_t *)(uintptr_t)(send + size - 1);
	volatile uint8_t *poll_buf = (volatile uint8_t *)(uintptr_t)(recv + size - 1);
	struct ibv_sge sge = { .addr = send, .length = size, .lkey = lkey };
	struct ibv_send_wr wr, *bad;
	int scnt = 0, rcnt = 0, rc;

	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	while (scnt < iters || rcnt < iters) {
		if (rcnt < iters && !(scnt < 1 && client)) {
			rcnt++;
			while (*poll_buf != (uint8_t)rcnt)
				;
		}
		if (scnt < iters) {
			stamps[scnt] = cyc();
			*post_buf = (uint8_t)++scnt;
			wr.send_flags = inl ? IBV_SEND_INLINE : 0;
			if (scnt % cq_mod == 0 || scnt == iters)
				wr.send_flags |= IBV_SEND_SIGNALED;
			rc = ibv_post_send(qp, &wr, &bad);
			if (rc)
				return -rc;
			if (wr.send_flags & IBV_SEND_SIGNALED) {
				rc = spin_cq(scq);
				if (rc)
					return rc;
			}
		}
	}
	return 0;
}

static int c_read_lat(struct ibv_qp *qp, struct ibv_cq *scq, uint64_t recv, uint32_t lkey,
		      uint64_t raddr, uint32_t rkey, uint32_t size, int iters, uint64_t *stamps)
{
	struct ibv_sge sge = { .addr = recv, .length = size, .lkey = lkey };
	struct ibv_send_wr wr, *bad;
	int i, rc;

	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	for (i = 0; i < iters; i++) {
		stamps[i] = cyc();
		rc = ibv_post_send(qp, &wr, &bad);
		if (rc)
			return -rc;
		rc = spin_cq(scq);
		if (rc)
			return rc;
	}
	stamps[iters] = cyc();
	return 0;
}

static int post_recvs(struct ibv_qp *qp, uint64_t recv, uint32_t len, uint32_t lkey, int n)
{
	struct ibv_sge sge = { .addr = recv, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr, *bad;
	int rc;

	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	while (n-- > 0) {
		rc = ibv_post_recv(qp, &wr, &bad);
		if (rc)
			return -rc;
	}
	return 0;
}

// perftest's send latency ping-pong; the receive queue holds rx receives
// on entry and on return.
static int c_send_lat(struct ibv_qp *qp, struct ibv_cq *scq, struct ibv_cq *rcq, uint64_t send,
		      uint64_t recv, uint32_t rlen, uint32_t lkey, uint32_t size, int iters,
		      int client, int cq_mod, int inl, uint64_t *stamps)
{
	struct ibv_sge sge = { .addr = send, .length = size, .lkey = lkey };
	struct ibv_send_wr wr, *bad;
	int i, rc;

	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	for (i = 0; i < iters; i++) {
		if (!client) {
			if ((rc = spin_cq(rcq)) || (rc = post_recvs(qp, recv, rlen, lkey, 1)))
				return rc;
		}
		stamps[i] = cyc();
		wr.send_flags = inl ? IBV_SEND_INLINE : 0;
		if ((i + 1) % cq_mod == 0 || i + 1 == iters)
			wr.send_flags |= IBV_SEND_SIGNALED;
		rc = ibv_post_send(qp, &wr, &bad);
		if (rc)
			return -rc;
		if ((wr.send_flags & IBV_SEND_SIGNALED) && (rc = spin_cq(scq)))
			return rc;
		if (client) {
			if ((rc = spin_cq(rcq)) || (rc = post_recvs(qp, recv, rlen, lkey, 1)))
				return rc;
		}
	}
	return 0;
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

func cErr(rc C.int) error {
	switch {
	case rc == 0:
		return nil
	case rc <= -1000:
		return fmt.Errorf("completion failed: %w", verbs.WCStatus(-1000-int(rc)))
	}
	return fmt.Errorf("ibv_post: errno %d", -int(rc))
}

func stamps(n int) (*C.uint64_t, []uint64) {
	p := (*C.uint64_t)(C.calloc(C.size_t(n), 8))
	return p, unsafe.Slice((*uint64)(unsafe.Pointer(p)), n)
}

func b2i(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Params describe one latency run. Send and Recv are the local send and
// receive areas (inside MR), Remote the peer's receive area.
type Params struct {
	QP         *verbs.QP
	SendCQ     *verbs.CQ
	RecvCQ     *verbs.CQ
	MR         *verbs.MR
	Send, Recv uint64
	RecvLen    int
	Remote     verbs.Remote
	Size       int
	Iters      int
	Client     bool
	CQMod      int
	Inline     bool
}

// WriteLat runs perftest's RDMA WRITE ping-pong and returns the rdtsc time
// stamps of the posts.
func WriteLat(p Params) ([]uint64, error) {
	c, out := stamps(p.Iters)
	defer C.free(unsafe.Pointer(c))
	rc := C.c_write_lat((*C.struct_ibv_qp)(p.QP.CPtr()), (*C.struct_ibv_cq)(p.SendCQ.CPtr()),
		C.uint64_t(p.Send), C.uint64_t(p.Recv), C.uint32_t(p.MR.LKey()),
		C.uint64_t(p.Remote.Addr), C.uint32_t(p.Remote.RKey), C.uint32_t(p.Size), C.int(p.Iters),
		b2i(p.Client), C.int(p.CQMod), b2i(p.Inline), c)
	return append([]uint64(nil), out...), cErr(rc)
}

// ReadLat times RDMA READs of Size bytes from Remote into Recv; it returns
// Iters+1 time stamps (one before each post, one after the last completion).
func ReadLat(p Params) ([]uint64, error) {
	c, out := stamps(p.Iters + 1)
	defer C.free(unsafe.Pointer(c))
	rc := C.c_read_lat((*C.struct_ibv_qp)(p.QP.CPtr()), (*C.struct_ibv_cq)(p.SendCQ.CPtr()),
		C.uint64_t(p.Recv), C.uint32_t(p.MR.LKey()), C.uint64_t(p.Remote.Addr), C.uint32_t(p.Remote.RKey),
		C.uint32_t(p.Size), C.int(p.Iters), c)
	return append([]uint64(nil), out...), cErr(rc)
}

// SendLat runs perftest's SEND ping-pong; the receive queue must hold
// receives of RecvLen bytes at Recv on entry (it does again on return).
func SendLat(p Params) ([]uint64, error) {
	c, out := stamps(p.Iters)
	defer C.free(unsafe.Pointer(c))
	rc := C.c_send_lat((*C.struct_ibv_qp)(p.QP.CPtr()), (*C.struct_ibv_cq)(p.SendCQ.CPtr()), (*C.struct_ibv_cq)(p.RecvCQ.CPtr()),
		C.uint64_t(p.Send), C.uint64_t(p.Recv), C.uint32_t(p.RecvLen), C.uint32_t(p.MR.LKey()),
		C.uint32_t(p.Size), C.int(p.Iters), b2i(p.Client), C.int(p.CQMod), b2i(p.Inline), c)
	return append([]uint64(nil), out...), cErr(rc)
}
