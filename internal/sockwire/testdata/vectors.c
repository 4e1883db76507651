// SPDX-License-Identifier: MIT
/*
 * Test helper of internal/sockwire: builds the golden vectors of
 * the sockets wire protocol with cmd/sockpreload/sockproto.h alone, and
 * checks records with sockproto_check(), so that the Go mirror can be
 * compared with the header byte for byte.
 *
 *   vectors vectors   one "name hex" line per vector
 *   vectors layout    one "name value" line per size and offset
 *   vectors check     for each line of hex on stdin, sockproto_check()'s
 *                     error as a positive number (0: well-formed)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sockproto.h"

static void hex(const char *name, const void *p, size_t n)
{
	const unsigned char *b = p;
	size_t i;

	printf("%s ", name);
	for (i = 0; i < n; i++)
		printf("%02x", b[i]);
	printf("\n");
}

static void seq(uint8_t *p, size_t n, uint8_t first)
{
	size_t i;

	for (i = 0; i < n; i++)
		p[i] = (uint8_t)(first + i);
}

static void tuple(struct sockproto_tuple *t, uint16_t fam, uint16_t lp, uint16_t rp, uint8_t l, uint8_t r)
{
	sockproto_put16(&t->family, fam);
	sockproto_put16(&t->local_port, lp);
	sockproto_put16(&t->remote_port, rp);
	seq(t->local_addr, 16, l);
	seq(t->remote_addr, 16, r);
}

static void endpoint(struct sockproto_endpoint *e, uint8_t gid, uint32_t qpn, uint32_t psn,
		     uint64_t ring, uint32_t rkey, uint8_t log2, uint8_t mtu, uint64_t ctrl, uint32_t ckey)
{
	seq(e->gid, 16, gid);
	sockproto_put32(&e->qpn, qpn);
	sockproto_put32(&e->psn, psn);
	sockproto_put64(&e->ring_addr, ring);
	sockproto_put32(&e->ring_rkey, rkey);
	e->ring_log2 = log2;
	e->mtu = mtu;
	sockproto_put64(&e->ctrl_addr, ctrl);
	sockproto_put32(&e->ctrl_rkey, ckey);
}

static void vectors(void)
{
	struct sockproto_attach a;
	struct sockproto_reason_rec rr;
	struct sockproto_offset_rec o;
	struct sockproto_demote d;
	struct sockproto_ctrl c;
	struct sockproto_ring r;
	struct sockproto_route rt;
	struct sockproto_register g;
	struct sockproto_result res;
	struct sockproto_stats_rec st;
	struct sockproto_list ls;
	struct sockproto_device dv;
	uint32_t imm;

	sockproto_init(&a, SOCKPROTO_ATTACH_REQ, 1);
	tuple(&a.tuple, SOCKPROTO_AF_INET6, 40000, 5201, 0x10, 0x20);
	sockproto_put64(&a.incarnation, 0x0102030405060708ull);
	endpoint(&a.ep, 0xa0, 0x000123, 0xabcdef, 0x00007f0011223344ull, 0x55667788, 18, 3,
		 0x00007f0099aabbccull, 0xddeeff01);
	hex("attach_req", &a, sizeof(a));

	sockproto_init(&a, SOCKPROTO_ATTACH_REP, 2);
	tuple(&a.tuple, SOCKPROTO_AF_INET, 5201, 40000, 0x30, 0x40);
	sockproto_put64(&a.incarnation, 0x8877665544332211ull);
	endpoint(&a.ep, 0xb0, 0xfffffe, 0x000001, 0x0000555500001000ull, 0x01020304, 12, 5,
		 0x0000555500000040ull, 0x0a0b0c0d);
	hex("attach_rep", &a, sizeof(a));

	sockproto_init(&rr, SOCKPROTO_ATTACH_NACK, 3);
	sockproto_put16(&rr.reason, SOCKPROTO_R_NO_OWNER);
	hex("attach_nack", &rr, sizeof(rr));

	sockproto_init(&o, SOCKPROTO_SWITCH, 4);
	sockproto_put64(&o.offset, 0x123456789aull);
	hex("switch", &o, sizeof(o));

	sockproto_init(&o, SOCKPROTO_FIN, 5);
	sockproto_put64(&o.offset, (1ull << 40) + 7);
	hex("fin", &o, sizeof(o));

	sockproto_init(&rr, SOCKPROTO_ABORT, 6);
	sockproto_put16(&rr.reason, SOCKPROTO_R_CLOSE_UNREAD);
	hex("abort", &rr, sizeof(rr));

	sockproto_init(&d, SOCKPROTO_DEMOTE, 7);
	sockproto_put64(&d.consumed, 0x0fedcba987654321ull);
	sockproto_put16(&d.reason, SOCKPROTO_R_QP_ERROR);
	hex("demote", &d, sizeof(d));

	sockproto_init(&rt, SOCKPROTO_ROUTE, 7);
	tuple(&rt.tuple, SOCKPROTO_AF_INET, 40000, 5201, 0x70, 0x80);
	hex("route", &rt, sizeof(rt));

	sockproto_init(&g, SOCKPROTO_REGISTER, 1);
	tuple(&g.tuple, SOCKPROTO_AF_INET6, 5201, 40000, 0x90, 0xa0);
	sockproto_put32(&g.fd, 0x7fffffff);
	hex("register", &g, sizeof(g));

	sockproto_init(&rt, SOCKPROTO_UNREGISTER, 2);
	tuple(&rt.tuple, SOCKPROTO_AF_INET6, 5201, 40000, 0x90, 0xa0);
	hex("unregister", &rt, sizeof(rt));

	sockproto_init(&res, SOCKPROTO_RESULT, 3);
	tuple(&res.tuple, SOCKPROTO_AF_INET, 5201, 40001, 0xb0, 0xc0);
	res.request = SOCKPROTO_REGISTER;
	sockproto_put16(&res.reason, SOCKPROTO_R_LIMIT);
	hex("result", &res, sizeof(res));

	sockproto_init(&st, SOCKPROTO_STATS, 1);
	sockproto_put32(&st.size, SOCKPROTO_STATS_HDR_SIZE + 4096 * SOCKPROTO_STATS_SLOT_SIZE);
	hex("stats", &st, sizeof(st));

	sockproto_init(&ls, SOCKPROTO_LIST, 9);
	hex("list", &ls, sizeof(ls));

	sockproto_init(&dv, SOCKPROTO_DEVICE, 0xfffffff0u);
	memcpy(dv.name, "rxe_eth0", 8);
	hex("device", &dv, sizeof(dv));

	memset(&c, 0, sizeof(c));
	sockproto_put64(&c.credit, 0x1111222233334444ull);
	sockproto_put64(&c.blocked, 0x5555666677778888ull);
	sockproto_put32(&c.epoch, 9);
	hex("ctrl", &c, sizeof(c));

	memset(&r, 0, sizeof(r));
	sockproto_put32(&r.magic, SOCKPROTO_RING_MAGIC);
	sockproto_put16(&r.version, SOCKPROTO_VERSION);
	r.log2size = 16;
	sockproto_put32(&r.epoch, 10);
	sockproto_put64(&r.base, 100);
	sockproto_put64(&r.prod, 300);
	sockproto_put64(&r.cons, 200);
	sockproto_put64(&r.fin, SOCKPROTO_NO_FIN);
	sockproto_put64(&r.credited, 150);
	hex("ring", &r, sizeof(r));

	/* The immediate in network order, as verbs puts it on the wire. */
	imm = SOCKPROTO_IMM(SOCKPROTO_IMM_DATA, 65536);
	{
		uint8_t b[4] = { (uint8_t)(imm >> 24), (uint8_t)(imm >> 16), (uint8_t)(imm >> 8), (uint8_t)imm };

		hex("imm", b, sizeof(b));
	}
}

#define SZ(name, v) printf("%s %lu\n", name, (unsigned long)(v))
#define OFF(s, f) SZ(#s "." #f, offsetof(struct s, f))

static void layout(void)
{
	SZ("magic", SOCKPROTO_MAGIC);
	SZ("version", SOCKPROTO_VERSION);
	SZ("type_max", SOCKPROTO_TYPE_MAX);
	SZ("reason_max", SOCKPROTO_R_MAX);
	SZ("record_max", SOCKPROTO_RECORD_MAX);
	SZ("ring_log2_min", SOCKPROTO_RING_LOG2_MIN);
	SZ("ring_log2_max", SOCKPROTO_RING_LOG2_MAX);
	SZ("ring_magic", SOCKPROTO_RING_MAGIC);
	SZ("imm_len_max", SOCKPROTO_IMM_LEN_MAX);
	SZ("imm_ctrl", SOCKPROTO_IMM_CTRL);
	SZ("imm_data", SOCKPROTO_IMM_DATA);
	SZ("sizeof.ctrl", sizeof(struct sockproto_ctrl));
	SZ("sizeof.ring", sizeof(struct sockproto_ring));
	OFF(sockproto_ctrl, credit);
	OFF(sockproto_ctrl, blocked);
	OFF(sockproto_ctrl, epoch);
	SZ("stats_magic", SOCKPROTO_STATS_MAGIC);
	SZ("stats_version", SOCKPROTO_STATS_VERSION);
	SZ("stats_reasons", SOCKPROTO_STATS_REASONS);
	SZ("stats_slots_max", SOCKPROTO_STATS_SLOTS_MAX);
	SZ("stats_min", SOCKPROTO_STATS_MIN);
	SZ("stats_max", SOCKPROTO_STATS_MAX);
	SZ("sizeof.stats", sizeof(struct sockproto_stats));
	SZ("sizeof.stats_slot", sizeof(struct sockproto_stats_slot));
	SZ("sizeof.stats_counters", sizeof(struct sockproto_stats_counters));
	SZ("stats_client", SOCKPROTO_STATS_CLIENT);
	SZ("stats_server", SOCKPROTO_STATS_SERVER);
	SZ("stats_adopted", SOCKPROTO_STATS_ADOPTED);
	SZ("slot_state_max", SOCKPROTO_SLOT_STATE_MAX);
	OFF(sockproto_stats, version);
	OFF(sockproto_stats, hdr_size);
	OFF(sockproto_stats, slot_size);
	OFF(sockproto_stats, nslots);
	OFF(sockproto_stats, used);
	OFF(sockproto_stats, pid);
	OFF(sockproto_stats, c);
	OFF(sockproto_stats_counters, connect_failed);
	OFF(sockproto_stats_counters, inherited);
	OFF(sockproto_stats_counters, live);
	OFF(sockproto_stats_counters, bytes_in);
	OFF(sockproto_stats_counters, bytes_out);
	OFF(sockproto_stats_counters, rdma_in);
	OFF(sockproto_stats_counters, rdma_out);
	OFF(sockproto_stats_counters, rdma_writes);
	OFF(sockproto_stats_counters, attachable);
	OFF(sockproto_stats_counters, attached);
	OFF(sockproto_stats_counters, demoted);
	OFF(sockproto_stats_counters, fd_passed);
	OFF(sockproto_stats_counters, fdopen);
	OFF(sockproto_stats_counters, splice);
	OFF(sockproto_stats_counters, execs);
	OFF(sockproto_stats_counters, spawns);
	OFF(sockproto_stats_counters, demotes);
	OFF(sockproto_stats_counters, fallbacks);
	OFF(sockproto_stats_slot, state);
	OFF(sockproto_stats_slot, path);
	OFF(sockproto_stats_slot, last_reason);
	OFF(sockproto_stats_slot, epoch);
	OFF(sockproto_stats_slot, fd);
	OFF(sockproto_stats_slot, tuple);
	OFF(sockproto_stats_slot, bytes_in);
	OFF(sockproto_stats_slot, bytes_out);
	OFF(sockproto_stats_slot, rdma_in);
	OFF(sockproto_stats_slot, rdma_out);
	OFF(sockproto_stats_slot, rdma_writes);
	for (unsigned int t = 0; t <= SOCKPROTO_TYPE_MAX + 1; t++)
		printf("size.%u %lu\n", t, (unsigned long)sockproto_size(t));
}

static int unhex(const char *s, uint8_t *out, size_t max, size_t *n)
{
	size_t len = strlen(s), i;

	if (len % 2 || len / 2 > max)
		return -1;
	for (i = 0; i < len / 2; i++) {
		unsigned int v;

		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (uint8_t)v;
	}
	*n = len / 2;
	return 0;
}

static int check(void)
{
	static char line[4096];
	static uint8_t buf[2048];

	while (fgets(line, sizeof(line), stdin)) {
		size_t n;

		line[strcspn(line, "\r\n")] = 0;
		if (unhex(line, buf, sizeof(buf), &n)) {
			fprintf(stderr, "bad hex line\n");
			return 1;
		}
		printf("%d\n", -sockproto_check(buf, n));
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	if (!strcmp(argv[1], "vectors"))
		vectors();
	else if (!strcmp(argv[1], "layout"))
		layout();
	else if (!strcmp(argv[1], "check"))
		return check();
	else
		return 2;
	return 0;
}
