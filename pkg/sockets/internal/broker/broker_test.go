package broker_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
	"github.com/rdmaplus/rdmaplus/pkg/sockets/internal/broker"
	"github.com/rdmaplus/rdmaplus/pkg/sockets/internal/broker/brokertest"
)

type handler struct {
	recs chan sockwire.Record
	gone chan struct{}
}

func (h *handler) FromBroker(r sockwire.Record) { h.recs <- r }
func (h *handler) BrokerGone()                  { close(h.gone) }

func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
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
	a := <-acc
	t.Cleanup(func() { d.Close(); a.Close() })
	return d.(*net.TCPConn), a.(*net.TCPConn)
}

func next(t *testing.T, f *brokertest.Fake) brokertest.Msg {
	t.Helper()
	select {
	case m := <-f.Msgs:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("the broker got nothing")
	}
	return brokertest.Msg{}
}

func TestClient(t *testing.T) {
	f := brokertest.New(t)
	c, err := broker.Dial(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d, _ := tcpPair(t)
	rc, _ := d.SyscallConn()
	h := &handler{recs: make(chan sockwire.Record, 4), gone: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tu, err := c.Register(ctx, rc, h)
	if err != nil {
		t.Fatal(err)
	}
	m := next(t, f)
	reg, ok := m.Rec.(sockwire.Register)
	if !ok || !m.FDOK || reg.Tuple != tu || tu.Family != sockwire.AFInet || tu.LocalPort != uint16(d.LocalAddr().(*net.TCPAddr).Port) {
		t.Fatalf("REGISTER %+v (socket passed: %v), tuple %+v", m.Rec, m.FDOK, tu)
	}
	if err := c.Send(tu, sockwire.Demote{Epoch: 2, Consumed: 7, Reason: sockwire.ReasonApp}); err != nil {
		t.Fatal(err)
	}
	m = next(t, f)
	if m.Route == nil || m.Route.Tuple != tu || m.Rec != (sockwire.Demote{Epoch: 2, Consumed: 7, Reason: sockwire.ReasonApp}) {
		t.Fatalf("routed %+v %+v", m.Route, m.Rec)
	}
	if err := f.Send(tu, sockwire.Nack{Epoch: 3, Reason: sockwire.ReasonNoOwner}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-h.recs:
		if r != (sockwire.Nack{Epoch: 3, Reason: sockwire.ReasonNoOwner}) {
			t.Fatalf("handler got %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler got nothing")
	}
	// A record about another connection reaches no one.
	other := tu
	other.LocalPort++
	f.Send(other, sockwire.Nack{Epoch: 3, Reason: sockwire.ReasonNoOwner})
	f.Close()
	select {
	case <-h.gone:
	case <-time.After(5 * time.Second):
		t.Fatal("BrokerGone not called")
	}
	if len(h.recs) != 0 {
		t.Errorf("a record for another connection was handed over")
	}
	if !c.Gone() || c.Send(tu, sockwire.Demote{Epoch: 2, Reason: sockwire.ReasonApp}) != broker.ErrGone {
		t.Error("Send after the broker left")
	}
}

func TestDialNothing(t *testing.T) {
	if _, err := broker.Dial(t.TempDir() + "/none.sock"); err == nil {
		t.Fatal("Dial of a missing socket succeeded")
	}
}
