package sockets

import (
	"errors"
	"net/netip"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// errTuple is a tuple no TCP connection can have: an AF_INET family with
// addresses that are not ::ffff:a.b.c.d, an unspecified address or port 0.
var errTuple = errors.New("not the tuple of a TCP connection")

// addrs returns the tuple's local and remote addresses, IPv4 ones
// unmapped (as the kernel's AF_INET sockets have them; an AF_INET6
// socket talking IPv4 has them as ::ffff:a.b.c.d).
func addrs(t sockwire.Tuple) (local, remote netip.Addr) {
	return netip.AddrFrom16(t.Local).Unmap(), netip.AddrFrom16(t.Remote).Unmap()
}

// key is the connection t names, whichever end's socket family: an
// AF_INET6 socket (a dual-stack listener's) talking IPv4 and the AF_INET
// socket at the other end name the same connection.
func key(t sockwire.Tuple) sockwire.Tuple {
	if t.Family == sockwire.AFInet6 && netip.AddrFrom16(t.Local).Is4In6() &&
		netip.AddrFrom16(t.Remote).Is4In6() {
		t.Family = sockwire.AFInet
	}
	return t
}

// checkTuple reports whether t can name a TCP connection.
func checkTuple(t sockwire.Tuple) error {
	l, r := netip.AddrFrom16(t.Local), netip.AddrFrom16(t.Remote)
	if t.Family == sockwire.AFInet && (!l.Is4In6() || !r.Is4In6()) {
		return errTuple
	}
	l, r = addrs(t)
	if l.IsUnspecified() || r.IsUnspecified() || t.LocalPort == 0 || t.RemotePort == 0 {
		return errTuple
	}
	return nil
}

// swap returns the connection as its other end sees it.
func swap(t sockwire.Tuple) sockwire.Tuple {
	t.Local, t.Remote = t.Remote, t.Local
	t.LocalPort, t.RemotePort = t.RemotePort, t.LocalPort
	return t
}

// tupleOf builds the tuple of a connection from its two ends; IPv4
// addresses give an AF_INET tuple.
func tupleOf(local, remote netip.AddrPort) sockwire.Tuple {
	t := sockwire.Tuple{Family: sockwire.AFInet6, LocalPort: local.Port(), RemotePort: remote.Port(),
		Local: local.Addr().As16(), Remote: remote.Addr().As16()}
	if local.Addr().Unmap().Is4() && remote.Addr().Unmap().Is4() && !local.Addr().Is6() {
		t.Family = sockwire.AFInet
	}
	return t
}
