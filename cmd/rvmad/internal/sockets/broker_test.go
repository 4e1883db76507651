package sockets

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// host is one broker of a test, as if on a host of its own: its Unix
// socket and its pairing address. peer is where it dials for any peer,
// atomic: the broker reads it on its goroutines, and the race detector
// orders them after the test through write(2), not through sendmsg(2).
type host struct {
	b    *Broker
	sock string
	addr string
	peer atomic.Pointer[string]
}

func (h *host) setPeer(addr string) { h.peer.Store(&addr) }

func newHost(t *testing.T, maxPerUID int) *host { return newHostOn(t, maxPerUID, "127.0.0.1") }

func newHostOn(t *testing.T, maxPerUID int, ip string) *host {
	t.Helper()
	h := &host{sock: filepath.Join(t.TempDir(), "sockets.sock")}
	h.setPeer("")
	h.b = NewBroker(Options{MaxPerUID: maxPerUID, PeerAddr: func(netip.Addr) string { return *h.peer.Load() }}, nil)
	a, err := h.b.ListenPairing(net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	h.addr = a.String()
	if err := h.b.Listen(h.sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := h.b.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return h
}

// pairHosts makes a and b each other's peer.
func pairHosts(a, b *host) { a.setPeer(b.addr); b.setPeer(a.addr) }

// proc is a process's connection to a broker's Unix socket.
type proc struct {
	t    *testing.T
	conn net.Conn
}

func dialProc(t *testing.T, h *host) *proc {
	t.Helper()
	c, err := net.Dial("unixpacket", h.sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &proc{t: t, conn: c}
}

func (p *proc) sendRaw(b []byte) {
	p.t.Helper()
	if _, err := p.conn.Write(b); err != nil {
		p.t.Fatal(err)
	}
}

func (p *proc) send(m message) {
	p.t.Helper()
	p.sendFDs(m)
}

// sendRawFDs sends b with fds as SCM_RIGHTS.
func (p *proc) sendRawFDs(b []byte, fds ...int) {
	p.t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := p.conn.(*net.UnixConn).WriteMsgUnix(b, oob, nil); err != nil {
		p.t.Fatal(err)
	}
}

// sendFDs sends m with fds as SCM_RIGHTS.
func (p *proc) sendFDs(m message, fds ...int) {
	p.t.Helper()
	b, err := m.encode(nil)
	if err != nil {
		p.t.Fatal(err)
	}
	p.sendRawFDs(b, fds...)
}

// recv returns the next message within 5 s.
func (p *proc) recv() message {
	p.t.Helper()
	m, err := p.tryRecv(5 * time.Second)
	if err != nil {
		p.t.Fatal(err)
	}
	return m
}

func (p *proc) tryRecv(d time.Duration) (message, error) {
	buf := make([]byte, 1024)
	p.conn.SetReadDeadline(time.Now().Add(d))
	n, err := p.conn.Read(buf)
	if err != nil {
		return message{}, err
	}
	return parseMessage(buf[:n])
}

// closed reports whether the broker closed p's connection.
func (p *proc) closed() bool {
	_, err := p.tryRecv(5 * time.Second)
	return errors.Is(err, io.EOF)
}

// register registers the connection conn of this process, passing its
// socket, and checks the broker's answer.
func (p *proc) register(conn *net.TCPConn, want sockwire.Reason) sockwire.Tuple {
	p.t.Helper()
	tu := tupleOfConn(conn)
	fd := fdOf(p.t, conn)
	p.sendFDs(message{rec: sockwire.Register{Epoch: 3, Tuple: tu, FD: fd}}, int(fd))
	p.wantResult(tu, sockwire.TypeRegister, 3, want)
	return tu
}

func (p *proc) wantResult(tu sockwire.Tuple, req sockwire.Type, epoch uint32, reason sockwire.Reason) {
	p.t.Helper()
	m := p.recv()
	want := sockwire.Result{Epoch: epoch, Tuple: tu, Request: req, Reason: reason}
	if m.route != nil || m.rec != want {
		p.t.Fatalf("got %+v %+v, want %+v", m.route, m.rec, want)
	}
}

// wantRouted checks the next message is ROUTE{tu} then rec.
func (p *proc) wantRouted(tu sockwire.Tuple, rec sockwire.Record) {
	p.t.Helper()
	m := p.recv()
	if m.route == nil || m.route.Tuple != tu || m.route.Epoch != rec.RecordEpoch() || m.rec != rec {
		p.t.Fatalf("got %+v %+v, want ROUTE %+v and %+v", m.route, m.rec, tu, rec)
	}
}

func endpoint(qpn uint32) sockwire.Endpoint {
	return sockwire.Endpoint{QPN: qpn, PSN: 7, RingLog2: 16, MTU: 3, RingAddr: 0x1000, CtrlAddr: 0x2000}
}

func attachReq(epoch uint32, tu sockwire.Tuple) sockwire.Attach {
	return sockwire.Attach{Epoch: epoch, Tuple: tu, Incarnation: 1, Endpoint: endpoint(0x11)}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func attachTotal(b *Broker, result string) float64 {
	return b.m.get(func(m *metrics) map[string]float64 { return m.attach }, result)
}

func demoteTotal(b *Broker, reason string) float64 {
	return b.m.get(func(m *metrics) map[string]float64 { return m.demote }, reason)
}

func pairingErrors(b *Broker, reason string) float64 {
	return b.m.get(func(m *metrics) map[string]float64 { return m.pairing }, reason)
}

// Two hosts: the client side attaches, the server side accepts, both
// demote; every record reaches the owner on the other host in order.
func TestRelay(t *testing.T) {
	a, b := newHost(t, 100), newHost(t, 100)
	pairHosts(a, b)
	cc, sc := tcpPair(t, "127.0.0.1")
	pa, pb := dialProc(t, a), dialProc(t, b)
	ta := pa.register(cc, 0)
	tb := pb.register(sc, 0)

	req := attachReq(1, ta)
	pa.send(routedMsg(ta, req))
	pb.wantRouted(tb, req) // the record as its sender wrote it, behind the receiver's view
	rep := sockwire.Attach{Reply: true, Epoch: 1, Tuple: tb, Incarnation: 2, Endpoint: endpoint(0x22)}
	pb.send(routedMsg(tb, rep))
	pa.wantRouted(ta, rep)
	if attachTotal(a.b, resultAttached) != 1 || attachTotal(b.b, resultAttached) != 1 {
		t.Errorf("attach_total{attached}: %v, %v", attachTotal(a.b, resultAttached), attachTotal(b.b, resultAttached))
	}

	// A burst in one direction keeps its order: demote, attach again,
	// demote again.
	seq := []sockwire.Record{
		sockwire.Demote{Epoch: 1, Consumed: 10, Reason: sockwire.ReasonQPError},
		attachReq(2, ta),
		sockwire.Demote{Epoch: 2, Consumed: 20, Reason: sockwire.ReasonQPError},
		attachReq(3, ta),
		sockwire.Nack{Epoch: 3, Reason: sockwire.ReasonProtocol},
	}
	for _, r := range seq {
		pa.send(routedMsg(ta, r))
	}
	for _, r := range seq {
		pb.wantRouted(tb, r)
	}
	pb.send(routedMsg(tb, sockwire.Demote{Epoch: 2, Consumed: 5, Reason: sockwire.ReasonPeer}))
	pa.wantRouted(ta, sockwire.Demote{Epoch: 2, Consumed: 5, Reason: sockwire.ReasonPeer})
	if demoteTotal(a.b, "qp_error") != 2 || demoteTotal(b.b, "peer") != 1 || demoteTotal(a.b, "peer") != 0 {
		t.Errorf("demote_total: a qp_error %v, b peer %v", demoteTotal(a.b, "qp_error"), demoteTotal(b.b, "peer"))
	}

	// Unregistered, the server side gets nothing more; the client's next
	// attachment is refused by the peer: no owner.
	pb.send(message{rec: sockwire.Unregister{Epoch: 9, Tuple: tb}})
	pb.wantResult(tb, sockwire.TypeUnregister, 9, 0)
	pa.send(routedMsg(ta, attachReq(4, ta)))
	pa.wantRouted(ta, sockwire.Nack{Epoch: 4, Reason: sockwire.ReasonNoOwner})
	if attachTotal(a.b, "no_owner") != 1 || attachTotal(b.b, "no_owner") != 1 {
		t.Errorf("attach_total{no_owner}: %v, %v", attachTotal(a.b, "no_owner"), attachTotal(b.b, "no_owner"))
	}
	// A DEMOTE that no process owns on the peer is answered, so that its
	// sender resets at once instead of waiting for the peer's DEMOTE.
	pa.send(routedMsg(ta, sockwire.Demote{Epoch: 4, Consumed: 1, Reason: sockwire.ReasonQPError}))
	pa.wantRouted(ta, sockwire.Result{Epoch: 4, Tuple: ta, Request: sockwire.TypeDemote, Reason: sockwire.ReasonNoOwner})
	if c, r := a.b.counts(); c != 1 || r != 1 {
		t.Errorf("host a: %d clients, %d registrations", c, r)
	}
	// Only a broker's RESULT travels behind a ROUTE: a process that
	// sends one is disconnected.
	pa.send(routedMsg(ta, sockwire.Result{Epoch: 5, Tuple: ta, Request: sockwire.TypeDemote, Reason: sockwire.ReasonNoOwner}))
	if !pa.closed() {
		t.Error("a routed RESULT from a process did not disconnect it")
	}
}

// An ATTACH_REQ that comes before the acceptor registered waits for it
// (sshd's session child registers seconds after the client asks), and
// one nobody registers is refused after parkFor.
func TestParked(t *testing.T) {
	a, b := newHost(t, 100), newHost(t, 100)
	pairHosts(a, b)
	cc, sc := tcpPair(t, "127.0.0.1")
	pa, pb := dialProc(t, a), dialProc(t, b)
	ta := pa.register(cc, 0)

	pa.send(routedMsg(ta, attachReq(1, ta)))
	if m, err := pa.tryRecv(300 * time.Millisecond); err == nil {
		t.Fatalf("answered at once: %+v", m)
	}
	tb := pb.register(sc, 0) // the RESULT first, then the request that waited
	pb.wantRouted(tb, attachReq(1, ta))
	rep := sockwire.Attach{Reply: true, Epoch: 1, Tuple: tb, Incarnation: 2, Endpoint: endpoint(0x22)}
	pb.send(routedMsg(tb, rep))
	pa.wantRouted(ta, rep)

	pb.send(message{rec: sockwire.Unregister{Epoch: 9, Tuple: tb}})
	pb.wantResult(tb, sockwire.TypeUnregister, 9, 0)
	t0 := time.Now()
	pa.send(routedMsg(ta, attachReq(2, ta)))
	pa.wantRouted(ta, sockwire.Nack{Epoch: 2, Reason: sockwire.ReasonNoOwner})
	if d := time.Since(t0); d < parkFor-100*time.Millisecond {
		t.Errorf("refused after %v, before parkFor", d)
	}
	b.b.mu.Lock()
	n := len(b.b.parked)
	b.b.mu.Unlock()
	if n != 0 {
		t.Errorf("%d requests still parked", n)
	}
}

// A connection whose both ends live on one host goes through its own
// pairing port (loopback connections, or two processes of one host).
func TestRelaySameHost(t *testing.T) {
	for _, ip := range []string{"127.0.0.1", "::1"} {
		t.Run(ip, func(t *testing.T) {
			cc, sc := tcpPair(t, ip)
			a := newHostOn(t, 100, ip)
			a.setPeer(a.addr)
			p1, p2 := dialProc(t, a), dialProc(t, a)
			t1, t2 := p1.register(cc, 0), p2.register(sc, 0)
			p1.send(routedMsg(t1, attachReq(1, t1)))
			p2.wantRouted(t2, attachReq(1, t1))
			p2.send(routedMsg(t2, sockwire.Nack{Epoch: 1, Reason: sockwire.ReasonDenied}))
			p1.wantRouted(t1, sockwire.Nack{Epoch: 1, Reason: sockwire.ReasonDenied})
			// Counted once by each side's passage: one host, twice.
			if n := attachTotal(a.b, "denied"); n != 2 {
				t.Errorf("attach_total{denied} %v", n)
			}
		})
	}
}

func TestNoDaemon(t *testing.T) {
	a := newHost(t, 100)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.setPeer(ln.Addr().String())
	ln.Close() // nobody listens there
	cc, _ := tcpPair(t, "127.0.0.1")
	p := dialProc(t, a)
	ta := p.register(cc, 0)
	p.send(routedMsg(ta, attachReq(1, ta)))
	p.wantRouted(ta, sockwire.Nack{Epoch: 1, Reason: sockwire.ReasonNoDaemon})
	p.send(routedMsg(ta, sockwire.Demote{Epoch: 1, Reason: sockwire.ReasonApp}))
	p.wantResult(ta, sockwire.TypeDemote, 1, sockwire.ReasonNoDaemon)
	if pairingErrors(a.b, pairDial) != 2 || attachTotal(a.b, "no_daemon") != 1 {
		t.Errorf("pairing_errors{dial} %v, attach_total{no_daemon} %v", pairingErrors(a.b, pairDial), attachTotal(a.b, "no_daemon"))
	}
}

// The server side's process goes away with an ATTACH_REQ in hand: its
// broker refuses it for it. The client side's goes away before the
// answer: its broker demotes the server side, which never waits.
func TestDisconnectMidAttach(t *testing.T) {
	a, b := newHost(t, 100), newHost(t, 100)
	pairHosts(a, b)
	cc, sc := tcpPair(t, "127.0.0.1")
	pa, pb := dialProc(t, a), dialProc(t, b)
	ta, tb := pa.register(cc, 0), pb.register(sc, 0)

	pa.send(routedMsg(ta, attachReq(1, ta)))
	pb.wantRouted(tb, attachReq(1, ta))
	pb.conn.Close()
	pa.wantRouted(ta, sockwire.Nack{Epoch: 1, Reason: sockwire.ReasonNoOwner})
	waitFor(t, "host b to forget its client", func() bool { c, r := b.b.counts(); return c == 0 && r == 0 })

	pb = dialProc(t, b)
	pb.register(sc, 0)
	pa.send(routedMsg(ta, attachReq(2, ta)))
	pb.wantRouted(tb, attachReq(2, ta))
	pa.conn.Close()
	waitFor(t, "host a to forget its client", func() bool { c, r := a.b.counts(); return c == 0 && r == 0 })
	pb.send(routedMsg(tb, sockwire.Attach{Reply: true, Epoch: 2, Tuple: tb, Endpoint: endpoint(0x33)}))
	pb.wantRouted(tb, sockwire.Demote{Epoch: 2, Reason: sockwire.ReasonNoOwner})
}

// openFDs counts this process's open descriptors, the broker's included.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

func TestNotYours(t *testing.T) {
	a, b := newHost(t, 100), newHost(t, 100)
	pairHosts(a, b)
	cc, sc := tcpPair(t, "127.0.0.1")
	p := dialProc(t, a)
	tc := tupleOfConn(cc)
	cfd, sfd := int(fdOf(t, cc)), int(fdOf(t, sc))
	file, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	gone := tc
	gone.RemotePort++
	many := make([]int, 2*maxPassed+1)
	for i := range many {
		many[i] = cfd
	}

	// No socket, another file, another socket, two sockets (even twice
	// the right one), more than the broker takes in, a tuple that does
	// not exist: one answer, and every descriptor the broker received
	// closed before it. (A first answer: the broker has accepted p.)
	p.send(message{rec: sockwire.Unregister{Epoch: 1, Tuple: tc}})
	p.wantResult(tc, sockwire.TypeUnregister, 1, sockwire.ReasonDenied)
	before := openFDs(t)
	for _, c := range []struct {
		name string
		tu   sockwire.Tuple
		fds  []int
	}{
		{"no descriptor", tc, nil},
		{"not a socket", tc, []int{int(file.Fd())}},
		{"another socket", tc, []int{sfd}},
		{"two descriptors", tc, []int{cfd, sfd}},
		{"the socket twice", tc, []int{cfd, cfd}},
		{"too many", tc, many},
		{"no such connection", gone, []int{cfd}},
	} {
		p.sendFDs(message{rec: sockwire.Register{Epoch: 1, Tuple: c.tu, FD: int32(cfd)}}, c.fds...)
		m := p.recv()
		want := sockwire.Result{Epoch: 1, Tuple: c.tu, Request: sockwire.TypeRegister, Reason: sockwire.ReasonDenied}
		if m.route != nil || m.rec != want {
			t.Errorf("%s: got %+v %+v, want %+v", c.name, m.route, m.rec, want)
		}
		if n := openFDs(t); n != before {
			t.Errorf("%s: %d descriptors open, %d before", c.name, n, before)
		}
	}
	if _, r := a.b.counts(); r != 0 {
		t.Errorf("%d registrations", r)
	}

	// Records about a connection the process did not register.
	p.send(routedMsg(tc, attachReq(1, tc)))
	p.wantRouted(tc, sockwire.Nack{Epoch: 1, Reason: sockwire.ReasonDenied})
	p.send(routedMsg(tc, sockwire.Demote{Epoch: 1, Reason: sockwire.ReasonApp}))
	p.wantResult(tc, sockwire.TypeDemote, 1, sockwire.ReasonDenied)
	p.send(message{rec: sockwire.Unregister{Epoch: 1, Tuple: tc}})
	p.wantResult(tc, sockwire.TypeUnregister, 1, sockwire.ReasonDenied)

	// Registered by another process: not this one's either.
	q := dialProc(t, a)
	q.register(cc, 0)
	p.send(routedMsg(tc, sockwire.Demote{Epoch: 1, Reason: sockwire.ReasonApp}))
	p.wantResult(tc, sockwire.TypeDemote, 1, sockwire.ReasonDenied)
	if demoteTotal(a.b, "app") != 0 || attachTotal(a.b, "denied") != 1 {
		t.Errorf("demote_total{app} %v, attach_total{denied} %v", demoteTotal(a.b, "app"), attachTotal(a.b, "denied"))
	}
}

func TestCap(t *testing.T) {
	a := newHost(t, 2)
	p, q := dialProc(t, a), dialProc(t, a)
	c1, s1 := tcpPair(t, "127.0.0.1")
	c2, _ := tcpPair(t, "127.0.0.1")
	p.register(c1, 0)
	q.register(s1, 0) // the cap is the user's, over all of its processes
	p.register(c2, sockwire.ReasonLimit)
	p.register(c1, 0) // registering again what it has is no new one
	p.send(message{rec: sockwire.Unregister{Epoch: 4, Tuple: tupleOfConn(c1)}})
	p.wantResult(tupleOfConn(c1), sockwire.TypeUnregister, 4, 0)
	p.register(c2, 0)

	q.conn.Close() // a disconnect frees its registrations
	waitFor(t, "q's registration to go", func() bool { _, r := a.b.counts(); return r == 1 })
	p.register(c1, 0)
	a.b.SetMaxPerUID(1)
	p.register(s1, sockwire.ReasonLimit)
}

// A process that sends what it must not is disconnected, and its
// registrations go with it.
func TestMalformedClient(t *testing.T) {
	a := newHost(t, 100)
	cc, _ := tcpPair(t, "127.0.0.1")
	tc := tupleOfConn(cc)
	route, _ := sockwire.Append(nil, sockwire.Route{Epoch: 1, Tuple: tc})
	sw, _ := sockwire.Append(nil, sockwire.Demote{Epoch: 1, Reason: sockwire.ReasonApp})
	demote2, _ := sockwire.Append(nil, sockwire.Demote{Epoch: 2, Reason: sockwire.ReasonApp})
	swRec, _ := sockwire.Append(nil, sockwire.Result{Epoch: 1, Tuple: tc, Request: sockwire.TypeRegister})
	other := tc
	other.LocalPort++
	req, _ := sockwire.Append(nil, attachReq(1, other))
	two := append(append([]byte(nil), sw...), sw...)
	for name, msg := range map[string][]byte{
		"garbage":                 []byte("GET / HTTP/1.0\r\n\r\n"),
		"empty":                   {},
		"a ROUTE alone":           route,
		"a DEMOTE without ROUTE":  sw,
		"epochs differ":           append(append([]byte(nil), route...), demote2...),
		"a RESULT from a process": swRec,
		"a RESULT behind a ROUTE": append(append([]byte(nil), route...), swRec...),
		"tuples differ":           append(append([]byte(nil), route...), req...),
		"two records":             two,
		"a record cut":            append(append([]byte(nil), route...), sw[:20]...),
		"too long":                make([]byte, 3*messageMax),
	} {
		t.Run(name, func(t *testing.T) {
			p := dialProc(t, a)
			p.register(cc, 0)
			p.sendRaw(msg)
			if !p.closed() {
				t.Fatal("not disconnected")
			}
			waitFor(t, "the client's state to go", func() bool { c, r := a.b.counts(); return c == 0 && r == 0 })
		})
	}
}

// Descriptors passed with anything but a REGISTER, or with a message
// the broker refuses, disconnect the process; the broker keeps none.
func TestPassedWithOthers(t *testing.T) {
	a := newHost(t, 100)
	cc, _ := tcpPair(t, "127.0.0.1")
	tc := tupleOfConn(cc)
	cfd := int(fdOf(t, cc))
	unreg, _ := sockwire.Append(nil, sockwire.Unregister{Epoch: 1, Tuple: tc})
	route, _ := sockwire.Append(nil, sockwire.Route{Epoch: 1, Tuple: tc})
	demote, _ := sockwire.Append(nil, sockwire.Demote{Epoch: 1, Reason: sockwire.ReasonApp})
	reg, _ := sockwire.Append(nil, sockwire.Register{Epoch: 1, Tuple: tc, FD: int32(cfd)})
	for name, msg := range map[string][]byte{
		"an UNREGISTER":           unreg,
		"a routed DEMOTE":         append(append([]byte(nil), route...), demote...),
		"garbage":                 []byte("GET / HTTP/1.0\r\n\r\n"),
		"a REGISTER cut":          reg[:40],
		"a REGISTER behind ROUTE": append(append([]byte(nil), route...), reg...),
	} {
		t.Run(name, func(t *testing.T) {
			before := openFDs(t)
			p := dialProc(t, a)
			p.register(cc, 0)
			p.sendRawFDs(msg, cfd, cfd)
			if !p.closed() {
				t.Fatal("not disconnected")
			}
			waitFor(t, "the client's state to go", func() bool { c, r := a.b.counts(); return c == 0 && r == 0 })
			p.conn.Close()
			if n := openFDs(t); n != before {
				t.Errorf("%d descriptors open, %d before", n, before)
			}
		})
	}
}

// A peer that sends garbage is cut off; one that speaks of connections
// that are not with it is ignored.
func TestMalformedPeer(t *testing.T) {
	b := newHost(t, 100)
	cc, sc := tcpPair(t, "127.0.0.1")
	pb := dialProc(t, b)
	tb := pb.register(sc, 0)
	ta := tupleOfConn(cc)

	conn, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Claiming to be 10.0.0.1: the pairing connection comes from 127.0.0.1.
	spoof := ta
	spoof.Local = netip.MustParseAddr("::ffff:10.0.0.1").As16()
	m := routedMsg(spoof, sockwire.Demote{Epoch: 1, Reason: sockwire.ReasonApp})
	raw, _ := m.encode(nil)
	good, _ := routedMsg(ta, sockwire.Demote{Epoch: 1, Reason: sockwire.ReasonApp}).encode(nil)
	if _, err := conn.Write(append(raw, good...)); err != nil {
		t.Fatal(err)
	}
	pb.wantRouted(tb, sockwire.Demote{Epoch: 1, Reason: sockwire.ReasonApp}) // only the true one
	if pairingErrors(b.b, pairAddress) != 1 {
		t.Errorf("pairing_errors{address} %v", pairingErrors(b.b, pairAddress))
	}
	if _, err := conn.Write([]byte("\x52\x53\x01\x63 garbage, not a record")); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("pairing connection not closed: %v", err)
	}
	if pairingErrors(b.b, pairMalformed) != 1 {
		t.Errorf("pairing_errors{malformed} %v", pairingErrors(b.b, pairMalformed))
	}
	// A record about a connection nobody here registered.
	conn2, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	unknown := ta
	unknown.LocalPort++
	raw, _ = routedMsg(unknown, sockwire.Demote{Epoch: 1, Reason: sockwire.ReasonApp}).encode(nil)
	conn2.Write(raw)
	waitFor(t, "pairing_errors{no_owner}", func() bool { return pairingErrors(b.b, pairNoOwner) == 1 })
}

// A stale socket file is replaced; a file that is not a socket, or a
// socket a live broker serves, is not.
func TestListenPath(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "sockets.sock")
	stale := NewBroker(Options{MaxPerUID: 1}, nil)
	if err := stale.Listen(path); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o666 {
		t.Fatalf("mode %v, %v", fi.Mode(), err)
	}
	second := NewBroker(Options{MaxPerUID: 1}, nil)
	if err := second.Listen(path); err == nil {
		t.Fatal("a second broker took a live socket")
	}
	// A crashed broker leaves its file: simulate by not unlinking.
	stale.mu.Lock()
	stale.listeners[0].(*net.UnixListener).SetUnlinkOnClose(false)
	stale.mu.Unlock()
	stale.Close(context.Background())
	if err := second.Listen(path); err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	second.Close(context.Background())
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := NewBroker(Options{MaxPerUID: 1}, nil).Listen(path); err == nil {
		t.Fatal("a regular file replaced")
	}
}
