//go:build lab

package rvma

// Lab checks of what docs/rvma.md assumes of the verbs and of rxe, run
// before the endpoint is built on them:
//
//   - a type 1 memory window bound over a posted buffer accepts an RDMA
//     WRITE WITH IMMEDIATE; the receive completion (from an SRQ, with no
//     scatter list) carries the immediate and the WRITE's length;
//   - after a zero-length re-bind (the unbind) the old rkey is refused:
//     the sender gets IBV_WC_REM_ACCESS_ERR and the buffer is unchanged;
//   - a zero-length WRITE WITH IMMEDIATE (a knock) needs no rkey;
//   - what a bind and an unbind cost on the critical path.
//
// Run: go run ./test/softroce gotest ./pkg/rvma -test.run TestLabAssumptions -test.v

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

type labSide struct {
	t  *testing.T
	pd *verbs.PD
	cq *verbs.CQ
	wc []verbs.WC
}

func (s *labSide) wait(id uint64) verbs.WC {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		for i, w := range s.wc {
			if w.ID == id {
				s.wc = append(s.wc[:i], s.wc[i+1:]...)
				return w
			}
		}
		buf := make([]verbs.WC, 16)
		n, err := s.cq.Wait(ctx, buf)
		if err != nil {
			s.t.Fatalf("waiting for completion %d: %v (have %+v)", id, err, s.wc)
		}
		s.wc = append(s.wc, buf[:n]...)
	}
}

// drain collects what arrives within d.
func (s *labSide) drain(d time.Duration) []verbs.WC {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		buf := make([]verbs.WC, 16)
		n, err := s.cq.Wait(ctx, buf)
		if err != nil {
			out := s.wc
			s.wc = nil
			return out
		}
		s.wc = append(s.wc, buf[:n]...)
	}
}

func TestLabAssumptions(t *testing.T) {
	name := labenv.Device(t)
	dev, err := verbs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	gid, err := dev.RoCEv2GID(1, net.ParseIP(labenv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	side := func() *labSide {
		pd, err := dev.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		ch, err := dev.NewCompChannel()
		if err != nil {
			t.Fatal(err)
		}
		cq, err := dev.NewCQ(256, &verbs.CQOptions{Channel: ch})
		if err != nil {
			t.Fatal(err)
		}
		return &labSide{t: t, pd: pd, cq: cq}
	}
	snd, rcv := side(), side()
	srq, err := rcv.pd.NewSRQ(&verbs.SRQAttr{MaxWR: 64, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	psn := uint32(100)
	pair := func() (*verbs.QP, *verbs.QP) {
		s, err := snd.pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: snd.cq, RecvCQ: snd.cq,
			Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
		if err != nil {
			t.Fatal(err)
		}
		r, err := rcv.pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: rcv.cq, RecvCQ: rcv.cq, SRQ: srq,
			Cap: verbs.QPCap{MaxSendWR: 64, MaxSendSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		si := verbs.QPInfo{QPN: s.QPN(), PSN: psn, GID: gid.GID}
		ri := verbs.QPInfo{QPN: r.QPN(), PSN: psn + 1000, GID: gid.GID}
		psn += 7
		opts := &verbs.ConnectOptions{GIDIndex: gid.Index}
		if err := s.Connect(si, ri, opts); err != nil {
			t.Fatal(err)
		}
		if err := r.Connect(ri, si, opts); err != nil {
			t.Fatal(err)
		}
		return s, r
	}
	sq, rq := pair()

	mr, err := rcv.pd.AllocMR(1<<16, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	src, err := snd.pd.AllocMR(1<<16, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i*7 + 3)
	}
	mw, err := rcv.pd.AllocMW(verbs.MWType1)
	if err != nil {
		t.Fatalf("type 1 memory window: %v", err)
	}
	const bufOff, bufLen = 4096, 8192
	bind := func(id uint64, length uint64) uint32 {
		t.Helper()
		key, err := rq.BindMW(mw, mr, mr.Addr()+bufOff, length, verbs.AccessRemoteWrite, id, verbs.SendSignaled)
		if err != nil {
			t.Fatalf("BindMW(length %d): %v", length, err)
		}
		if w := rcv.wait(id); w.Err() != nil || w.Opcode != verbs.WCBindMW {
			t.Fatalf("bind completion: %+v %v", w, w.Err())
		}
		return key
	}
	rkey := bind(1, bufLen)

	// A receive WQE without a scatter list: WRITE WITH IMMEDIATE needs none.
	if err := srq.PostRecv(verbs.RecvWR{ID: 100}); err != nil {
		t.Fatalf("SRQ receive without SGEs: %v", err)
	}
	imm, _ := wire.Imm{Kind: wire.KindData, Slot: 5, Gen: wire.GenLow(1)}.Encode()
	const putOff, putLen = 100, 1000
	if err := sq.PostSend(verbs.SendWR{ID: 10, Op: verbs.OpWriteImm, Flags: verbs.SendSignaled, Imm: imm,
		SGL: []verbs.SGE{src.SGE(0, putLen)}, RemoteAddr: mr.Addr() + bufOff + putOff, RKey: rkey}); err != nil {
		t.Fatal(err)
	}
	if w := snd.wait(10); w.Err() != nil {
		t.Fatalf("WRITE WITH IMMEDIATE through the window: %v", w.Err())
	}
	w := rcv.wait(100)
	if w.Err() != nil || w.Opcode != verbs.WCRecvRDMAWithImm || !w.HasImm() || w.Imm != imm {
		t.Fatalf("receive completion %+v (%v)", w, w.Err())
	}
	if w.ByteLen != putLen {
		t.Fatalf("receive completion byte_len %d, want the WRITE's length %d", w.ByteLen, putLen)
	}
	if got := wire.ParseImm(w.Imm); got.Slot != 5 || got.Gen != 1 {
		t.Fatalf("immediate %+v", got)
	}
	placed := mr.Bytes()[bufOff+putOff : bufOff+putOff+putLen]
	if !bytes.Equal(placed, src.Bytes()[:putLen]) {
		t.Fatal("bytes not placed at the offset")
	}

	// Unbind: a zero-length bind; the old rkey is then refused.
	newKey := bind(2, 0)
	t.Logf("rkey %#x, after the unbind %#x", rkey, newKey)
	snapshot := bytes.Clone(mr.Bytes())
	if err := srq.PostRecv(verbs.RecvWR{ID: 101}); err != nil {
		t.Fatal(err)
	}
	if err := sq.PostSend(verbs.SendWR{ID: 11, Op: verbs.OpWriteImm, Flags: verbs.SendSignaled, Imm: imm,
		SGL: []verbs.SGE{src.SGE(2000, putLen)}, RemoteAddr: mr.Addr() + bufOff + putOff, RKey: rkey}); err != nil {
		t.Fatal(err)
	}
	if w := snd.wait(11); !errors.Is(w.Err(), verbs.WCRemAccessErr) {
		t.Fatalf("write with the unbound rkey: %+v %v, want IBV_WC_REM_ACCESS_ERR", w, w.Err())
	}
	if !bytes.Equal(snapshot, mr.Bytes()) {
		t.Fatal("a refused write changed the buffer")
	}
	for _, w := range rcv.drain(500 * time.Millisecond) {
		t.Logf("receiver sees after the refused write: id %d opcode %v status %v", w.ID, w.Opcode, w.Err())
	}
	if st, err := rq.Query(); err == nil {
		t.Logf("receiver QP state after the refused write: %v", st.State)
	}

	// A new pair (the old one is in error). A knock: zero-length WRITE WITH
	// IMMEDIATE, no rkey.
	sq2, rq2 := pair()
	_ = rq2
	if err := srq.PostRecv(verbs.RecvWR{ID: 102}); err != nil {
		t.Fatal(err)
	}
	knock, _ := wire.Imm{Kind: wire.KindCtrl, Slot: 5, Gen: uint16(wire.KnockNack)}.Encode()
	if err := sq2.PostSend(verbs.SendWR{ID: 12, Op: verbs.OpWriteImm, Flags: verbs.SendSignaled, Imm: knock}); err != nil {
		t.Fatalf("zero-length WRITE WITH IMMEDIATE: %v", err)
	}
	if w := snd.wait(12); w.Err() != nil {
		t.Fatalf("knock: %v", w.Err())
	}
	for {
		w := rcv.drain(2 * time.Second)
		found := false
		for _, c := range w {
			if c.ID == 102 {
				found = true
				if c.Err() != nil || c.Imm != knock || c.ByteLen != 0 {
					t.Fatalf("knock completion %+v %v", c, c.Err())
				}
			} else {
				t.Logf("also: id %d %v %v", c.ID, c.Opcode, c.Err())
			}
		}
		if found {
			break
		}
		t.Fatal("no knock completion")
	}

	// Re-binding the same window over another buffer gives another key
	// that works; then the cost of bind and unbind.
	key3, err := rq2.BindMW(mw, mr, mr.Addr()+32768, bufLen, verbs.AccessRemoteWrite, 3, verbs.SendSignaled)
	if err != nil {
		t.Fatal(err)
	}
	rcv.wait(3)
	if err := srq.PostRecv(verbs.RecvWR{ID: 103}); err != nil {
		t.Fatal(err)
	}
	if err := sq2.PostSend(verbs.SendWR{ID: 13, Op: verbs.OpWriteImm, Flags: verbs.SendSignaled, Imm: imm,
		SGL: []verbs.SGE{src.SGE(0, 64)}, RemoteAddr: mr.Addr() + 32768, RKey: key3}); err != nil {
		t.Fatal(err)
	}
	if w := snd.wait(13); w.Err() != nil {
		t.Fatalf("write after a re-bind: %v", w.Err())
	}
	rcv.wait(103)
	const n = 200
	spin := func(side *labSide, id uint64) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		buf := make([]verbs.WC, 4)
		for {
			k, err := side.cq.Spin(ctx, buf)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range buf[:k] {
				if w.Err() != nil {
					t.Fatalf("completion %d: %v", w.ID, w.Err())
				}
				if w.ID == id {
					return
				}
			}
		}
	}
	for _, mode := range []string{"Wait", "Spin"} {
		start := time.Now()
		for i := 0; i < n; i++ {
			id := uint64(1000 + i)
			if _, err := rq2.BindMW(mw, mr, mr.Addr()+32768, uint64(bufLen*(i&1)), verbs.AccessRemoteWrite, id, verbs.SendSignaled); err != nil {
				t.Fatal(err)
			}
			if mode == "Wait" {
				rcv.wait(id)
			} else {
				spin(rcv, id)
			}
		}
		t.Logf("bind or unbind, signaled, completion by CQ.%s: %.1f µs each", mode, float64(time.Since(start).Microseconds())/n)
	}
	// For scale: a signaled 64-byte RDMA WRITE (round trip to the ACK) in loopback.
	key4, err := rq2.BindMW(mw, mr, mr.Addr()+32768, bufLen, verbs.AccessRemoteWrite, 5000, verbs.SendSignaled)
	if err != nil {
		t.Fatal(err)
	}
	spin(rcv, 5000)
	for _, mode := range []string{"Wait", "Spin"} {
		start := time.Now()
		for i := 0; i < n; i++ {
			id := uint64(6000 + i)
			if err := sq2.PostSend(verbs.SendWR{ID: id, Op: verbs.OpWrite, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{src.SGE(0, 64)}, RemoteAddr: mr.Addr() + 32768, RKey: key4}); err != nil {
				t.Fatal(err)
			}
			if mode == "Wait" {
				snd.wait(id)
			} else {
				spin(snd, id)
			}
		}
		t.Logf("64-byte RDMA WRITE to its completion, CQ.%s: %.1f µs each", mode, float64(time.Since(start).Microseconds())/n)
	}
}
