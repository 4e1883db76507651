package sockets

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// tcpPair returns both ends of a TCP connection on addr ("127.0.0.1" or
// "::1"), closed at the end of the test.
func tcpPair(t *testing.T, addr string) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Skipf("no %s: %v", addr, err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// fdOf is the file descriptor of conn in this process.
func fdOf(t *testing.T, conn syscall.Conn) int32 {
	t.Helper()
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int32
	if err := rc.Control(func(f uintptr) { fd = int32(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// tupleOfConn is conn's tuple as this process sees it.
func tupleOfConn(conn *net.TCPConn) sockwire.Tuple {
	return tupleOf(conn.LocalAddr().(*net.TCPAddr).AddrPort(), conn.RemoteAddr().(*net.TCPAddr).AddrPort())
}

func TestOwnership(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		t.Run(addr, func(t *testing.T) {
			k := kernel{proc: "/proc"}
			c, s := tcpPair(t, addr)
			tc, ts := tupleOfConn(c), tupleOfConn(s)
			if addr == "127.0.0.1" && tc.Family != sockwire.AFInet {
				t.Fatalf("family %d", tc.Family)
			}
			if tc != swap(ts) {
				t.Fatalf("the two views do not mirror: %+v %+v", tc, ts)
			}
			pid := int32(os.Getpid())
			ic, err := k.Owner(pid, fdOf(t, c), tc)
			if err != nil {
				t.Fatal(err)
			}
			is, err := k.Owner(pid, fdOf(t, s), ts)
			if err != nil || is == ic {
				t.Fatalf("server end: %d, %v (client end %d)", is, err, ic)
			}
			if ino, err := k.Inode(tc); err != nil || ino != ic {
				t.Fatalf("Inode: %d, %v, want %d", ino, err, ic)
			}

			// Not yours and does not exist: the same answer.
			child := exec.Command("sleep", "30")
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { child.Process.Kill(); child.Wait() }()
			bad := map[string]struct {
				pid, fd int32
				tu      sockwire.Tuple
			}{
				"another process":   {int32(child.Process.Pid), fdOf(t, c), tc},
				"another fd":        {pid, fdOf(t, s), tc},
				"a file":            {pid, 0, tc},
				"no such fd":        {pid, 1 << 20, tc},
				"no such process":   {1 << 30, fdOf(t, c), tc},
				"no such tuple":     {pid, fdOf(t, c), func() sockwire.Tuple { x := tc; x.RemotePort = 1; return x }()},
				"not a real tuple":  {pid, fdOf(t, c), sockwire.Tuple{Family: sockwire.AFInet}},
				"v4 family, v6 ips": {pid, fdOf(t, c), func() sockwire.Tuple { x := tc; x.Family = sockwire.AFInet; x.Local[10] = 0; return x }()},
			}
			for name, b := range bad {
				if _, err := k.Owner(b.pid, b.fd, b.tu); !errors.Is(err, errNotOwner) {
					t.Errorf("%s: %v, want errNotOwner", name, err)
				}
			}

			fd := fdOf(t, c)
			c.Close()
			s.Close()
			// The client end lingers in TIME_WAIT without an inode, the
			// server end is gone: neither is anyone's.
			if _, err := k.Owner(pid, fd, tc); !errors.Is(err, errNotOwner) {
				t.Errorf("closed: %v", err)
			}
		})
	}
}

func TestTupleHelpers(t *testing.T) {
	l, r := netip.MustParseAddrPort("10.0.0.1:5"), netip.MustParseAddrPort("10.0.0.2:6")
	tu := tupleOf(l, r)
	if tu.Family != sockwire.AFInet || checkTuple(tu) != nil {
		t.Fatalf("%+v", tu)
	}
	if a, b := addrs(tu); a != l.Addr() || b != r.Addr() {
		t.Fatalf("addrs %v %v", a, b)
	}
	if swap(swap(tu)) != tu || swap(tu).LocalPort != 6 {
		t.Fatal("swap")
	}
	tu.LocalPort = 0
	if checkTuple(tu) == nil {
		t.Fatal("port 0 accepted")
	}
}
