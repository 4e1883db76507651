package sockets

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// clientQueue bounds the messages waiting for one client: a process that
// does not read its socket is disconnected when it is full, so a client
// costs the broker at most this many messages and its registrations.
const clientQueue = 256

// client is a process connected to the broker's Unix socket, known by
// the credentials the kernel gave at connect (SO_PEERCRED). One per
// process: a forked child that wants the broker connects on its own.
type client struct {
	b    *Broker
	conn *net.UnixConn
	pid  int32
	uid  uint32

	out  chan []byte
	done chan struct{}
	once sync.Once

	seg     *segment // its statistics segment, under the broker's mutex; nil: none
	listing bool     // asked LIST (rvmad sockets), under the broker's mutex
}

// send queues m for the client without blocking; a client whose queue is
// full is disconnected.
func (c *client) send(m message) {
	b, err := m.encode(nil)
	if err != nil { // the broker's own bug: records it builds are valid
		c.b.log.Error("sockets: cannot encode a message", "err", err)
		return
	}
	select {
	case <-c.done:
		return
	default:
	}
	select {
	case c.out <- b:
	default:
		c.b.log.Warn("sockets: a process does not read its socket; disconnecting it", "pid", c.pid, "uid", c.uid)
		c.close()
	}
}

func (c *client) close() {
	c.once.Do(func() {
		close(c.done)
		c.conn.Close()
	})
}

func (c *client) writeLoop() {
	defer c.b.wg.Done()
	for {
		select {
		case b := <-c.out:
			if _, err := c.conn.Write(b); err != nil {
				c.close()
				return
			}
		case <-c.done:
			return
		}
	}
}

func (c *client) readLoop() {
	defer c.b.wg.Done()
	defer c.b.clientGone(c)
	defer c.close()
	buf := make([]byte, 2*messageMax) // a longer message is cut, then refused
	oob := make([]byte, unix.CmsgSpace(maxPassed*4))
	for {
		n, oobn, flags, _, err := c.conn.ReadMsgUnix(buf, oob)
		// Descriptors the process passed are the broker's now: each is
		// closed once the message is handled, whatever it was.
		p := &passed{fds: passedFDs(oob[:oobn]), truncated: flags&unix.MSG_CTRUNC != 0}
		if err != nil || n == 0 { // 0: the process is gone (or sent nothing, which no message is)
			p.close()
			if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.b.log.Debug("sockets: client read", "pid", c.pid, "err", err)
			}
			return
		}
		m, err := parseMessage(buf[:n])
		if err == nil {
			err = c.b.fromClient(c, m, p)
		}
		p.close()
		if errors.Is(err, errListed) {
			return
		}
		if err != nil {
			c.b.log.Info("sockets: a process sent a malformed message; disconnecting it", "pid", c.pid, "uid", c.uid, "err", err)
			return
		}
	}
}

// passed is what a process passed with a message (SCM_RIGHTS): the
// broker's descriptors, to close once the message is handled, and
// whether the kernel dropped some for want of room.
type passed struct {
	fds       []int
	truncated bool
}

// sock is the one descriptor passed, or -1 when there are none or more.
func (p *passed) sock() int {
	if len(p.fds) != 1 || p.truncated {
		return -1
	}
	return p.fds[0]
}

// nonEmpty reports whether the process passed anything.
func (p *passed) nonEmpty() bool { return len(p.fds) > 0 || p.truncated }

// close closes every descriptor passed; once.
func (p *passed) close() {
	for _, fd := range p.fds {
		unix.Close(fd)
	}
	p.fds = nil
}

// maxPassed is how many descriptors one read takes in: a REGISTER passes
// one; the kernel drops those beyond the room and says so (MSG_CTRUNC).
const maxPassed = 4

// passedFDs returns the descriptors of every SCM_RIGHTS message in oob,
// the control data of one read. It never fails: it takes what the
// messages that fit whole hold, so that the caller can close them all.
func passedFDs(oob []byte) []int {
	var fds []int
	hdr := unix.CmsgLen(0)
	for len(oob) >= hdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < hdr || l > len(oob) {
			break
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_RIGHTS {
			for d := oob[hdr:l]; len(d) >= 4; d = d[4:] {
				fds = append(fds, int(int32(binary.NativeEndian.Uint32(d))))
			}
		}
		next := unix.CmsgSpace(l - hdr)
		if next > len(oob) {
			break
		}
		oob = oob[next:]
	}
	return fds
}

// peerCred returns the pid and uid of the process at the other end of conn.
func peerCred(conn *net.UnixConn) (int32, uint32, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, err
	}
	if cerr != nil {
		return 0, 0, cerr
	}
	return cred.Pid, cred.Uid, nil
}

// Listen serves local processes on a SOCK_SEQPACKET Unix socket at path,
// mode 0666, until Close. A socket file left by a previous rvmad is
// replaced; one that a live broker answers on, or a file that is not a
// socket, is an error.
func (b *Broker) Listen(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.Dial("unixpacket", path); err == nil {
			c.Close()
			return fmt.Errorf("%s: another broker serves it", path)
		}
		if err := os.Remove(path); err != nil {
			return err
		}
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return err
	}
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return err
	}
	if err := b.addListener(ln); err != nil {
		return err
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			conn, err := ln.AcceptUnix()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					b.log.Error("sockets: Unix socket stopped accepting", "err", err)
				}
				return
			}
			b.accept(conn)
		}
	}()
	return nil
}

// accept admits a process: its credentials, then its reader and writer.
func (b *Broker) accept(conn *net.UnixConn) {
	pid, uid, err := peerCred(conn)
	if err != nil {
		b.log.Warn("sockets: no peer credentials", "err", err)
		conn.Close()
		return
	}
	c := &client{b: b, conn: conn, pid: pid, uid: uid, out: make(chan []byte, clientQueue), done: make(chan struct{})}
	if !b.addClient(c) {
		b.log.Warn("sockets: too many processes of one user connected", "uid", uid, "pid", pid, "max", MaxClientsPerUID)
		conn.Close()
		return
	}
	b.wg.Add(2)
	go c.writeLoop()
	go c.readLoop()
}
