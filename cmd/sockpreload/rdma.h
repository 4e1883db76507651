/*
 * rdma.h: the attachment of RDMA to a connection (docs/sockets.md, "Data
 * plane"): libibverbs loaded on demand (ibv.c), the broker client and
 * the progress thread (progress.c), and the attachment itself
 * (attach.c: resources, records, completions; ring.c: the program's
 * reads and writes once attachable).
 */
#ifndef RDMA_H
#define RDMA_H

#include "shim.h"
#include "sockproto.h"

#include <infiniband/verbs.h>
#include <pthread.h>

/* ---- ibv.c ---- */

struct ibv_fns {
	struct ibv_device **(*get_device_list)(int *n);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *dev);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *ctx);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
	int (*destroy_comp_channel)(struct ibv_comp_channel *chan);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_ctx,
				    struct ibv_comp_channel *chan, int vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	int (*get_cq_event)(struct ibv_comp_channel *chan, struct ibv_cq **cq, void **cq_ctx);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int n);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
	int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
};

extern struct ibv_fns ibv;

/*
 * An RDMA device the process holds open, with its PD, while attachments
 * use it: opened by the first, closed after the last (ibv.c).
 */
struct rdev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	char name[SOCKPROTO_DEVICE_NAME_MAX];
	int mtu;		/* active MTU of port 1, enum ibv_mtu */
	int gid_tbl_len;
	int refs;		/* attachments holding it */
	int gone;		/* being removed (rvmad's DEVICE): no new ones */
};

int ibv_dev_get(const uint8_t addr[16], struct rdev **dev, int *gidx);
void ibv_dev_put(struct rdev *d);
int ibv_dev_gone(const char *name);
void ibv_fork_child(void);

/* ---- attach.c: one connection's attachment ---- */

#define ATT_RETRIES	6	/* a client asks again after no_owner (progress.c) */
#define ATT_RQ		128	/* receives posted, 64 bytes each */
#define ATT_SQ		128	/* send queue depth */
#define ATT_RECV_SZ	64

enum att_out { AOUT_TCP, AOUT_RING, AOUT_HELD, AOUT_FLUSH };

/*
 * An attachable connection: created when a connection is established and
 * registered with rvmad, kept until the connection ends. refs: the
 * connection object and the registry each hold one. Everything below mu
 * changes under mu; the program's anchor writes are serialized by wmu
 * (a switch never happens in the middle of one), its reads by rmu.
 */
struct att {
	_Atomic int refs;
	pthread_mutex_t mu;
	pthread_mutex_t rmu, wmu;
	struct att *next;		/* registry list (progress.c) */
	struct att *close_next;		/* closed, for the progress thread */

	struct sockproto_tuple tuple;	/* as this host sees it */
	int anchor;			/* private dup of the socket (CLOEXEC) */
	int rd_ev, wr_ev;		/* eventfds: something for readers, writers */
	_Atomic int rd_sig, wr_sig;	/* set after a signal: the eventfd is worth a read */
	int client;			/* connect()ed: the protocol's client */
	pid_t pid;			/* owner process (fork: another's) */

	/* Under mu. */
	int phase;			/* enum conn_phase */
	int out;			/* enum att_out */
	int in;				/* enum conn_in */
	uint32_t epoch;
	int want_switch;		/* switch the outgoing direction at next chance */
	int closing;			/* the program closed its last fd */
	int shut_wr;			/* the program shut its writing */
	int fin_sent, anchor_shut;
	int reset;			/* errno for the program (ECONNRESET) once set */
	int reset_told;			/* writes told of the reset (then EPIPE) */
	int linger0;			/* closed with SO_LINGER {1, 0}: no FIN, a reset */
	int anchor_eof;			/* the anchor ended (peer gone) */
	int qp_dead;
	int released;
	int disabled;			/* never attach (a call the ring does not serve yet) */
	int forked;			/* a child inherited the socket: it may use it */
	int handoff;			/* closed here, maybe used elsewhere: demote, then let go */
	int shared;			/* others may hold the socket (CONN_KOFF): close and exit demote */
	int retries;			/* client: attachments asked for again */
	int64_t retry_at;		/* client: ask again then (ms, monotonic); 0: no */

	uint64_t tx;			/* bytes the program wrote, whole stream */
	uint64_t rx;			/* bytes the program consumed, whole stream */
	uint64_t sw_out;		/* my SWITCH offset */
	uint64_t sw_in;			/* the peer's SWITCH offset */
	uint64_t prod;			/* ring data arrived up to (peer's stream) */
	uint64_t fin_in;		/* peer's FIN offset, SOCKPROTO_NO_FIN before */
	uint64_t credited;		/* last credit written to the peer */
	uint64_t credit;		/* largest credit the peer wrote to me */
	uint64_t peer_blocked;		/* largest blocked the peer wrote */
	uint64_t blocked_sent;		/* last blocked I wrote, +1 (0: never) */
	int64_t probed;			/* a blocked writer saw the anchor end: QP probed then (ms) */
	uint64_t flushed;		/* AOUT_FLUSH: anchor has my stream up to here */
	uint64_t sq_posted;		/* send WRs posted (each one's wr_id: its number) */
	uint64_t sq_done;		/* send WRs completed (in order) */
	uint64_t sq_signaled;		/* the last signaled one */
	int rd_sleepers, wr_sleepers;	/* program threads asleep on this connection */
	int ep_regs, ep_rd, ep_wr;	/* epoll registrations (epoll.c): all, EPOLLIN, EPOLLOUT */
	int ep_nested;			/* of them in nested sets: the progress thread watches the CQ */
	uint32_t chan_gen;		/* a new completion channel: one more */
	int releasing;
	int chg_rd, chg_wr;		/* completions changed what they wait for */
	uint32_t watched;		/* in the progress thread's epoll: 1 chan, 2 anchor */
	int watched_chan_fd;
	uint32_t anchor_events;		/* the anchor's events there */

	/* RDMA resources (set up once per attachment). */
	struct rdev *dev;
	int gidx;
	struct ibv_comp_channel *chan;	/* the CQ's events, for whoever sleeps */
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	void *rmem;			/* remote-writable: ctrl page + ring */
	size_t rlen;
	struct ibv_mr *rmr;
	void *lmem;			/* local: recv buffers + send buffer + scratch */
	size_t llen;
	struct ibv_mr *lmr;
	unsigned log2;			/* my ring: 1 << log2 bytes */
	uint32_t psn;
	struct sockproto_endpoint peer;	/* wire values */
	uint64_t peer_ring, peer_ctrl;	/* host values */
	uint32_t peer_ring_rkey, peer_ctrl_rkey;
	uint64_t win;			/* min(my ring, peer's ring): the send window */

	struct sockproto_stats_slot *slot; /* in the statistics segment, or NULL (segment.c) */
};

/* Layout of rmem and lmem. */
#define ATT_CTRL_OFF	0
#define ATT_RHDR_OFF	64
#define ATT_RING_OFF	4096
#define ATT_RBUF_OFF	0				/* lmem: receives */
#define ATT_SCR_OFF	(ATT_RQ * ATT_RECV_SZ)		/* lmem: credit/record scratch */
#define ATT_SBUF_OFF	(ATT_SCR_OFF + 4096)		/* lmem: send buffer */

static inline unsigned char *att_ring(struct att *a)
{
	return (unsigned char *)a->rmem + ATT_RING_OFF;
}

static inline unsigned char *att_sbuf(struct att *a)
{
	return (unsigned char *)a->lmem + ATT_SBUF_OFF;
}

static inline struct sockproto_ctrl *att_ctrl(struct att *a)
{
	return (struct sockproto_ctrl *)((char *)a->rmem + ATT_CTRL_OFF);
}

struct att *att_new(struct conn *c, int fd, int client);
void att_put(struct att *a);
int att_setup(struct att *a);
int att_connect(struct att *a, const struct sockproto_endpoint *peer);
void att_local_endpoint(struct att *a, struct sockproto_endpoint *ep);
int att_poll_cq(struct att *a);				/* under mu */
void att_try_switch(struct att *a);			/* under mu */
void att_switch(struct att *a);				/* under mu and wmu */
void att_credit_check(struct att *a);			/* under mu */
void att_signal(struct att *a, int rd, int wr);
void att_demote(struct att *a, int reason);		/* under mu */
void att_on_peer_demote(struct att *a, uint64_t consumed); /* under mu */
int att_flush(struct att *a);				/* under mu */
void att_linger_step(struct att *a);			/* under mu */
void att_release(struct att *a);			/* under mu */
void att_post_fin(struct att *a);			/* under mu */
void att_abort(struct att *a, int reason);		/* under mu */
void att_wake(struct att *a);				/* under mu */
void att_ep_attached(struct att *a);			/* under mu */
void att_drain_sends(struct att *a, int ms);
void att_closed(struct att *a);
void att_demote_wait(struct att *a, int reason, int ms);
void att_take_events(struct att *a);			/* under mu */
#define ATT_POLLED	0x4000	/* att_poll_enter found completions: look again */
int att_poll_enter(struct att *a, int rd, int wr, int *chanfd);
void att_poll_leave(struct att *a, int rd, int wr, int chan_fired);
int att_post_data(struct att *a, uint64_t from, uint64_t len);	/* under mu */
void att_blocked(struct att *a);			/* under mu */

/* ---- ring.c: the program's I/O on an attachable connection ---- */

ssize_t att_recv(struct conn *c, struct att *a, const struct iovec *iov, int iovcnt, int flags);
ssize_t att_send(struct conn *c, struct att *a, const struct iovec *iov, int iovcnt, int flags);
int att_readable(struct att *a);	/* ring bytes or end ready, without a system call */
int att_writable(struct att *a);
int att_readable_bytes(struct att *a, int anchor);
int att_rd_ready(struct att *a);	/* under mu */
int att_rd_behind(struct att *a);			/* under mu */
int att_wr_ready(struct att *a);	/* under mu */
uint64_t att_send_space(struct att *a);	/* under mu */
void att_ep_sync(struct att *a);	/* under mu */

/* ---- progress.c: rvmad and the progress thread ---- */

int broker_register(struct att *a, int fd);
int broker_send_routed(struct att *a, const void *rec, size_t len);
void broker_unregister(struct att *a);
void progress_kick(void);
void progress_closed(struct att *a);	/* under shim_lock: queued for the thread */
void progress_add(struct att *a);	/* registry; the thread learns of it */
void progress_watch(struct att *a);	/* under mu */
void progress_fork_child(void);
void progress_fork_parent(void);

/* ---- segment.c: the statistics segment rvmad reads ---- */

int stats_segment_send(int (*send)(const void *rec, size_t len, int fd));
void stats_slot_open(struct att *a, int fd);	/* before the attachment is shared */
void stats_slot_sync(struct att *a);		/* under mu: state, path, epoch, bytes */
void stats_slot_rx(struct att *a);		/* under rmu: the bytes read */
void stats_slot_close(struct att *a);		/* the attachment is going */
void stats_ring(struct att *a, int rd, uint64_t n);
void stats_rdma_write(struct att *a);
void stats_demote(struct att *a, int reason);
void stats_fallback(struct att *a, int reason);

/* ---- epoll.c ---- */

void epoll_conn_closing(struct att *a);
void epoll_set_closing(int epfd);
void epoll_fork_child(void);

#endif /* RDMA_H */
