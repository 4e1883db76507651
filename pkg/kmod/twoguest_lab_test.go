//go:build lab

package kmod_test

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

type peerInfo struct {
	QPN  uint32
	GID  verbs.GID
	Addr uint64
	RKey uint32
}

func publish(t *testing.T, name string, v any) {
	t.Helper()
	if err := labenv.Publish(name, v); err != nil {
		t.Fatal(err)
	}
	if err := labenv.Signal(name); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := labenv.Wait(ctx, name); err != nil {
		t.Fatal(err)
	}
}

func fetch(t *testing.T, name string, v any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := labenv.Wait(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := labenv.Load(name, v); err != nil {
		t.Fatal(err)
	}
}

// link is one guest's end of an RC connection to the other guest.
type link struct {
	*side
	me   peerInfo
	opts *verbs.ConnectOptions
}

func newLink(t *testing.T, pages, sendWR int) *link {
	t.Helper()
	name := labenv.Device(t)
	ctx, err := verbs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	gid, err := ctx.RoCEv2GID(1, net.ParseIP(labenv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	s := newSide(t, ctx, pages*page, sendWR)
	return &link{side: s,
		me:   peerInfo{QPN: s.qp.QPN(), GID: gid.GID, Addr: s.mr.Addr(), RKey: s.mr.RKey()},
		opts: &verbs.ConnectOptions{GIDIndex: gid.Index, PathMTU: verbs.MTU1024}}
}

// connect brings the QP to RTS towards peer; the server starts at PSN 1,
// the client at PSN 2.
func (l *link) connect(t *testing.T, peer peerInfo) {
	t.Helper()
	mine, theirs := uint32(1), uint32(2)
	if labenv.Role() != "server" {
		mine, theirs = 2, 1
	}
	if err := l.qp.Connect(verbs.QPInfo{QPN: l.me.QPN, PSN: mine, GID: l.me.GID},
		verbs.QPInfo{QPN: peer.QPN, PSN: theirs, GID: peer.GID}, l.opts); err != nil {
		t.Fatal(err)
	}
}

// Guest 2 issues plain RDMA WRITEs, READs and an atomic to guest 1's
// memory; guest 1's module makes them active (the transparent mode, over a
// real link: the responder runs in NET_RX softirq).
func TestTwoGuestsTransparent(t *testing.T) {
	l := newLink(t, 4, 64)
	qp, cq, mr, me := l.qp, l.cq, l.mr, l.me
	mem := pattern(4*page, 42)
	write := pattern(3000, 99)

	if labenv.Role() == "server" {
		copy(mr.Bytes(), mem)
		d, err := kmod.Open()
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		dm, err := d.NewDomain(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		if err := dm.Notify(kmod.NotifyOptions{Threshold: 1}); err != nil {
			t.Fatal(err)
		}
		// page 0: served and logged with data; page 1: W=0 R=1 logged
		// with data; pages 2-3: plain.
		if err := dm.Arm(mr.RKey(), mr.Addr(), page, kmod.W|kmod.R|kmod.RL|kmod.RLD|kmod.WL); err != nil {
			t.Fatal(err)
		}
		if err := dm.Arm(mr.RKey(), mr.Addr()+page, page, kmod.R|kmod.WL|kmod.WLD); err != nil {
			t.Fatal(err)
		}
		publish(t, "aa-server", me)
		var peer peerInfo
		fetch(t, "aa-client", &peer)
		l.connect(t, peer)
		labenv.Signal("aa-server-rtr")
		waitFor(t, "aa-client-done")

		var es []kmod.Entry
		wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for {
			if es, err = dm.Read(es, 0); err != nil {
				t.Fatal(err)
			}
			var w int
			for _, e := range es {
				if e.Op == kmod.OpWrite {
					w += int(e.Length)
				}
			}
			if _, _, r := covered(t, es, mr.Addr(), func(o int) byte { return mem[o] }); w == 3000 && r == 2000 {
				break
			}
			if _, err := dm.Wait(wctx); err != nil {
				t.Fatalf("waiting for entries (have %d): %v", len(es), err)
			}
		}
		var wdata []byte
		for i, e := range es {
			if e.Seq != uint64(i+1) || e.QPN != qp.QPN() || e.SrcQPN != peer.QPN {
				t.Fatalf("entry %d: seq %d QP %d from %d; want QP %d from %d", i, e.Seq, e.QPN, e.SrcQPN, qp.QPN(), peer.QPN)
			}
			switch e.Op {
			case kmod.OpWrite:
				if !e.Suppressed {
					t.Fatalf("write entry not suppressed: %+v", e)
				}
				wdata = append(wdata, e.Data...)
			}
		}
		if !bytes.Equal(wdata, write) {
			t.Fatal("logged write data differs from what the client wrote")
		}
		if lo, hi, n := covered(t, es, mr.Addr(), func(o int) byte { return mem[o] }); lo != 100 || hi != 2100 || n != 2000 {
			t.Fatalf("logged read data covers [%d, %d) (%d bytes), want the 2000 bytes served", lo, hi, n)
		}
		if !bytes.Equal(mr.Bytes(), append(append([]byte(nil), mem[:3*page]...), func() []byte {
			b := append([]byte(nil), mem[3*page:]...)
			copy(b[100:], "plain")
			return b
		}()...)) {
			t.Fatal("memory: the W=0 page changed or the plain write is missing")
		}
		st, _ := d.Stats()
		if st.Missed != 0 {
			t.Fatalf("missed %d", st.Missed)
		}
		t.Logf("%d entries from QP %d, all checked", len(es), peer.QPN)
		labenv.Signal("aa-server-done")
		return
	}

	var srv peerInfo
	fetch(t, "aa-server", &srv)
	l.connect(t, srv)
	publish(t, "aa-client", me)
	waitFor(t, "aa-server-rtr")
	wait := func() error {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		wcs := make([]verbs.WC, 1)
		if _, err := cq.Wait(c, wcs); err != nil {
			t.Fatal(err)
		}
		return wcs[0].Err()
	}
	post := func(op verbs.Opcode, loff, n int, raddr uint64) error {
		if err := qp.PostSend(verbs.SendWR{Op: op, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(loff, n)},
			RemoteAddr: raddr, RKey: srv.RKey}); err != nil {
			t.Fatal(err)
		}
		return wait()
	}
	copy(mr.Bytes(), write)
	if err := post(verbs.OpWrite, 0, 3000, srv.Addr+page+500); err != nil {
		t.Fatalf("write to the W=0 page: %v", err)
	}
	copy(mr.Bytes()[3*page:], "plain")
	if err := post(verbs.OpWrite, 3*page, 5, srv.Addr+3*page+100); err != nil {
		t.Fatalf("plain write: %v", err)
	}
	clear(mr.Bytes()[page : 2*page])
	if err := post(verbs.OpRead, page, 2000, srv.Addr+100); err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(mr.Bytes()[page:page+2000], mem[100:2100]) {
		t.Fatal("read returned other bytes than the server's memory")
	}
	labenv.Signal("aa-client-done")
	waitFor(t, "aa-server-done")
}

// Guest 2 floods plain WRITEs at guest 1's logged pages while guest 1's
// process keeps the module's hooks busy in process context: it writes 4 KiB
// at a time, in loopback, into a page of its own that logs the data, so
// rxe runs the hooked copy inline in its system calls for most of the
// test. Incoming packets are handled in NET_RX softirq, which can
// interrupt that process-context hook on the same CPU. Every remote write
// must still be logged exactly once and no hook hit may be skipped.
func TestTwoGuestsNestedHooks(t *testing.T) {
	const n, size, pages = 6000, 64, 4
	l := newLink(t, pages, 128)
	off := func(k int) int { return (k * size) % (pages * page) }

	if labenv.Role() != "server" {
		var srv peerInfo
		fetch(t, "nest-server", &srv)
		l.connect(t, srv)
		publish(t, "nest-client", l.me)
		waitFor(t, "nest-server-rtr")
		wcs := make([]verbs.WC, 64)
		for k := 0; k < n; k += 64 {
			for i := k; i < k+64 && i < n; i++ {
				if err := l.qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{l.mr.SGE(off(i), size)}, RemoteAddr: srv.Addr + uint64(off(i)), RKey: srv.RKey}); err != nil {
					t.Fatalf("PostSend %d: %v", i, err)
				}
			}
			for got := 0; got < min(64, n-k); {
				c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				m, err := l.cq.Wait(c, wcs)
				cancel()
				if err != nil {
					t.Fatalf("write completions: %v", err)
				}
				for _, wc := range wcs[:m] {
					if err := wc.Err(); err != nil {
						t.Fatalf("write %d: %v", wc.ID, err)
					}
				}
				got += m
			}
		}
		labenv.Signal("nest-client-done")
		waitFor(t, "nest-server-done")
		return
	}

	d := openDev(t)
	remote := newDomain(t, d, 1<<20)
	if err := remote.Arm(l.mr.RKey(), l.mr.Addr(), pages*page, kmod.W|kmod.R|kmod.WL); err != nil {
		t.Fatal(err)
	}
	// The noise: loopback 4 KiB writes into a WLD page, its log drained.
	p := newPair(t, 1)
	local := newDomain(t, d, 1<<20)
	if err := local.Arm(p.key(), p.addr(0), page, kmod.W|kmod.R|kmod.WL|kmod.WLD); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	noise := make(chan int, 1)
	go func() {
		k := 0
		defer func() { noise <- k }()
		wcs := make([]verbs.WC, 1)
		for ; ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := p.src.qp.PostSend(verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{p.src.mr.SGE(0, page)}, RemoteAddr: p.addr(0), RKey: p.key()}); err != nil {
				t.Errorf("noise PostSend: %v", err)
				return
			}
			c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, err := p.src.cq.Wait(c, wcs)
			cancel()
			if err == nil {
				err = wcs[0].Err()
			}
			if err != nil {
				t.Errorf("noise write %d: %v", k, err)
				return
			}
			if _, err := local.Read(nil, 0); err != nil {
				t.Errorf("noise log: %v", err)
				return
			}
		}
	}()

	publish(t, "nest-server", l.me)
	var peer peerInfo
	fetch(t, "nest-client", &peer)
	l.connect(t, peer)
	labenv.Signal("nest-server-rtr")
	done := make(chan struct{})
	go func() {
		c, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		labenv.Wait(c, "nest-client-done")
		close(done)
	}()

	var es []kmod.Entry
	var err error
	quiet := time.Time{}
	for len(es) < n {
		before := len(es)
		if es, err = remote.Read(es, 0); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
			if len(es) > before || quiet.IsZero() {
				quiet = time.Now()
			} else if time.Since(quiet) > 3*time.Second {
				close(stop)
				t.Fatalf("%d of %d remote writes logged (noise: %d local writes); stats %+v", len(es), n, <-noise, stats(t, d))
			}
		default:
		}
		c, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		remote.Wait(c)
		cancel()
	}
	close(stop)
	nn := <-noise
	<-done
	per := make(map[uint64]int)
	for i, e := range es {
		if e.Seq != uint64(i+1) || e.Op != kmod.OpWrite || e.Length != size || e.SrcQPN != peer.QPN {
			t.Fatalf("entry %d: %+v", i, e)
		}
		per[e.IOVA]++
	}
	for k := 0; k < pages*page/size; k++ {
		if want := (n - k + pages*page/size - 1) / (pages * page / size); per[l.mr.Addr()+uint64(off(k))] != want {
			t.Fatalf("offset %d logged %d times, want %d", off(k), per[l.mr.Addr()+uint64(off(k))], want)
		}
	}
	st := stats(t, d)
	if st.Missed != 0 {
		t.Fatalf("the kernel skipped %d hook hits", st.Missed)
	}
	t.Logf("%d remote writes logged once each while %d local 4 KiB writes ran the hooks in process context; missed %d", n, nn, st.Missed)
	labenv.Signal("nest-server-done")
}

func stats(t *testing.T, d *kmod.Device) kmod.Stats {
	t.Helper()
	st, err := d.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}
