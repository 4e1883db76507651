//go:build lab

package kmod_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/kmod"
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
	b, _ := json.Marshal(v)
	p := filepath.Join(os.Getenv(labenv.EnvShared), name+".json")
	if err := os.WriteFile(p+".tmp", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
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
	b, err := os.ReadFile(filepath.Join(os.Getenv(labenv.EnvShared), name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

// Guest 2 issues plain RDMA WRITEs, READs and an atomic to guest 1's
// memory; guest 1's module makes them active (the transparent mode, over a
// real link: the responder runs in NET_RX softirq).
func TestTwoGuestsTransparent(t *testing.T) {
	name := labenv.Device(t)
	ctx, err := verbs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	gid, err := ctx.RoCEv2GID(1, net.ParseIP(labenv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := ctx.AllocPD()
	ch, _ := ctx.NewCompChannel()
	cq, err := ctx.NewCQ(256, &verbs.CQOptions{Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.AllocMR(4*page, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	me := peerInfo{QPN: qp.QPN(), GID: gid.GID, Addr: mr.Addr(), RKey: mr.RKey()}
	opts := &verbs.ConnectOptions{GIDIndex: gid.Index, PathMTU: verbs.MTU1024}
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
		if err := qp.Connect(verbs.QPInfo{QPN: me.QPN, PSN: 1, GID: me.GID}, verbs.QPInfo{QPN: peer.QPN, PSN: 2, GID: peer.GID}, opts); err != nil {
			t.Fatal(err)
		}
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
	if err := qp.Connect(verbs.QPInfo{QPN: me.QPN, PSN: 2, GID: me.GID}, verbs.QPInfo{QPN: srv.QPN, PSN: 1, GID: srv.GID}, opts); err != nil {
		t.Fatal(err)
	}
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
