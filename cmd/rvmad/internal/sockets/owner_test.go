package sockets

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

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

// dupFD is a new descriptor of the same file as fd, closed at the end of
// the test.
func dupFD(t *testing.T, fd int) int {
	t.Helper()
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(d) })
	return d
}

// fakeOf returns a UDP socket with the same addresses as the TCP
// connection conn (another protocol may use the same ports), closed at
// the end of the test.
func fakeOf(t *testing.T, conn *net.TCPConn) int {
	t.Helper()
	l, r := conn.LocalAddr().(*net.TCPAddr), conn.RemoteAddr().(*net.TCPAddr)
	u, err := net.DialUDP("udp", &net.UDPAddr{IP: l.IP, Port: l.Port}, &net.UDPAddr{IP: r.IP, Port: r.Port})
	if err != nil {
		t.Skipf("no UDP socket on the connection's ports: %v", err)
	}
	t.Cleanup(func() { u.Close() })
	return int(fdOf(t, u))
}

// pathFD returns an O_PATH descriptor of a Unix socket's file (S_ISSOCK,
// yet no socket), closed at the end of the test.
func pathFD(t *testing.T) int {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func TestOwnership(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		t.Run(addr, func(t *testing.T) {
			k := kernel{}
			c, s := tcpPair(t, addr)
			tc, ts := tupleOfConn(c), tupleOfConn(s)
			if addr == "127.0.0.1" && tc.Family != sockwire.AFInet {
				t.Fatalf("family %d", tc.Family)
			}
			if tc != swap(ts) {
				t.Fatalf("the two views do not mirror: %+v %+v", tc, ts)
			}
			cfd, sfd := int(fdOf(t, c)), int(fdOf(t, s))
			if held, err := sockTuple(cfd); err != nil || held != tc {
				t.Fatalf("sockTuple: %+v, %v, want %+v", held, err, tc)
			}
			ic, err := k.Owner(cfd, tc)
			if err != nil {
				t.Fatal(err)
			}
			is, err := k.Owner(sfd, ts)
			if err != nil || is == ic {
				t.Fatalf("server end: %d, %v (client end %d)", is, err, ic)
			}
			if ino, err := k.Inode(tc); err != nil || ino != ic {
				t.Fatalf("Inode: %d, %v, want %d", ino, err, ic)
			}
			// Another descriptor of the same socket (a dup, or one
			// passed by SCM_RIGHTS) is as good.
			if ino, err := k.Owner(dupFD(t, cfd), tc); err != nil || ino != ic {
				t.Fatalf("dup: %d, %v, want %d", ino, err, ic)
			}

			// Not yours and does not exist: the same answer.
			f, err := os.Open(os.DevNull)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(pair[0])
			defer unix.Close(pair[1])
			ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			other := func(f func(*sockwire.Tuple)) sockwire.Tuple { x := tc; f(&x); return x }
			bad := map[string]struct {
				fd int
				tu sockwire.Tuple
			}{
				"no descriptor":     {-1, tc},
				"a file":            {int(f.Fd()), tc},
				"closed":            {1 << 20, tc},
				"a Unix socket":     {pair[0], tc},
				"an O_PATH socket":  {pathFD(t), tc},
				"a listener":        {int(fdOf(t, ln.(*net.TCPListener))), tc},
				"another socket":    {sfd, tc},
				"the other view":    {cfd, ts},
				"UDP, same ports":   {fakeOf(t, c), tc},
				"no such tuple":     {cfd, other(func(x *sockwire.Tuple) { x.RemotePort = 1 })},
				"not a real tuple":  {cfd, sockwire.Tuple{Family: sockwire.AFInet}},
				"v4 family, v6 ips": {cfd, other(func(x *sockwire.Tuple) { x.Family = sockwire.AFInet; x.Local[10] = 0 })},
				"family swapped":    {cfd, other(func(x *sockwire.Tuple) { x.Family ^= sockwire.AFInet ^ sockwire.AFInet6 })},
			}
			for name, b := range bad {
				if _, err := k.Owner(b.fd, b.tu); !errors.Is(err, errNotOwner) {
					t.Errorf("%s: %v, want errNotOwner", name, err)
				}
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
