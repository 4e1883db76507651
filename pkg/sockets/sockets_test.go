package sockets_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
	"github.com/rdmaplus/rdmaplus/pkg/sockets"
	"github.com/rdmaplus/rdmaplus/pkg/sockets/internal/broker/brokertest"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// noBroker is Options pointing at a broker socket that does not exist:
// rvmad absent.
func noBroker(t *testing.T) *sockets.Options {
	return &sockets.Options{Socket: filepath.Join(t.TempDir(), "none.sock")}
}

func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// pair returns a dialed and an accepted Conn over loopback.
func pair(t *testing.T, co, so *sockets.Options) (cli, srv *sockets.Conn) {
	t.Helper()
	l, err := sockets.Listen("tcp4", "127.0.0.1:0", so)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acc := make(chan *sockets.Conn, 1)
	go func() {
		c, err := l.AcceptContext(ctx)
		if err != nil {
			t.Error(err)
		}
		acc <- c
	}()
	cli, err = sockets.Dial(ctx, "tcp4", l.Addr().String(), co)
	if err != nil {
		t.Fatal(err)
	}
	srv = <-acc
	if srv == nil {
		t.FailNow()
	}
	t.Cleanup(func() { cli.Close(); srv.Close() })
	return cli, srv
}

// exchange writes n pattern bytes each way at once and checks them.
func exchange(t *testing.T, a, b *sockets.Conn, n int) {
	t.Helper()
	pa, pb := pattern(1, n), pattern(2, n)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, d := range []struct {
		w    *sockets.Conn
		r    *sockets.Conn
		data []byte
	}{{a, b, pa}, {b, a, pb}} {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := d.w.Write(d.data); err != nil {
				errs <- err
			}
		}()
		go func() {
			defer wg.Done()
			got := make([]byte, len(d.data))
			if _, err := io.ReadFull(d.r, got); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, d.data) {
				errs <- errors.New("bytes differ")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestNoBrokerStaysTCP(t *testing.T) {
	o := noBroker(t)
	o.WaitAttach = true
	cli, srv := pair(t, o, noBroker(t))
	exchange(t, cli, srv, 1<<20)
	for _, c := range []*sockets.Conn{cli, srv} {
		if p := c.Path(); p.Read != sockets.TCP || p.Write != sockets.TCP || p.Phase != "plain" {
			t.Errorf("path %+v", p)
		}
	}
	st := cli.Stats()
	if st.ReadTCP != 1<<20 || st.WrittenTCP != 1<<20 || st.ReadRDMA != 0 || st.WrittenRDMA != 0 {
		t.Errorf("client stats %+v", st)
	}
	if st.Fallbacks["no_daemon"] != 1 {
		t.Errorf("fallbacks %v, want no_daemon once", st.Fallbacks)
	}
	if err := cli.Demote(context.Background()); !errors.Is(err, sockets.ErrNotAttached) {
		t.Errorf("Demote of a TCP connection: %v", err)
	}
}

func TestDisabledAndHalfClose(t *testing.T) {
	cli, srv := pair(t, &sockets.Options{Disable: true}, noBroker(t))
	data := pattern(3, 100000)
	go func() {
		cli.Write(data)
		cli.CloseWrite()
	}()
	got, err := io.ReadAll(srv)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadAll: %d bytes, %v", len(got), err)
	}
	if _, err := cli.Write([]byte("x")); err == nil {
		t.Error("Write after CloseWrite succeeded")
	}
	// The other direction still works.
	if _, err := srv.Write([]byte("back")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(cli, b); err != nil || string(b) != "back" {
		t.Fatalf("%q %v", b, err)
	}
	srv.Close()
	if n, err := cli.Read(b); n != 0 || err != io.EOF {
		t.Fatalf("after the peer's close: %d, %v", n, err)
	}
}

func TestDeadlines(t *testing.T) {
	cli, srv := pair(t, noBroker(t), noBroker(t))
	cli.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	t0 := time.Now()
	_, err := cli.Read(make([]byte, 10))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline: %v", err)
	}
	if d := time.Since(t0); d < 90*time.Millisecond || d > 5*time.Second {
		t.Errorf("the deadline took %v", d)
	}
	// A deadline moved while a Read waits.
	cli.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() { _, err := cli.Read(make([]byte, 10)); done <- err }()
	time.Sleep(50 * time.Millisecond)
	cli.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read did not see its new deadline")
	}
	cli.SetReadDeadline(time.Time{})
	srv.Write([]byte("hi"))
	b := make([]byte, 2)
	if _, err := io.ReadFull(cli, b); err != nil {
		t.Fatal(err)
	}
	// Writes against a peer that does not read.
	cli.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	big := make([]byte, 1<<20)
	var werr error
	for i := 0; i < 200 && werr == nil; i++ {
		_, werr = cli.Write(big)
	}
	if !errors.Is(werr, os.ErrDeadlineExceeded) {
		t.Fatalf("Write past the deadline: %v", werr)
	}
}

func TestCloseWakesAndTwice(t *testing.T) {
	cli, _ := pair(t, noBroker(t), noBroker(t))
	done := make(chan error, 1)
	go func() { _, err := cli.Read(make([]byte, 10)); done <- err }()
	time.Sleep(50 * time.Millisecond)
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("blocked Read after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake Read")
	}
	if err := cli.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, err := cli.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatal(err)
	}
	if err := cli.SetDeadline(time.Now()); !errors.Is(err, net.ErrClosed) {
		t.Fatal(err)
	}
}

func TestUpgradeAndOptions(t *testing.T) {
	if _, err := sockets.Dial(context.Background(), "udp", "127.0.0.1:1", nil); !errors.Is(err, sockets.ErrOptions) {
		t.Errorf("udp: %v", err)
	}
	if _, err := sockets.Listen("tcp", "127.0.0.1:0", &sockets.Options{RingSize: 3000}); !errors.Is(err, sockets.ErrOptions) {
		t.Errorf("ring 3000: %v", err)
	}
	if _, err := sockets.Upgrade(context.Background(), nil, nil); !errors.Is(err, sockets.ErrOptions) {
		t.Errorf("nil conn: %v", err)
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() { c, _ := l.Accept(); acc <- c }()
	d, err := net.Dial("tcp4", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	so := noBroker(t)
	so.Accepted = true
	srv, err := sockets.Upgrade(context.Background(), (<-acc).(*net.TCPConn), so)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := sockets.Upgrade(context.Background(), d.(*net.TCPConn), noBroker(t))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	exchange(t, cli, srv, 300000)
	if cli.LocalAddr().String() != srv.RemoteAddr().String() {
		t.Errorf("addresses %v %v", cli.LocalAddr(), srv.RemoteAddr())
	}
}

func TestAcceptContext(t *testing.T) {
	l, err := sockets.Listen("tcp", "127.0.0.1:0", noBroker(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := l.AcceptContext(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("AcceptContext: %v", err)
	}
	l.Close()
	if err := l.Close(); err != nil {
		t.Error("second Close:", err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
}

// TestBrokerWithoutDevice: with a broker but no RDMA device (the host),
// the dialer registers and falls back (no_device) without asking, and
// the acceptor answers an ATTACH_REQ with ATTACH_NACK{no_device}.
func TestBrokerWithoutDevice(t *testing.T) {
	if devs, _ := verbs.Devices(); len(devs) > 0 {
		t.Skip("this host has an RDMA device; the lab tests cover attaching")
	}
	f := brokertest.New(t)
	o := &sockets.Options{Socket: f.Path, WaitAttach: true}
	cli, srv := pair(t, o, &sockets.Options{Socket: f.Path})
	regs := map[sockwire.Tuple]bool{}
	for len(regs) < 2 {
		select {
		case m := <-f.Msgs:
			r, ok := m.Rec.(sockwire.Register)
			if !ok || !m.FDOK {
				t.Fatalf("the broker got %+v (socket passed: %v) before both REGISTERs", m.Rec, m.FDOK)
			}
			regs[r.Tuple] = true
		case <-time.After(5 * time.Second):
			t.Fatal("no REGISTER")
		}
	}
	if st := cli.Stats(); st.Fallbacks["no_device"] != 1 {
		t.Errorf("client fallbacks %v, want no_device", st.Fallbacks)
	}
	// The server's tuple: its local port is the listener's.
	var srvT sockwire.Tuple
	for tu := range regs {
		if int(tu.LocalPort) == srv.LocalAddr().(*net.TCPAddr).Port {
			srvT = tu
		}
	}
	ep := sockwire.Endpoint{QPN: 5, PSN: 6, RingLog2: 18, MTU: 3}
	if err := f.Send(srvT, sockwire.Attach{Epoch: 1, Tuple: srvT, Endpoint: ep}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-f.Msgs:
		if m.Route == nil || m.Route.Tuple != srvT || m.Rec != (sockwire.Nack{Epoch: 1, Reason: sockwire.ReasonNoDevice}) {
			t.Fatalf("the server answered %+v %+v", m.Route, m.Rec)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not answer its ATTACH_REQ")
	}
	exchange(t, cli, srv, 200000)
	if p := srv.Path(); p.Read != sockets.TCP || p.Write != sockets.TCP || p.Phase != "plain" {
		t.Errorf("server path %+v", p)
	}
	cli.Close()
	select {
	case m := <-f.Msgs:
		if _, ok := m.Rec.(sockwire.Unregister); !ok {
			t.Fatalf("after Close the broker got %+v", m.Rec)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no UNREGISTER after Close")
	}
}

// TestCloseUnblocksWrite: Close of a TCP connection whose Write is
// blocked on a peer that does not read returns the Write at once.
func TestCloseUnblocksWrite(t *testing.T) {
	cli, _ := pair(t, noBroker(t), noBroker(t))
	done := make(chan error, 1)
	go func() {
		big := make([]byte, 1<<20)
		var err error
		for err == nil {
			_, err = cli.Write(big)
		}
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("no error")
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("Write returned %v after Close", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close left a Write blocked")
	}
}
