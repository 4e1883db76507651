//go:build lab

package kmod_test

import (
	"context"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

const page = kmod.PageSize

// side is one end of a loopback RC connection on the lab's rxe device.
type side struct {
	pd   *verbs.PD
	cq   *verbs.CQ
	qp   *verbs.QP
	mr   *verbs.MR
	keep []verbs.WC
}

// pair is a source that issues RDMA operations to a target's memory
// region over rxe loopback.
type pair struct {
	t        *testing.T
	ctx      *verbs.Context
	src, dst *side
}

func newPair(t *testing.T, dstPages int) *pair {
	t.Helper()
	return newPairWith(t, dstPages, verbs.AccessAll, verbs.MTU1024)
}

// newPairWith is newPair with the regions' access flags and the path MTU.
func newPairWith(t *testing.T, dstPages int, access verbs.Access, mtu verbs.MTU) *pair {
	t.Helper()
	name := labenv.Device(t)
	ctx, err := verbs.Open(name)
	if err != nil {
		t.Fatalf("verbs.Open(%q): %v", name, err)
	}
	t.Cleanup(func() { ctx.Close() })
	gid, err := ctx.RoCEv2GID(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &pair{t: t, ctx: ctx, src: newSideWith(t, ctx, dstPages*page, 512, access),
		dst: newSideWith(t, ctx, dstPages*page, 512, access)}
	ia := verbs.QPInfo{QPN: p.src.qp.QPN(), PSN: 100, GID: gid.GID}
	ib := verbs.QPInfo{QPN: p.dst.qp.QPN(), PSN: 200, GID: gid.GID}
	opts := &verbs.ConnectOptions{GIDIndex: gid.Index, PathMTU: mtu}
	if err := p.src.qp.Connect(ia, ib, opts); err != nil {
		t.Fatal(err)
	}
	if err := p.dst.qp.Connect(ib, ia, opts); err != nil {
		t.Fatal(err)
	}
	return p
}

// newSide creates a PD, a CQ on a completion channel, an RC QP with
// sendWR send slots and a region of size bytes.
func newSide(t *testing.T, ctx *verbs.Context, size, sendWR int) *side {
	t.Helper()
	return newSideWith(t, ctx, size, sendWR, verbs.AccessAll)
}

// newSideWith is newSide with the region's access flags.
func newSideWith(t *testing.T, ctx *verbs.Context, size, sendWR int, access verbs.Access) *side {
	t.Helper()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := ctx.NewCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.NewCQ(2*sendWR, &verbs.CQOptions{Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: sendWR, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.AllocMR(size, access)
	if err != nil {
		t.Fatal(err)
	}
	return &side{pd: pd, cq: cq, qp: qp, mr: mr}
}

// key is the target region's key as the module knows it.
func (p *pair) key() uint32 { return p.dst.mr.RKey() }

// addr is the target address at byte offset off of the target region.
func (p *pair) addr(off int) uint64 { return p.dst.mr.Addr() + uint64(off) }

// post issues one operation from the source's buffer at soff to the target
// at doff and waits for its completion; it returns the completion error.
func (p *pair) post(op verbs.Opcode, soff, doff, n int, cmp, swap uint64) error {
	p.t.Helper()
	wr := verbs.SendWR{ID: uint64(doff), Op: op, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{p.src.mr.SGE(soff, n)}, RemoteAddr: p.addr(doff), RKey: p.key(),
		CompareAdd: cmp, Swap: swap}
	if err := p.src.qp.PostSend(wr); err != nil {
		p.t.Fatalf("PostSend %v: %v", op, err)
	}
	return p.waitOne(p.src)
}

func (p *pair) waitOne(s *side) error {
	p.t.Helper()
	if len(s.keep) == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		wcs := make([]verbs.WC, 16)
		n, err := s.cq.Wait(ctx, wcs)
		if err != nil {
			p.t.Fatalf("waiting for a completion: %v", err)
		}
		s.keep = append(s.keep, wcs[:n]...)
	}
	wc := s.keep[0]
	s.keep = s.keep[1:]
	return wc.Err()
}

func (p *pair) write(soff, doff int, data []byte) error {
	p.t.Helper()
	copy(p.src.mr.Bytes()[soff:], data)
	return p.post(verbs.OpWrite, soff, doff, len(data), 0, 0)
}

func (p *pair) read(soff, doff, n int) ([]byte, error) {
	p.t.Helper()
	clear(p.src.mr.Bytes()[soff : soff+n])
	err := p.post(verbs.OpRead, soff, doff, n, 0, 0)
	return append([]byte(nil), p.src.mr.Bytes()[soff:soff+n]...), err
}

func openDev(t *testing.T) *kmod.Device {
	t.Helper()
	labenv.Device(t)
	d, err := kmod.Open()
	if err != nil {
		t.Fatalf("kmod.Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func newDomain(t *testing.T, d *kmod.Device, size int) *kmod.Domain {
	t.Helper()
	dm, err := d.NewDomain(size)
	if err != nil {
		t.Fatalf("NewDomain(%d): %v", size, err)
	}
	t.Cleanup(func() { dm.Close() })
	return dm
}

func readAll(t *testing.T, dm *kmod.Domain) []kmod.Entry {
	t.Helper()
	es, err := dm.Read(nil, 0)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return es
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7+i/251)
	}
	return b
}

// idle checks that nothing is left armed and that no probe hit was missed.
func idle(t *testing.T, d *kmod.Device) kmod.Stats {
	t.Helper()
	var st kmod.Stats
	var err error
	for i := 0; i < 100; i++ {
		if st, err = d.Stats(); err != nil {
			t.Fatalf("Stats: %v", err)
		}
		if st.Domains == 0 && st.MRs == 0 && st.Pages == 0 && !st.HooksArmed {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st.Domains != 0 || st.MRs != 0 || st.Pages != 0 || st.HooksArmed {
		t.Errorf("module not idle: %+v", st)
	}
	if st.Missed != 0 {
		t.Errorf("the kernel skipped %d probe hits", st.Missed)
	}
	return st
}

// checkSource checks that entries name the target's QP that served them
// and the source's QP that issued them.
func (p *pair) checkSource(es []kmod.Entry) {
	p.t.Helper()
	for _, e := range es {
		if e.QPN != p.dst.qp.QPN() || e.SrcQPN != p.src.qp.QPN() {
			p.t.Fatalf("entry %d names QP %d from %d, want %d from %d", e.Seq, e.QPN, e.SrcQPN, p.dst.qp.QPN(), p.src.qp.QPN())
		}
	}
}

// covered checks every READ entry's data against want (the bytes the
// reader must have got, indexed from base) and returns the byte range
// [lo, hi) the entries cover and how many bytes they cover. An RC
// retransmission of a READ is served and logged again, so entries may
// repeat; what matters is that each is right and that together they
// cover what was read.
func covered(t *testing.T, es []kmod.Entry, base uint64, want func(off int) byte) (lo, hi, n int) {
	t.Helper()
	seen := map[int]bool{}
	lo, hi = -1, -1
	for _, e := range es {
		if e.Op != kmod.OpRead {
			continue
		}
		off := int(e.IOVA - base)
		for i := 0; i < int(e.Length); i++ {
			if e.Data != nil && e.Data[i] != want(off+i) {
				t.Fatalf("entry %d: byte %d is %#x, want %#x", e.Seq, off+i, e.Data[i], want(off+i))
			}
			seen[off+i] = true
		}
		if lo < 0 || off < lo {
			lo = off
		}
		if off+int(e.Length) > hi {
			hi = off + int(e.Length)
		}
	}
	return lo, hi, len(seen)
}
