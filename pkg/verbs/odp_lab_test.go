//go:build lab

package verbs_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// TestODPTwoGuests needs an rxe with on-demand paging (Linux 7.x guests,
// suite verbs-odp): guest 1 registers a region with AccessOnDemand, which
// pins nothing, and guest 2 RDMA-WRITEs into it and READs it back, across
// pages never touched before (rxe faults them in in its responder).
//
// rxe's ODP copy in 7.2 and 7.3 (__rxe_odp_mr_copy) ignores the offset in
// the page and does not advance through the packet: a packet is right
// only when it starts on a page boundary and fits its page. So the
// transfers here are page-aligned with a 4096-byte path MTU (the lab's
// eth0 has MTU 9000), which every packet meets; then one 8-byte write at
// offset 8 of a page tells whether this kernel still has the bug (logged,
// docs/kmod.md, "Kernels").
func TestODPTwoGuests(t *testing.T) {
	server, skip := needPair(t)
	if skip {
		return
	}
	ctx := openDev(t)
	attr, err := ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	if !attr.HasODP() {
		t.Fatalf("device %s reports no on-demand paging: this test needs a Linux 7.x guest", labenv.Device(t))
	}
	const size = 1 << 20
	access := verbs.AccessAll
	if server {
		access |= verbs.AccessOnDemand
	}
	pa, err := ctx.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	if pa.ActiveMTU != verbs.MTU4096 {
		t.Fatalf("active MTU %d: this test needs 4096 (eth0 with MTU 9000)", pa.ActiveMTU.Bytes())
	}
	e := newEnd(t, ctx, endOpts{size: size, access: access})
	m := e.mr.Bytes()
	if e.mr.Addr()%4096 != 0 {
		t.Fatalf("region at %#x: not page-aligned", e.mr.Addr())
	}
	local := e.info(0x2000 + uint32(labenv.Role()[0]))
	peer := parseHello(t, sideChannel(t, 18711, rcHello{local, e.mr.Remote()}.marshal()))
	e.connect(local, peer.info, &verbs.ConnectOptions{PathMTU: verbs.MTU4096})
	ctx60, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	want := func(n int, seed byte) []byte { b := make([]byte, n); fill(b, seed); return b }
	if server {
		// the last quarter is written here first: the reader must get it
		fill(m[3*size/4:], 77)
		if err := labenv.Signal("odp-ready"); err != nil {
			t.Fatal(err)
		}
		if err := labenv.Wait(ctx60, "odp-done"); err != nil {
			t.Fatal(err)
		}
		checkBytes(t, "rdma write into the ODP region", m[:size/2], want(size/2, 31))
		if probe := m[size/2 : size/2+16]; bytes.Equal(probe[8:], want(8, 5)) {
			t.Logf("an 8-byte write at offset 8 of a page landed there: this rxe's ODP copy keeps the offset")
		} else {
			t.Logf("an 8-byte write at offset 8 of a page did not land there (page starts % x): rxe's ODP copy bug", probe)
		}
		return
	}
	if err := labenv.Wait(ctx60, "odp-ready"); err != nil {
		t.Fatal(err)
	}
	r := peer.remote
	post := func(wr verbs.SendWR) {
		t.Helper()
		wr.Flags |= verbs.SendSignaled
		if err := e.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		e.ok(wr.ID)
	}
	fill(m[:size/2], 31)
	post(verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{e.mr.SGE(0, size/2)}, RemoteAddr: r.Addr, RKey: r.RKey})
	clear(m)
	post(verbs.SendWR{ID: 2, Op: verbs.OpRead, SGL: []verbs.SGE{e.mr.SGE(0, size/4)}, RemoteAddr: r.Addr + 3*size/4, RKey: r.RKey})
	checkBytes(t, "rdma read from the ODP region", m[:size/4], want(size/4, 77))
	post(verbs.SendWR{ID: 3, Op: verbs.OpRead, SGL: []verbs.SGE{e.mr.SGE(size/4, size/4)}, RemoteAddr: r.Addr, RKey: r.RKey})
	checkBytes(t, "rdma read of what was written", m[size/4:size/2], want(size/4, 31))
	fill(m[:8], 5)
	post(verbs.SendWR{ID: 4, Op: verbs.OpWrite, SGL: []verbs.SGE{e.mr.SGE(0, 8)}, RemoteAddr: r.Addr + size/2 + 8, RKey: r.RKey})
	if err := labenv.Signal("odp-done"); err != nil {
		t.Fatal(err)
	}
}
