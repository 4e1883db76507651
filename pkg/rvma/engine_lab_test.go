//go:build lab

package rvma

// The receiving engine on rxe (one guest, loopback): windows over real
// type 1 memory windows, a sender that reads the descriptor table with
// RDMA READ and puts with WRITE WITH IMMEDIATE over two stripes in reverse
// order, epochs handed over with the right bytes, a stale write refused,
// and a first latency sample against a raw WRITE with last-byte polling.
//
// Run: go run ./test/softroce gotest ./pkg/rvma -test.run TestLabEngine -test.v

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
	"os"
	"sort"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

type labSender struct {
	t    *testing.T
	side *labSide
	qps  []*verbs.QP
	mr   *verbs.MR
	id   uint64
}

func (s *labSender) readEntry(rem verbs.Remote) wire.Entry {
	s.t.Helper()
	for tries := 0; ; tries++ {
		s.id++
		if err := s.qps[len(s.qps)-1].PostSend(verbs.SendWR{ID: s.id, Op: verbs.OpRead, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{s.mr.SGE(0, wire.EntrySize)}, RemoteAddr: rem.Addr, RKey: rem.RKey}); err != nil {
			s.t.Fatal(err)
		}
		if w := s.side.wait(s.id); w.Err() != nil {
			s.t.Fatalf("READ of the entry: %v; other completions: %+v", w.Err(), s.side.drain(200*time.Millisecond))
		}
		e, err := wire.UnmarshalEntry(s.mr.Bytes()[:wire.EntrySize])
		if err == nil {
			return e
		}
		if tries > 1000 {
			s.t.Fatalf("entry: %v", err)
		}
	}
}

// put writes data (copied to offset 4096+ of the sender's MR) with
// WRITE WITH IMMEDIATE on stripe qp and returns the work request id.
func (s *labSender) put(qp int, slot uint32, gen uint64, d wire.Desc, off uint64, data []byte) uint64 {
	s.t.Helper()
	src := 4096 + int(s.id%8)*8192
	copy(s.mr.Bytes()[src:], data)
	imm, _ := wire.Imm{Kind: wire.KindData, Slot: slot, Gen: wire.GenLow(gen)}.Encode()
	s.id++
	if err := s.qps[qp].PostSend(verbs.SendWR{ID: s.id, Op: verbs.OpWriteImm, Flags: verbs.SendSignaled, Imm: imm,
		SGL: []verbs.SGE{s.mr.SGE(src, len(data))}, RemoteAddr: d.Addr + off, RKey: d.RKey}); err != nil {
		s.t.Fatal(err)
	}
	return s.id
}

func TestLabEngine(t *testing.T) {
	e, snd := labEngineSetup(t)
	var err error
	const bufLen, puts, epochs = 4096, 4, 6
	w, err := e.initWindow(0x11FF0011, WindowOptions{Keep: 1})
	if err != nil {
		t.Fatal(err)
	}
	arena, err := e.alloc(3 * bufLen)
	if err != nil {
		t.Fatal(err)
	}
	var posted []*Posted
	for i := 0; i < 3; i++ {
		p, err := w.Post(context.Background(), arena[i*bufLen:(i+1)*bufLen], nil)
		if err != nil {
			t.Fatal(err)
		}
		posted = append(posted, p)
	}
	if _, err := w.Post(context.Background(), make([]byte, 64), nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Go heap memory posted: %v", err)
	}

	view := newSenderView(0x11FF0011, w.incarnation)
	rem := e.descRemote(w.slot)
	chunk := bufLen / puts
	pattern := func(ep, p int) []byte { return bytes.Repeat([]byte{byte(ep*16 + p + 1)}, chunk) }
	var staleDesc wire.Desc
	for ep := 0; ep < epochs; ep++ {
		var ids []uint64
		for p := puts - 1; p >= 0; p-- { // reverse order, alternating stripes
			var gen uint64
			var d wire.Desc
			for tries := 0; ; tries++ {
				view.update(snd.readEntry(rem))
				gen, d, err = view.target(uint64(p*chunk), uint64(chunk))
				if err == nil {
					break
				}
				if !errors.Is(err, ErrNoBuffer) || tries > 2000 {
					t.Fatalf("epoch %d put %d: %v", ep, p, err)
				}
				time.Sleep(time.Millisecond)
			}
			if gen != uint64(ep) {
				t.Fatalf("put for epoch %d targets generation %d", ep, gen)
			}
			if ep == 0 {
				staleDesc = d
			}
			ids = append(ids, snd.put(p%2, w.slot, gen, d, uint64(p*chunk), pattern(ep, p)))
			view.commit(gen, uint64(chunk))
		}
		for _, id := range ids {
			if wc := snd.side.wait(id); wc.Err() != nil {
				t.Fatalf("put: %v", wc.Err())
			}
		}
		p := posted[ep%3]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rec, err := p.Wait(ctx)
		if err != nil {
			cancel()
			t.Fatalf("epoch %d: %v", ep, err)
		}
		if rec.Epoch != uint64(ep) || rec.Len != bufLen || rec.Ops != puts || rec.Flags != 0 {
			t.Fatalf("epoch %d: record %+v", ep, rec)
		}
		var want []byte
		for q := 0; q < puts; q++ {
			want = append(want, pattern(ep, q)...)
		}
		if !bytes.Equal(p.Bytes(), want) {
			t.Fatalf("epoch %d: wrong bytes", ep)
		}
		if ep < epochs-1 {
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
	}
	// A stale write with epoch 0's descriptor: its buffer now holds epoch
	// 3 or later, or is held by the application. Refused, nothing changed.
	held := posted[(epochs-1)%3]
	snap := bytes.Clone(arena)
	id := snd.put(0, w.slot, 0, staleDesc, 0, pattern(99, 0))
	if wc := snd.side.wait(id); !errors.Is(wc.Err(), verbs.WCRemAccessErr) {
		t.Fatalf("stale write: %v", wc.Err())
	}
	_ = held
	if !bytes.Equal(snap, arena) {
		t.Fatal("a stale write changed a buffer")
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.prog.refused.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if e.prog.refused.Load() != 1 {
		t.Fatalf("receiver counted %d refused writes", e.prog.refused.Load())
	}
	if s := w.Stats(); s.EpochsCompleted != epochs || s.Puts != epochs*puts {
		t.Fatalf("stats %+v", s)
	}
	t.Logf("window stats %+v", w.Stats())

}

var spinLoops = flag.Bool("rvma.spin", false, "the engine's loops busy-poll their CQs")

var rxeDebug = flag.Bool("rvma.rxedebug", false, "TestLabEngineLatency: enable rxe's dynamic debug messages (slow)")

var latSleep = flag.Bool("rvma.latsleep", false, "TestLabEngineLatency: sleep 2 ms between reading the descriptor and the put (diagnostic)")

// TestLabEngineLatency: (a) a 64-byte put until the receiving application's
// Wait returns, every put completing an epoch (so every put costs an
// unbind and a re-bind), against (c) a raw 64-byte WRITE until its last
// byte is seen by polling. Prints figures; fails only if a put is lost or
// refused. See docs/rvma.md, "Measured findings".
func TestLabEngineLatency(t *testing.T) {
	if *rxeDebug {
		// rxe's debug messages (why a key was refused, every state of its
		// state machines) into the kernel log. They slow rxe down a lot:
		// never with figures that count.
		if _, err := os.Stat("/sys/kernel/debug/dynamic_debug"); err != nil {
			_ = syscall.Mount("debugfs", "/sys/kernel/debug", "debugfs", 0, "")
		}
		if err := os.WriteFile("/sys/kernel/debug/dynamic_debug/control", []byte("module rdma_rxe +p\n"), 0); err != nil {
			t.Logf("rxe debug messages not enabled: %v", err)
		}
	}
	e, snd := labEngineSetup(t)
	const iters = 200
	// measure returns the one-way times of iters 64-byte puts, each
	// completing an epoch, until the receiving application sees the
	// completion: by Posted.Wait, or by spinning on the completion
	// pointer's sequence word.
	measure := func(mb Mailbox, guard Guard, mode string) []time.Duration {
		lw, err := e.initWindow(mb, WindowOptions{Guard: guard})
		if err != nil {
			t.Fatal(err)
		}
		small, _ := e.alloc(4 * 4096)
		var lp []*Posted
		for i := 0; i < 4; i++ {
			p, _ := lw.Post(context.Background(), small[i*4096:i*4096+64], nil)
			lp = append(lp, p)
		}
		lview := newSenderView(mb, lw.incarnation)
		lrem := e.descRemote(lw.slot)
		var ta []time.Duration
		for i := 0; i < iters; i++ {
			var gen uint64
			var d wire.Desc
			for tries := 0; ; tries++ {
				lview.update(snd.readEntry(lrem))
				if gen, d, err = lview.target(0, 64); err == nil {
					break
				}
				if tries > 2000 {
					t.Fatalf("latency put %d: %v (entry %+v)", i, err, lview.entry)
				}
				time.Sleep(100 * time.Microsecond)
			}
			p := lp[i%4]
			if *latSleep {
				time.Sleep(2 * time.Millisecond)
			}
			seq := p.Completion().Seq()
			start := time.Now()
			id := snd.put(1, lw.slot, gen, d, 0, bytes.Repeat([]byte{byte(i)}, 64))
			lview.commit(gen, 64)
			if mode == "spin" {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := p.Spin(ctx)
				cancel()
				if err != nil {
					t.Fatalf("latency put %d: %v (refused %d, stats %+v)", i, err, e.prog.refused.Load(), lw.Stats())
				}
			} else if mode == "pointer" {
				for n := 0; p.Completion().Seq() == seq; n++ {
					if n%(1<<16) == 0 && time.Since(start) > 5*time.Second {
						t.Fatalf("latency put %d: no completion (refused %d, stats %+v)", i, e.prog.refused.Load(), lw.Stats())
					}
				}
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := p.Wait(ctx)
				cancel()
				if err != nil {
					t.Fatalf("latency put %d (gen %d, desc %+v): %v; sender completions %+v; receiver refused %d; stats %+v",
						i, gen, d, err, snd.side.drain(500*time.Millisecond), e.prog.refused.Load(), lw.Stats())
				}
			}
			ta = append(ta, time.Since(start))
			if wc := snd.side.wait(id); wc.Err() != nil {
				t.Fatal(wc.Err())
			}
			if err := p.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		return ta
	}
	ta := measure(0x22, GuardInvalidate, "wait")
	tp := measure(0x23, GuardInvalidate, "pointer")
	ts := measure(0x25, GuardInvalidate, "spin")
	tn := measure(0x24, GuardNone, "spin")
	raw, _ := e.alloc(4096)
	rawMR := e.mem.arenaOf(heapAddr(raw), 4096)
	var tc []time.Duration
	for i := 0; i < iters; i++ {
		v := byte(i%250 + 1)
		copy(snd.mr.Bytes()[100000:], bytes.Repeat([]byte{v}, 64))
		snd.id++
		start := time.Now()
		if err := snd.qps[1].PostSend(verbs.SendWR{ID: snd.id, Op: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{snd.mr.SGE(100000, 64)}, RemoteAddr: rawMR.Addr(), RKey: rawMR.RKey()}); err != nil {
			t.Fatal(err)
		}
		last := (*atomic.Uint32)(unsafe.Pointer(&raw[60]))
		for n := 0; byte(last.Load()>>24) != v; n++ {
			if n%(1<<20) == 0 && time.Since(start) > 5*time.Second {
				t.Fatalf("raw write %d never seen (%+v)", i, snd.side.wc)
			}
		}
		tc = append(tc, time.Since(start))
		snd.side.wait(snd.id)
	}
	med := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	mc := med(tc)
	for _, r := range []struct {
		name string
		d    []time.Duration
	}{{"(a) RVMA put, Posted.Wait", ta}, {"(a) RVMA put, polling the completion pointer", tp}, {"(a) RVMA put, Posted.Spin (progress on the caller)", ts}, {"(a) RVMA put, GuardNone, Posted.Spin", tn}} {
		m := med(r.d)
		t.Logf("64 B one-way to the receiving application, loopback, median of %d: %s %v; (c) WRITE + last-byte polling %v; ratio %.2f",
			iters, r.name, m, mc, float64(m)/float64(mc))
	}
}

// labEngineSetup starts an engine and a raw sender with two stripes
// attached to its SRQ.
func labEngineSetup(t *testing.T) (*engine, *labSender) {
	dev, err := verbs.Open(labenv.Device(t))
	if err != nil {
		t.Fatal(err)
	}
	e, err := newEngine(dev, true, net.ParseIP(labenv.Addr()), engineOptions{Spin: *spinLoops, counting: CountLibrary,
		onFail: func(err error) { t.Errorf("engine: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })

	// The sender: its own PD and CQ on the same device, two stripes.
	pd, _ := e.dev.AllocPD()
	ch, _ := e.dev.NewCompChannel()
	cq, _ := e.dev.NewCQ(256, &verbs.CQOptions{Channel: ch})
	snd := &labSender{t: t, side: &labSide{t: t, pd: pd, cq: cq}}
	if snd.mr, err = pd.AllocMR(1<<17, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		qp, err := pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		mine := verbs.QPInfo{QPN: qp.QPN(), PSN: uint32(10 + i), GID: e.gid.GID}
		_, theirs, err := e.attachRaw(mine, uint32(500+i))
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.Connect(mine, theirs, &verbs.ConnectOptions{GIDIndex: e.gid.Index, MaxRdAtomic: 1}); err != nil {
			t.Fatal(err)
		}
		snd.qps = append(snd.qps, qp)
	}

	return e, snd
}

// attachRaw creates a receiving QP on the SRQ connected to a peer QP
// described by peer, as a link would.
func (e *engine) attachRaw(peer verbs.QPInfo, psn uint32) (*verbs.QP, verbs.QPInfo, error) {
	qp, err := e.pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: e.prog.cq, RecvCQ: e.prog.cq, SRQ: e.prog.srq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxSendSGE: 1}})
	if err != nil {
		return nil, verbs.QPInfo{}, err
	}
	local := verbs.QPInfo{QPN: qp.QPN(), PSN: psn, GID: e.gid.GID}
	if err := qp.Connect(local, peer, &verbs.ConnectOptions{GIDIndex: e.gid.Index}); err != nil {
		qp.Close()
		return nil, verbs.QPInfo{}, err
	}
	return qp, local, nil
}
