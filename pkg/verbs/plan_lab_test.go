//go:build lab

package verbs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// TestLoopbackSendPlan posts one plan (a two-SGE RDMA WRITE chained with a
// SEND WITH IMMEDIATE) several times, changing its fields between posts,
// and checks every byte and immediate that arrived; then every misuse.
func TestLoopbackSendPlan(t *testing.T) {
	ctx := openDev(t)
	a, b := pair(t, ctx, endOpts{inline: 64}, nil)
	am, bm := a.mr.Bytes(), b.mr.Bytes()
	p, err := a.qp.NewSendPlan(
		verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{a.mr.SGE(0, 100), a.mr.SGE(200, 50)},
			RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey()},
		verbs.SendWR{ID: 2, Op: verbs.OpSendImm, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(300, 8)}, Imm: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Len() != 2 {
		t.Fatalf("Len %d", p.Len())
	}
	for round := 0; round < 4; round++ {
		fill(am[:400], byte(round*11))
		dst := 4096 + round*1000
		if err := p.SetRemote(0, b.mr.Addr()+uint64(dst), b.mr.RKey()); err != nil {
			t.Fatal(err)
		}
		if err := p.SetImm(1, uint32(100+round)); err != nil {
			t.Fatal(err)
		}
		if err := p.SetID(1, uint64(10+round)); err != nil {
			t.Fatal(err)
		}
		if err := b.qp.PostRecv(verbs.RecvWR{ID: uint64(20 + round), SGL: []verbs.SGE{b.mr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		if err := p.Post(); err != nil {
			t.Fatal(err)
		}
		a.ok(uint64(10 + round))
		w := b.ok(uint64(20 + round))
		if !w.HasImm() || w.Imm != uint32(100+round) || w.ByteLen != 8 {
			t.Fatalf("round %d: receive completion %+v", round, w)
		}
		want := append(append([]byte(nil), am[:100]...), am[200:250]...)
		checkBytes(t, "planned write", bm[dst:dst+150], want)
		checkBytes(t, "planned send", bm[:8], am[300:308])
	}

	// Set replaces a work request; a bad one leaves the plan as it was.
	fill(am[:64], 77)
	if err := p.Set(0, verbs.SendWR{ID: 3, Op: verbs.OpWrite, Flags: verbs.SendInline,
		SGL: []verbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.mr.Addr() + 9000, RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	isErr(t, "Set with a zero-length SGE", p.Set(0, verbs.SendWR{Op: verbs.OpWrite, SGL: []verbs.SGE{a.mr.SGE(0, 0)}}), verbs.ErrInvalid)
	isErr(t, "Set out of range", p.Set(2, verbs.SendWR{Op: verbs.OpSend}), verbs.ErrInvalid)
	isErr(t, "SetID out of range", p.SetID(-1, 0), verbs.ErrInvalid)
	big, err := a.qp.NewSendPlan(verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{a.mr.SGE(0, a.qp.Cap().MaxInlineData+1)}})
	if err != nil {
		t.Fatal(err)
	}
	isErr(t, "SetFlags with too much inline data", big.SetFlags(0, verbs.SendInline), verbs.ErrInvalid)
	big.Close()
	if err := p.SetFlags(1, verbs.SendSignaled|verbs.SendInline); err != nil {
		t.Fatalf("8 bytes inline: %v", err)
	}
	b.qp.PostRecv(verbs.RecvWR{ID: 30, SGL: []verbs.SGE{b.mr.SGE(0, 64)}})
	if err := p.SetID(1, 31); err != nil {
		t.Fatal(err)
	}
	if err := p.Post(); err != nil {
		t.Fatal(err)
	}
	a.ok(31)
	b.ok(30)
	checkBytes(t, "replaced write", bm[9000:9064], am[:64])

	// An atomic plan: alignment is checked by SetRemote too.
	ap, err := a.qp.NewSendPlan(verbs.SendWR{ID: 40, Op: verbs.OpAtomicFAA, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{a.mr.SGE(512, 8)}, RemoteAddr: b.mr.Addr() + 2048, RKey: b.mr.RKey(), CompareAdd: 5})
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint64(bm[2048:], 1000)
	for i := 0; i < 3; i++ {
		if err := ap.Post(); err != nil {
			t.Fatal(err)
		}
		a.ok(40)
	}
	if got := binary.LittleEndian.Uint64(bm[2048:]); got != 1015 {
		t.Fatalf("three planned fetch-and-adds of 5 on 1000 gave %d", got)
	}
	isErr(t, "SetRemote misaligned atomic", ap.SetRemote(0, b.mr.Addr()+2049, b.mr.RKey()), verbs.ErrInvalid)
	if err := ap.SetFlags(0, verbs.SendSignaled|verbs.SendInline); err == nil {
		t.Fatal("an inline atomic was accepted")
	}

	// Building a plan: the same rules as PostSend, and binds are refused.
	_, err = a.qp.NewSendPlan()
	isErr(t, "empty plan", err, verbs.ErrInvalid)
	mw, err := a.pd.AllocMW(verbs.MWType2)
	if err == nil {
		defer mw.Close()
		_, err = a.qp.NewSendPlan(verbs.SendWR{Op: verbs.OpBindMW, MW: mw, BindMR: a.mr, BindAddr: a.mr.Addr(), BindLen: 64})
		isErr(t, "planned bind", err, verbs.ErrInvalid)
	}
	// (the device may grant a deeper queue than was asked for)
	_, err = a.qp.NewSendPlan(make([]verbs.SendWR, a.qp.Cap().MaxSendWR+1)...)
	isErr(t, "plan longer than the send queue", err, verbs.ErrQueueFull)

	// Posting on a QP that cannot send.
	idle, err := a.pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: a.cq, RecvCQ: a.cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ip, err := idle.NewSendPlan(verbs.SendWR{Op: verbs.OpSend, SGL: []verbs.SGE{a.mr.SGE(0, 8)}})
	if err != nil {
		t.Fatal(err)
	}
	isErr(t, "plan posted in RESET", ip.Post(), verbs.ErrWrongState)

	// Closing: idempotent, and closing the QP closes its plans.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	isErr(t, "Post after Close", p.Post(), verbs.ErrClosed)
	isErr(t, "SetImm after Close", p.SetImm(1, 0), verbs.ErrClosed)
	if err := idle.Close(); err != nil {
		t.Fatal(err)
	}
	isErr(t, "Post after its QP closed", ip.Post(), verbs.ErrClosed)
	_, err = idle.NewSendPlan(verbs.SendWR{Op: verbs.OpSend})
	isErr(t, "plan on a closed QP", err, verbs.ErrClosed)
	if !bytes.Equal(bm[9000:9064], am[:64]) {
		t.Fatal("memory changed after the plans closed")
	}

	// A planned post allocates nothing.
	sp, err := a.qp.NewSendPlan(verbs.SendWR{ID: 50, Op: verbs.OpWrite, Flags: verbs.SendSignaled | verbs.SendInline,
		SGL: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	wcs := make([]verbs.WC, 4)
	bg := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		if err == nil {
			err = sp.Post()
		}
		if err == nil {
			_, err = a.cq.Spin(bg, wcs[:1])
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Errorf("%v allocations per planned post and poll, want 0", allocs)
	}
}
