package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// A hub joins the guests of one boot into a single Ethernet segment. Each
// guest's NIC is a qemu "stream" netdev connected to the hub's Unix socket;
// qemu frames each Ethernet frame with a 4-byte big-endian length. The hub
// repeats every frame to every other guest, like an Ethernet hub (the
// guests' NICs drop frames that are not theirs).
//
// Each guest has its own output queue and writer, so a guest whose vCPU is
// not scheduled delays only the frames addressed to it; when its queue is
// full the frame is dropped and counted (tail drop, as in a switch). Unix
// stream sockets keep all lab traffic inside this machine, need no free
// ports, and buffer far more than datagram sockets (whose queues hold only
// net.unix.max_dgram_qlen = 10 frames).
type hub struct {
	ln   *net.UnixListener
	wg   sync.WaitGroup
	mu   sync.Mutex
	outs []*hubPort

	frames, dropped atomic.Uint64
}

type hubPort struct {
	conn net.Conn
	q    chan []byte
}

// hubQueue is how many frames may wait for one guest.
const hubQueue = 4096

// maxFrame bounds a frame (a jumbo frame with headers fits easily).
const maxFrame = 65536

// hubAddr is where the hub of a boot in dir listens.
func hubAddr(dir string) string { return filepath.Join(dir, "hub.sock") }

// newHub listens in dir and repeats frames among whoever connects.
func newHub(dir string) (*hub, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: hubAddr(dir), Net: "unix"})
	if err != nil {
		return nil, err
	}
	h := &hub{ln: ln}
	h.wg.Add(1)
	go h.accept()
	return h, nil
}

func (h *hub) accept() {
	defer h.wg.Done()
	for {
		c, err := h.ln.Accept()
		if err != nil {
			return
		}
		p := &hubPort{conn: c, q: make(chan []byte, hubQueue)}
		h.mu.Lock()
		h.outs = append(h.outs, p)
		h.mu.Unlock()
		h.wg.Add(2)
		go h.read(p)
		go h.write(p)
	}
}

// read takes frames from one guest and queues them for every other one.
func (h *hub) read(from *hubPort) {
	defer h.wg.Done()
	defer func() {
		// Unplug the guest before closing its queue, so that no reader
		// sends to a closed queue.
		h.mu.Lock()
		for i, p := range h.outs {
			if p == from {
				h.outs = append(h.outs[:i], h.outs[i+1:]...)
				break
			}
		}
		h.mu.Unlock()
		close(from.q)
	}()
	r := bufio.NewReaderSize(from.conn, 256*1024)
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 || n > maxFrame {
			return // not qemu's framing: drop the guest rather than guess
		}
		frame := make([]byte, 4+n)
		copy(frame, hdr[:])
		if _, err := io.ReadFull(r, frame[4:]); err != nil {
			return
		}
		h.frames.Add(1)
		h.mu.Lock()
		for _, p := range h.outs {
			if p == from {
				continue
			}
			select {
			case p.q <- frame:
			default:
				h.dropped.Add(1)
			}
		}
		h.mu.Unlock()
	}
}

// write sends one guest its queued frames, in order.
func (h *hub) write(p *hubPort) {
	defer h.wg.Done()
	w := bufio.NewWriterSize(p.conn, 256*1024)
	for frame := range p.q {
		if _, err := w.Write(frame); err != nil {
			break
		}
		// Batch what is already queued, then flush.
		if len(p.q) == 0 {
			if err := w.Flush(); err != nil {
				break
			}
		}
	}
	p.conn.Close()
	for range p.q { // the reader closes q once the guest is gone
	}
}

// Close stops the hub and waits for its goroutines.
func (h *hub) Close() error {
	err := h.ln.Close()
	h.mu.Lock()
	for _, p := range h.outs {
		p.conn.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
