package sockets

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// errNotOwner is the one answer to "not yours" and "does not exist".
var errNotOwner = errors.New("the process does not own that connection")

// Verifier proves ownership of connections with the kernel.
type Verifier interface {
	// Owner returns the inode of the socket of t when process pid holds
	// it as its file descriptor fd; errNotOwner when it does not (the
	// socket does not exist, the fd is another file, the process is
	// gone), another error when the kernel could not be asked.
	Owner(pid int32, fd int32, t sockwire.Tuple) (uint64, error)
	// Inode returns the inode of the socket of t now; errNoSocket when
	// there is none.
	Inode(t sockwire.Tuple) (uint64, error)
}

// kernel is the Verifier of this host: sock_diag for the tuple's socket,
// /proc/<pid>/fd/<fd> for the process's.
type kernel struct {
	proc string // where procfs is mounted
}

// Owner implements Verifier.
func (k kernel) Owner(pid, fd int32, t sockwire.Tuple) (uint64, error) {
	if err := checkTuple(t); err != nil {
		return 0, errNotOwner
	}
	held, err := k.fdInode(pid, fd)
	if err != nil {
		return 0, errNotOwner
	}
	ino, err := diagInode(t)
	switch {
	case errors.Is(err, errNoSocket):
		return 0, errNotOwner
	case err != nil:
		return 0, err
	case ino != held:
		return 0, errNotOwner
	}
	return ino, nil
}

// Inode implements Verifier.
func (k kernel) Inode(t sockwire.Tuple) (uint64, error) {
	if err := checkTuple(t); err != nil {
		return 0, errNoSocket
	}
	return diagInode(t)
}

// fdInode reads which socket the process's fd is ("socket:[inode]").
func (k kernel) fdInode(pid, fd int32) (uint64, error) {
	link, err := os.Readlink(filepath.Join(k.proc, strconv.Itoa(int(pid)), "fd", strconv.Itoa(int(fd))))
	if err != nil {
		return 0, err
	}
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok || !strings.HasSuffix(s, "]") {
		return 0, fmt.Errorf("fd %d of %d is %s, not a socket", fd, pid, link)
	}
	return strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64)
}
