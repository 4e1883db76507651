package sockets

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"time"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// segUsage is what one user's statistics segments cost rvmad.
type segUsage struct {
	n     int
	bytes int
}

// addSegment maps the statistics segment a process passed with STATS
// (the one descriptor of p), unless it has one already, its user is at
// MaxSegmentsPerUID or MaxSegmentBytesPerUID, or it is not a valid
// segment: those are refused (counted, logged) and the process goes on
// without rvmad reading its statistics.
func (b *Broker) addSegment(c *client, rec sockwire.Stats, p *passed) {
	fd := p.sock()
	b.mu.Lock()
	dup := c.seg != nil
	u := b.segUID[c.uid]
	over := u.n >= MaxSegmentsPerUID || u.bytes+int(rec.Size) > MaxSegmentBytesPerUID
	b.mu.Unlock()
	switch {
	case dup:
		b.m.segmentRefused(segDuplicate)
		b.log.Debug("sockets: a second statistics segment of a process", "pid", c.pid)
		return
	case over:
		b.m.segmentRefused(segLimit)
		b.log.Debug("sockets: statistics segments over the user's cap", "uid", c.uid, "pid", c.pid)
		return
	case fd < 0:
		b.m.segmentRefused(segInvalid)
		b.log.Debug("sockets: STATS without exactly one descriptor", "pid", c.pid)
		return
	}
	s, err := mapSegment(fd, rec.Size, c.pid, c.uid)
	p.close()
	if err != nil {
		b.m.segmentRefused(segInvalid)
		if errors.Is(err, errSegment) {
			b.log.Debug("sockets: a statistics segment refused", "pid", c.pid, "uid", c.uid, "err", err)
		} else {
			b.log.Warn("sockets: cannot map a statistics segment", "pid", c.pid, "err", err)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	u = b.segUID[c.uid]
	_, live := b.clients[c]
	if !live || c.seg != nil || u.n >= MaxSegmentsPerUID || u.bytes+len(s.mem) > MaxSegmentBytesPerUID {
		s.unmap()
		b.m.segmentRefused(segLimit)
		return
	}
	c.seg = s
	b.segUID[c.uid] = segUsage{n: u.n + 1, bytes: u.bytes + len(s.mem)}
}

// dropSegmentLocked folds the final values of a client's segment into
// the totals and lets it go (under b.mu). The mapping outlives the
// process, so the values are its last ones.
func (b *Broker) dropSegmentLocked(c *client) {
	s := c.seg
	if s == nil {
		return
	}
	final := s.counters()
	b.m.fold(&final)
	size := len(s.mem)
	s.unmap()
	c.seg = nil
	u := b.segUID[c.uid]
	u.n--
	u.bytes -= size
	if u.n <= 0 {
		delete(b.segUID, c.uid)
	} else {
		b.segUID[c.uid] = u
	}
}

// shimView reads every segment: the totals (with the processes gone),
// the processes and their live connections by path.
func (b *Broker) shimView() shimView {
	b.mu.Lock()
	defer b.mu.Unlock()
	v := shimView{total: b.m.foldedTotals()}
	for c := range b.clients {
		if c.seg == nil {
			continue
		}
		cs := c.seg.counters()
		v.total.add(&cs)
		v.processes++
		c.seg.slots(func(e slotEntry) { v.conns[e.path]++ })
	}
	return v
}

// errListed ends a LIST client's connection once it has its answer.
var errListed = errors.New("listed")

// Conn is one connection `rvmad sockets` lists: an attachable connection
// of a process under the shim, as the process's statistics segment says.
type Conn struct {
	PID        int32  `json:"pid"`
	UID        uint32 `json:"uid"`
	Comm       string `json:"comm"`
	Local      string `json:"local"`
	Remote     string `json:"remote"`
	State      string `json:"state"` // tcp, attaching, attached, demoting, closing
	Path       string `json:"path"`  // tcp, rdma
	Epoch      uint32 `json:"epoch"`
	TCPIn      uint64 `json:"tcp_in"`
	TCPOut     uint64 `json:"tcp_out"`
	RDMAIn     uint64 `json:"rdma_in"`
	RDMAOut    uint64 `json:"rdma_out"`
	RDMAWrites uint64 `json:"rdma_writes"`
	LastReason string `json:"last_reason,omitempty"` // of the last demote or fallback
}

// listAnswer is the text rvmad answers LIST with.
type listAnswer struct {
	Connections []Conn `json:"connections"`
}

// listChunk is the largest message of a LIST answer.
const listChunk = 16 << 10

// list answers a LIST: the connections of the client's user's processes
// (every process for root), as JSON in messages of at most listChunk
// bytes; then the client is disconnected (errListed).
func (b *Broker) list(c *client) error {
	var ans listAnswer
	b.mu.Lock()
	for o := range b.clients {
		s := o.seg
		if s == nil || (c.uid != 0 && s.uid != c.uid) {
			continue
		}
		s.slots(func(e slotEntry) {
			l, r := addrs(e.tuple)
			cn := Conn{PID: s.pid, UID: s.uid, Comm: s.comm,
				Local:  netip.AddrPortFrom(l, e.tuple.LocalPort).String(),
				Remote: netip.AddrPortFrom(r, e.tuple.RemotePort).String(),
				State:  stateNames[e.state], Path: pathNames[e.path], Epoch: e.epoch,
				TCPIn: e.bytes[pathTCP][dirIn], TCPOut: e.bytes[pathTCP][dirOut],
				RDMAIn: e.bytes[pathRDMA][dirIn], RDMAOut: e.bytes[pathRDMA][dirOut], RDMAWrites: e.rdmaWrites}
			if e.reason != 0 {
				cn.LastReason = e.reason.String()
			}
			ans.Connections = append(ans.Connections, cn)
		})
	}
	b.mu.Unlock()
	sort.Slice(ans.Connections, func(i, j int) bool {
		a, z := ans.Connections[i], ans.Connections[j]
		if a.PID != z.PID {
			return a.PID < z.PID
		}
		return a.Local < z.Local
	})
	out, err := json.Marshal(ans)
	if err != nil {
		return fmt.Errorf("sockets: list: %w", err)
	}
	// Straight to the socket: a LIST client gets nothing else. A client
	// that does not read within the deadline loses its answer.
	c.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	for len(out) > 0 {
		n := min(len(out), listChunk)
		if _, err := c.conn.Write(out[:n]); err != nil {
			b.log.Debug("sockets: a LIST answer not taken", "pid", c.pid, "err", err)
			break
		}
		out = out[n:]
	}
	return errListed
}

// List asks the rvmad serving the Unix socket at path for the
// connections the caller may see (its own processes', or every one for
// root). It fails when the socket cannot be reached (rvmad not running,
// or its sockets service disabled), or when the answer is cut or is not
// JSON (another rvmad version).
func List(path string) ([]Conn, error) {
	conn, err := net.Dial("unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("rvmad's sockets broker: %w", err)
	}
	defer conn.Close()
	req, err := sockwire.Marshal(sockwire.List{Epoch: 1})
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(req); err != nil {
		return nil, fmt.Errorf("rvmad's sockets broker: %w", err)
	}
	var all bytes.Buffer
	buf := make([]byte, listChunk+1)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			all.Write(buf[:n])
		}
		if err != nil || n == 0 {
			break
		}
	}
	var ans listAnswer
	if err := json.Unmarshal(all.Bytes(), &ans); err != nil {
		return nil, fmt.Errorf("rvmad's answer to LIST: %w", err)
	}
	return ans.Connections, nil
}
