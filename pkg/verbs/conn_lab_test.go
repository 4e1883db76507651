//go:build lab

package verbs_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// connPair listens on this guest's address and port and dials it: the
// accepted and the dialed Conn, both closed when the test ends.
func connPair(t *testing.T, port uint16, o *verbs.ConnOptions) (srv, cli *verbs.Conn) {
	t.Helper()
	labenv.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ap := netip.AddrPortFrom(netip.MustParseAddr(labenv.Addr()), port)
	l, err := verbs.Listen(ap, o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type res struct {
		c   *verbs.Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := l.Accept(ctx)
		acc <- res{c, err}
	}()
	cli, err = verbs.Dial(ctx, ap, o)
	if err != nil {
		t.Fatalf("Dial %v: %v", ap, err)
	}
	t.Cleanup(func() { cli.Close() })
	r := <-acc
	if r.err != nil {
		t.Fatalf("Accept: %v", r.err)
	}
	t.Cleanup(func() { r.c.Close() })
	return r.c, cli
}

// postRecvs posts n receives of 64 bytes each into mr.
func postRecvs(t *testing.T, c *verbs.Conn, mr *verbs.MR, n int) {
	t.Helper()
	for i := range n {
		if err := c.QP.PostRecv(verbs.RecvWR{ID: uint64(100 + i), SGL: []verbs.SGE{mr.SGE(i*64, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
}

// drainToGone waits for completions until Wait returns ErrPeerGone; it
// returns how many flushed (WCWRFlushErr) completions came first and how
// long it took. The old behaviour (receives never flushed) ends in ctx's
// deadline and fails the test.
func drainToGone(t *testing.T, c *verbs.Conn, d time.Duration) (int, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	t0 := time.Now()
	wcs := make([]verbs.WC, 16)
	flushed := 0
	for {
		n, err := c.Wait(ctx, wcs)
		if errors.Is(err, verbs.ErrPeerGone) {
			return flushed, time.Since(t0)
		}
		if err != nil {
			t.Fatalf("Wait after the connection ended (%d flushed so far): %v", flushed, err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != verbs.WCWRFlushErr {
				t.Fatalf("completion %d after the connection ended: %v", wc.ID, wc.Err())
			}
			flushed++
		}
	}
}

// TestLoopbackConnPingPong (suite verbs-loopback): Dial and Accept give
// connected endpoints in one call each; a send and its receive, every
// byte checked; the private data of the request reaches Accept's Conn.
func TestLoopbackConnPingPong(t *testing.T) {
	srv, cli := connPair(t, 7480, &verbs.ConnOptions{Param: &verbs.ConnParam{PrivateData: []byte("hello")}})
	if got := string(srv.PrivateData()[:5]); got != "hello" {
		t.Errorf("the request's private data at Accept: %q", got)
	}
	smr, err := srv.PD.AllocMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	cmr, err := cli.PD.AllocMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	postRecvs(t, srv, smr, 1)
	fill(cmr.Bytes()[:64], 9)
	if err := cli.QP.PostSend(verbs.SendWR{ID: 1, Op: verbs.OpSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{cmr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wcs := make([]verbs.WC, 4)
	for _, c := range []*verbs.Conn{cli, srv} {
		n, err := c.Wait(ctx, wcs)
		if err != nil || n != 1 || wcs[0].Err() != nil {
			t.Fatalf("Wait: %d, %v, %+v", n, err, wcs[0])
		}
	}
	checkBytes(t, "the message", smr.Bytes()[:64], cmr.Bytes()[:64])
	if srv.PeerAddr().Addr() != cli.LocalAddr().Addr() {
		t.Errorf("addresses: server's peer %v, client's local %v", srv.PeerAddr(), cli.LocalAddr())
	}
}

// TestLoopbackConnPeerCloses (suite verbs-loopback): the peer closes
// while this side waits with receives posted: they flush at once and
// Wait then says ErrPeerGone; the peer's Close does not wait for an
// answer that never comes; this side's Close returns nil, and a second
// Close too. Then the other order, and both at once.
func TestLoopbackConnPeerCloses(t *testing.T) {
	for i, order := range []string{"client first", "server first", "both at once"} {
		t.Run(order, func(t *testing.T) {
			srv, cli := connPair(t, uint16(7481+i), nil)
			mr, err := srv.PD.AllocMR(4096, verbs.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			postRecvs(t, srv, mr, 4)
			cmr, err := cli.PD.AllocMR(4096, verbs.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			postRecvs(t, cli, cmr, 4)
			closer, survivor := cli, srv
			if order == "server first" {
				closer, survivor = srv, cli
			}
			t0 := time.Now()
			if order == "both at once" {
				errc := make(chan error, 1)
				go func() { errc <- srv.Close() }()
				if err := cli.Close(); err != nil {
					t.Errorf("client Close: %v", err)
				}
				if err := <-errc; err != nil {
					t.Errorf("server Close: %v", err)
				}
				t.Logf("both closed at once in %v", time.Since(t0).Round(time.Millisecond))
				return
			}
			if err := closer.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			closeTook := time.Since(t0)
			n, took := drainToGone(t, survivor, 10*time.Second)
			if n != 4 {
				t.Errorf("%d receives flushed, want 4", n)
			}
			if st := survivor.QP.State(); st != verbs.QPStateError {
				t.Errorf("the survivor's QP: %v, want ERR", st)
			}
			select {
			case <-survivor.Done():
			default:
				t.Errorf("Done not closed on the survivor")
			}
			t1 := time.Now()
			if err := survivor.Close(); err != nil {
				t.Errorf("the survivor's Close: %v", err)
			}
			if err := survivor.Close(); err != nil {
				t.Errorf("a second Close: %v", err)
			}
			t.Logf("the closer's Close took %v; the survivor saw its 4 receives flushed and ErrPeerGone %v later, and closed in %v",
				closeTook.Round(time.Millisecond), took.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
			if closeTook >= verbs.DisconnectWait {
				t.Errorf("the closer's Close waited %v: the survivor never answered", closeTook)
			}
		})
	}
}

// TestLoopbackConnWaitEventThenDisconnect (suite verbs-loopback): with the
// low-level calls, a survivor that took CMDisconnected from WaitEvent
// finds its QP in the error state, and its Disconnect returns nil at once
// (it no longer waits for the event WaitEvent took); the CMID's Ended
// channel is closed.
func TestLoopbackConnWaitEventThenDisconnect(t *testing.T) {
	srv, cli := connPair(t, 7485, nil)
	if err := cli.ID.Disconnect(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := srv.ID.WaitEvent(ctx)
	if err != nil || ev.Type != verbs.CMDisconnected {
		t.Fatalf("WaitEvent: %v, %v; want CMDisconnected", ev.Type, err)
	}
	if st := srv.QP.State(); st != verbs.QPStateError {
		t.Errorf("QP after CMDisconnected: %v, want ERR", st)
	}
	t0 := time.Now()
	if err := srv.ID.Disconnect(ctx); err != nil {
		t.Errorf("Disconnect after WaitEvent took the event: %v", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("Disconnect after the connection ended took %v", d)
	}
	select {
	case <-srv.ID.Ended():
	default:
		t.Errorf("Ended not closed")
	}
	if err := cli.ID.Disconnect(ctx); err != nil {
		t.Errorf("a second Disconnect: %v", err)
	}
}

const connHelperEnv = "VERBS_CONN_HELPER"

// TestLoopbackConnHelper is the child of TestLoopbackConnPeerKilled; run
// directly it does nothing.
func TestLoopbackConnHelper(t *testing.T) {
	addr := os.Getenv(connHelperEnv)
	if addr == "" {
		return
	}
	c, err := verbs.Dial(context.Background(), netip.MustParseAddrPort(addr), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Println("helper: connected")
	time.Sleep(time.Hour)
}

// TestLoopbackConnPeerKilled (suite verbs-loopback): the peer's process
// is killed with SIGKILL: this side's posted receives flush and Wait
// says ErrPeerGone, and a send posted after fails at once (not after the
// transport's retries).
func TestLoopbackConnPeerKilled(t *testing.T) {
	labenv.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ap := netip.AddrPortFrom(netip.MustParseAddr(labenv.Addr()), 7486)
	l, err := verbs.Listen(ap, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestLoopbackConnHelper$", "-test.v")
	cmd.Env = append(os.Environ(), connHelperEnv+"="+ap.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	c, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "helper: connected") {
	}
	go io.Copy(io.Discard, out)
	mr, err := c.PD.AllocMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	postRecvs(t, c, mr, 4)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	n, took := drainToGone(t, c, 20*time.Second)
	if n != 4 {
		t.Errorf("%d receives flushed, want 4", n)
	}
	t.Logf("peer killed: 4 receives flushed and ErrPeerGone after %v", took.Round(time.Millisecond))
	t0 := time.Now()
	err = c.QP.PostSend(verbs.SendWR{ID: 7, Op: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(0, 8)}})
	if err == nil {
		wcs := make([]verbs.WC, 1)
		var k int
		k, err = c.CQ.Wait(ctx, wcs)
		if err == nil && k == 1 {
			err = wcs[0].Err()
		}
	}
	if err == nil {
		t.Errorf("a send to a killed peer succeeded")
	}
	t.Logf("a send after the peer was killed: %v, after %v", err, time.Since(t0).Round(time.Millisecond))
}

// TestLoopbackConnRefused (suite verbs-loopback): Dial to a port nothing
// listens on fails with a *RejectError that says so, carries no padding
// as private data, and is ECONNREFUSED; an already cancelled context
// fails before anything is sent.
func TestLoopbackConnRefused(t *testing.T) {
	labenv.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ap := netip.AddrPortFrom(netip.MustParseAddr(labenv.Addr()), 7487)
	_, err := verbs.Dial(ctx, ap, nil)
	var re *verbs.RejectError
	if !errors.As(err, &re) || !re.NoListener() || re.PrivateData != nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Dial to a port nothing listens on: %v", err)
	}
	if strings.Contains(err.Error(), "private data") || !strings.Contains(err.Error(), "nothing listens") {
		t.Errorf("message: %v", err)
	}
	t.Logf("Dial to a port nothing listens on: %v", err)
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if _, err := verbs.Dial(cctx, ap, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Dial with a cancelled context: %v", err)
	}
}

// TestLoopbackCQOverrun (suite verbs-loopback): 60 signaled writes on a
// QP whose CQ has room for far fewer overrun it: the next Poll (and every
// one after) fails with ErrCQOverrun, the QP is in the error state, and
// WaitAsyncEvent still returns the IBV_EVENT_CQ_ERR naming the CQ. A
// failed WaitAsyncEvent returns an event that prints as none.
func TestLoopbackCQOverrun(t *testing.T) {
	ctx := openDev(t)
	a, b := pair(t, ctx, endOpts{sendWR: 64}, nil)
	small, err := ctx.NewCQ(7, nil)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := a.pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: small, RecvCQ: small,
		Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 1}})
	if err != nil {
		t.Fatal(err)
	}
	info := verbs.QPInfo{QPN: qp.QPN(), PSN: 0x333, GID: a.gid.GID}
	if err := qp.Connect(info, b.info(0x444), &verbs.ConnectOptions{GIDIndex: gidIndexOpt(a.gid.Index)}); err != nil {
		t.Fatal(err)
	}
	// b's QP is connected to a's; connect it to qp instead
	if err := b.qp.Reset(); err != nil {
		t.Fatal(err)
	}
	b.connect(b.info(0x444), info, nil)
	const posts = 60
	for i := range posts {
		if err := qp.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	wcs := make([]verbs.WC, 1) // one at a time, so that the CQ stays full
	got := 0
	for {
		n, err := small.Poll(wcs)
		got += n
		if errors.Is(err, verbs.ErrCQOverrun) {
			t.Logf("a CQ of %d entries, %d signaled writes: ErrCQOverrun after %d completions: %v", small.Size(), posts, got, err)
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if got >= posts {
			t.Fatalf("all %d completions of a CQ of %d entries arrived: no overrun", got, small.Size())
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ErrCQOverrun after %d completions", got)
		}
		if n == 0 && got >= small.Size() {
			time.Sleep(10 * time.Millisecond)
		} else if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if _, err := small.Poll(wcs); !errors.Is(err, verbs.ErrCQOverrun) {
		t.Errorf("the next Poll: %v, want ErrCQOverrun again", err)
	}
	if st := qp.State(); st != verbs.QPStateError {
		t.Errorf("the QP of an overrun CQ: %v, want ERR", st)
	}
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		ev, err := ctx.WaitAsyncEvent(wctx)
		if err != nil {
			t.Fatalf("no IBV_EVENT_CQ_ERR from WaitAsyncEvent: %v", err)
		}
		if ev.Type == verbs.EventCQErr {
			if ev.CQ != small {
				t.Errorf("the CQ_ERR event names %p, want %p", ev.CQ, small)
			}
			break
		}
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if ev, err := ctx.WaitAsyncEvent(cctx); err == nil || ev.String() != "no event" {
		t.Errorf("WaitAsyncEvent with a cancelled context: %v, %v", ev, err)
	}
	qp.Close()
	if st := qp.State(); st != verbs.QPStateError {
		t.Errorf("State after Close: %v, want ERR", st)
	}
}
