//go:build lab

package verbs_test

import (
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
	e := newEnd(t, ctx, endOpts{size: size, access: access})
	m := e.mr.Bytes()
	local := e.info(0x2000 + uint32(labenv.Role()[0]))
	peer := parseHello(t, sideChannel(t, 18711, rcHello{local, e.mr.Remote()}.marshal()))
	e.connect(local, peer.info, nil)
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
	if err := labenv.Signal("odp-done"); err != nil {
		t.Fatal(err)
	}
}
