package main

import (
	"errors"
	"net"
	"path/filepath"
	"strconv"
)

// A hub joins the guests of one boot into a single Ethernet segment. Each
// guest's NIC is a qemu "dgram" netdev on a Unix datagram socket; the hub
// repeats every frame it receives to every other guest, like an Ethernet
// hub (the guests' NICs drop frames that are not theirs). Unix sockets keep
// all lab traffic inside this machine and need no free ports.
type hub struct {
	conn  *net.UnixConn
	ports []*net.UnixAddr
	done  chan struct{}

	// Counted by serve, read after Close.
	frames, lost uint64
}

// hubAddr and guestSock name the sockets of a boot in dir.
func hubAddr(dir string) string          { return filepath.Join(dir, "hub.sock") }
func guestSock(dir string, i int) string { return filepath.Join(dir, "g"+strconv.Itoa(i)+".sock") }

// newHub listens in dir for guests 1..n and starts repeating frames.
func newHub(dir string, n int) (*hub, error) {
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: hubAddr(dir), Net: "unixgram"})
	if err != nil {
		return nil, err
	}
	h := &hub{conn: conn, done: make(chan struct{})}
	for i := 1; i <= n; i++ {
		h.ports = append(h.ports, &net.UnixAddr{Name: guestSock(dir, i), Net: "unixgram"})
	}
	go h.serve()
	return h, nil
}

func (h *hub) serve() {
	defer close(h.done)
	buf := make([]byte, 65536)
	for {
		n, from, err := h.conn.ReadFromUnix(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		h.frames++
		for _, p := range h.ports {
			if from != nil && p.Name == from.Name {
				continue
			}
			// A guest that is not up yet (or already gone) has no socket:
			// its frames are lost, as on a cable that is not plugged in.
			if _, err := h.conn.WriteToUnix(buf[:n], p); err != nil {
				h.lost++
			}
		}
	}
}

// Close stops the hub and waits for it.
func (h *hub) Close() error {
	err := h.conn.Close()
	<-h.done
	return err
}
