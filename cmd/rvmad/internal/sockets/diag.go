package sockets

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// errNoSocket is a tuple the kernel has no TCP socket for.
var errNoSocket = errors.New("no such TCP socket")

// Sizes of linux/inet_diag.h's structures.
const (
	sizeofSockID  = 48 // struct inet_diag_sockid
	sizeofReqV2   = 8 + sizeofSockID
	sizeofDiagMsg = 4 + sizeofSockID + 20 // struct inet_diag_msg
	diagNoCookie  = 0xffffffff            // INET_DIAG_NOCOOKIE
)

// diagInode asks the kernel's socket diagnostics (NETLINK_SOCK_DIAG,
// SOCK_DIAG_BY_FAMILY, one exact lookup, not a dump) for the TCP socket
// of t, as its owner sees it, and returns its inode. A socket that does
// not exist is errNoSocket.
func diagInode(t sockwire.Tuple) (uint64, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	// Answers come within the call; a stuck kernel must not hang a client.
	tv := unix.Timeval{Sec: 2}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}

	const seq = 1
	req := make([]byte, unix.NLMSG_HDRLEN+sizeofReqV2)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(req[8:], seq)
	r := req[unix.NLMSG_HDRLEN:]
	r[0] = byte(t.Family) // sdiag_family
	r[1] = unix.IPPROTO_TCP
	ne.PutUint32(r[4:], 0xffffffff) // idiag_states: any
	id := r[8:]
	binary.BigEndian.PutUint16(id[0:], t.LocalPort)
	binary.BigEndian.PutUint16(id[2:], t.RemotePort)
	local, remote := addrs(t)
	if t.Family == sockwire.AFInet {
		l4, r4 := local.As4(), remote.As4()
		copy(id[4:], l4[:])
		copy(id[20:], r4[:])
	} else {
		copy(id[4:20], t.Local[:])
		copy(id[20:36], t.Remote[:])
	}
	ne.PutUint32(id[40:], diagNoCookie)
	ne.PutUint32(id[44:], diagNoCookie)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}

	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("sock_diag: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return 0, fmt.Errorf("sock_diag: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return 0, errors.New("sock_diag: short error")
				}
				errno := -int32(ne.Uint32(m.Data))
				if errno == 0 {
					continue // an acknowledgement
				}
				if e := unix.Errno(errno); e == unix.ENOENT {
					return 0, errNoSocket
				} else {
					return 0, fmt.Errorf("sock_diag: %w", e)
				}
			case unix.SOCK_DIAG_BY_FAMILY:
				if len(m.Data) < sizeofDiagMsg {
					return 0, errors.New("sock_diag: short answer")
				}
				return uint64(ne.Uint32(m.Data[sizeofDiagMsg-4:])), nil // idiag_inode
			case unix.NLMSG_DONE:
				return 0, errNoSocket
			}
		}
	}
}
