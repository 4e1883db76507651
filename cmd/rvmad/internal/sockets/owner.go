package sockets

import (
	"errors"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// errNotOwner is the one answer to "not yours" and "does not exist".
var errNotOwner = errors.New("the process does not own that connection")

// Verifier proves ownership of connections with the kernel.
type Verifier interface {
	// Owner returns the inode of the socket of t when sock, the broker's
	// descriptor of the socket a process passed with its REGISTER
	// (SCM_RIGHTS; -1: none, or not exactly one), is that socket:
	// possessing it proves ownership. errNotOwner when it is not (no
	// descriptor, not a socket, another connection, no such connection),
	// another error when the kernel could not be asked. Owner does not
	// close sock.
	Owner(sock int, t sockwire.Tuple) (uint64, error)
	// Inode returns the inode of the socket of t now; errNoSocket when
	// there is none.
	Inode(t sockwire.Tuple) (uint64, error)
}

// kernel is the Verifier of this host: the passed socket's own inode and
// addresses, and sock_diag for the tuple's socket. It needs no
// capability: the process hands over the socket it claims, and
// sock_diag's exact lookup is open to all.
type kernel struct{}

// Owner implements Verifier. The passed descriptor must be a socket
// (fstat: S_ISSOCK) whose addresses (getsockname, getpeername) are t as
// the process sees it, and sock_diag must find t's TCP socket with the
// same inode: the addresses alone could be those of a socket of another
// protocol, and only a real socket answers getsockname (an O_PATH
// descriptor of a socket file is S_ISSOCK too, with a file system's
// inode number).
func (kernel) Owner(sock int, t sockwire.Tuple) (uint64, error) {
	if sock < 0 || checkTuple(t) != nil {
		return 0, errNotOwner
	}
	var st unix.Stat_t
	if err := unix.Fstat(sock, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return 0, errNotOwner
	}
	if held, err := sockTuple(sock); err != nil || held != t {
		return 0, errNotOwner
	}
	ino, err := diagInode(t)
	switch {
	case errors.Is(err, errNoSocket):
		return 0, errNotOwner
	case err != nil:
		return 0, err
	case ino != st.Ino:
		return 0, errNotOwner
	}
	return ino, nil
}

// Inode implements Verifier.
func (kernel) Inode(t sockwire.Tuple) (uint64, error) {
	if err := checkTuple(t); err != nil {
		return 0, errNoSocket
	}
	return diagInode(t)
}

// sockTuple is the tuple of a connected IPv4 or IPv6 socket as its holder
// sees it: the socket's family, IPv4 addresses as ::ffff:a.b.c.d.
func sockTuple(sock int) (sockwire.Tuple, error) {
	local, err := unix.Getsockname(sock)
	if err != nil {
		return sockwire.Tuple{}, err
	}
	remote, err := unix.Getpeername(sock)
	if err != nil {
		return sockwire.Tuple{}, err
	}
	switch l := local.(type) {
	case *unix.SockaddrInet4:
		if r, ok := remote.(*unix.SockaddrInet4); ok {
			return sockwire.Tuple{Family: sockwire.AFInet,
				LocalPort: uint16(l.Port), RemotePort: uint16(r.Port),
				Local:  netip.AddrFrom4(l.Addr).As16(),
				Remote: netip.AddrFrom4(r.Addr).As16()}, nil
		}
	case *unix.SockaddrInet6:
		if r, ok := remote.(*unix.SockaddrInet6); ok {
			return sockwire.Tuple{Family: sockwire.AFInet6,
				LocalPort: uint16(l.Port), RemotePort: uint16(r.Port),
				Local: l.Addr, Remote: r.Addr}, nil
		}
	}
	return sockwire.Tuple{}, errTuple
}
