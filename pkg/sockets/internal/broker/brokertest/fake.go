// Package brokertest is a stand-in for rvmad's sockets broker in host
// tests: it answers REGISTER (checking that exactly one socket with the
// record's addresses came with it) and UNREGISTER, and hands every routed
// record to the test, which can send records to the process.
package brokertest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// Msg is a message a process sent: its ROUTE (nil for REGISTER and
// UNREGISTER) and record, and for a REGISTER whether the socket passed
// with it checked out.
type Msg struct {
	Route *sockwire.Route
	Rec   sockwire.Record
	FDOK  bool
}

// Fake is the stand-in broker.
type Fake struct {
	Path string
	Msgs chan Msg

	l     *net.UnixListener
	mu    sync.Mutex
	conns []*net.UnixConn
}

// New serves a fake broker in a temporary directory of t until the test
// ends.
func New(t testing.TB) *Fake {
	t.Helper()
	f := &Fake{Path: filepath.Join(t.TempDir(), "sockets.sock"), Msgs: make(chan Msg, 1024)}
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: f.Path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	f.l = l
	t.Cleanup(func() { f.Close() })
	go f.serve()
	return f
}

// Close disconnects every process and stops listening.
func (f *Fake) Close() {
	f.l.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
}

func (f *Fake) serve() {
	for {
		c, err := f.l.AcceptUnix()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		f.mu.Unlock()
		go f.read(c)
	}
}

// Send sends ROUTE{t} and rec to every connected process.
func (f *Fake) Send(t sockwire.Tuple, rec sockwire.Record) error {
	b, err := sockwire.Marshal(sockwire.Route{Epoch: rec.RecordEpoch(), Tuple: t})
	if err == nil {
		b, err = sockwire.Append(b, rec)
	}
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.conns) == 0 {
		return errors.New("brokertest: no process connected")
	}
	for _, c := range f.conns {
		if _, err := c.Write(b); err != nil {
			return err
		}
	}
	return nil
}

func (f *Fake) read(c *net.UnixConn) {
	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(16))
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			return
		}
		var fds []int
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if r, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		m, err := parse(buf[:n])
		if err != nil {
			continue
		}
		var reply sockwire.Record
		switch r := m.Rec.(type) {
		case sockwire.Register:
			m.FDOK = len(fds) == 1 && holds(fds[0], r.Tuple)
			reason := sockwire.Reason(0)
			if !m.FDOK {
				reason = sockwire.ReasonDenied
			}
			reply = sockwire.Result{Epoch: r.Epoch, Tuple: r.Tuple, Request: sockwire.TypeRegister, Reason: reason}
		case sockwire.Unregister:
			reply = sockwire.Result{Epoch: r.Epoch, Tuple: r.Tuple, Request: sockwire.TypeUnregister}
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
		f.Msgs <- m
		if reply != nil {
			if b, err := sockwire.Marshal(reply); err == nil {
				_, _ = c.Write(b)
			}
		}
	}
}

// holds reports whether fd is a socket connected with the tuple t.
func holds(fd int, t sockwire.Tuple) bool {
	local, err := unix.Getsockname(fd)
	if err != nil {
		return false
	}
	l4, ok := local.(*unix.SockaddrInet4)
	if !ok {
		l6, ok := local.(*unix.SockaddrInet6)
		return ok && t.Family == sockwire.AFInet6 && l6.Addr == t.Local && uint16(l6.Port) == t.LocalPort
	}
	return t.Family == sockwire.AFInet && netip.AddrFrom4(l4.Addr).As16() == t.Local && uint16(l4.Port) == t.LocalPort
}

func parse(b []byte) (Msg, error) {
	h, err := sockwire.PeekHeader(b)
	if err != nil {
		return Msg{}, err
	}
	if h.Type != sockwire.TypeRoute {
		rec, err := sockwire.Decode(b)
		return Msg{Rec: rec}, err
	}
	if len(b) <= h.Length {
		return Msg{}, fmt.Errorf("a ROUTE alone")
	}
	r, err := sockwire.Decode(b[:h.Length])
	if err != nil {
		return Msg{}, err
	}
	rec, err := sockwire.Decode(b[h.Length:])
	if err != nil {
		return Msg{}, err
	}
	route := r.(sockwire.Route)
	return Msg{Route: &route, Rec: rec}, nil
}
