package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
	mac  atomic.Value // string: the source address of the guest's first frame

	// Counters for a report on a stalled guest NIC (hub.report): frames
	// taken from the guest and when the last one came; frames written to
	// it, and since when a write has been blocked (0: none is).
	in, out         atomic.Uint64
	lastIn, blocked atomic.Int64 // unix nanoseconds
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
		from.in.Add(1)
		from.lastIn.Store(time.Now().UnixNano())
		if from.mac.Load() == nil && n >= 12 {
			from.mac.Store(net.HardwareAddr(frame[4+6 : 4+12]).String())
		}
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
		p.blocked.Store(time.Now().UnixNano())
		_, err := w.Write(frame)
		// Batch what is already queued, then flush.
		if err == nil && len(p.q) == 0 {
			err = w.Flush()
		}
		p.blocked.Store(0)
		if err != nil {
			break
		}
		p.out.Add(1)
	}
	p.conn.Close()
	for range p.q { // the reader closes q once the guest is gone
	}
}

// report describes every guest's port at time now: what the hub took from
// it and gave it, and whether a write to it is blocked (the guest's qemu
// not reading). It is for a guest whose NIC stalled (probeNICStall).
func (h *hub) report(now time.Time) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "hub: %d frames repeated, %d dropped\n", h.frames.Load(), h.dropped.Load())
	for _, p := range h.outs {
		mac, ok := p.mac.Load().(string)
		if !ok {
			mac = "(no frame yet)"
		}
		fmt.Fprintf(&b, "port %s: %d frames in, the last %v ago; %d out, %d queued", mac, p.in.Load(), since(now, p.lastIn.Load()), p.out.Load(), len(p.q))
		if t := p.blocked.Load(); t != 0 {
			fmt.Fprintf(&b, "; a write in progress for %v", since(now, t))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func since(now time.Time, unixNano int64) time.Duration {
	if unixNano == 0 {
		return 0
	}
	return now.Sub(time.Unix(0, unixNano)).Round(time.Millisecond)
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
