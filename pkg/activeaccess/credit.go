package activeaccess

import (
	"fmt"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
)

const (
	entryHeader = kmod.EntryHeader // bytes of a log entry's header
	entryAlign  = kmod.EntryAlign
	pageSize    = kmod.PageSize
	// maxEntry is the largest entry one packet and page can make: a
	// header and a page of data (a packet is at most 4096 bytes).
	maxEntry = entryHeader + pageSize
)

func round64(n int64) int64 { return (n + entryAlign - 1) &^ (entryAlign - 1) }

// cost returns the log bytes an access of n bytes at target address addr
// can take when the path MTU is mtu: the module logs one entry per packet
// and page, of a header plus (with WLD or RLD) the bytes of that piece,
// rounded to 64. Packets cut the access every mtu bytes from its start;
// pages cut it at 4 KiB boundaries of the target address. The result
// assumes every page logs data: it is an upper bound of what the access
// really takes, exact when it does.
func cost(addr uint64, n, mtu int) int64 {
	if n <= 0 || mtu <= 0 {
		return 0
	}
	var c int64
	for p := 0; p < n; p += mtu {
		end := min(p+mtu, n)
		for a, e := addr+uint64(p), addr+uint64(end); a < e; {
			next := min((a&^(pageSize-1))+pageSize, e)
			c += entryHeader + round64(int64(next-a))
			a = next
		}
	}
	return c
}

// grantFor returns the credits each of maxSources sources gets from logs
// of logSize bytes: the log less room for the one padding entry a wrap can
// leave, shared equally, in whole entries' alignment. Sources whose
// unprocessed entries never exceed their grant can never fill a log, so
// the module never refuses them.
func grantFor(logSize, maxSources int) (int64, error) {
	if maxSources < 1 {
		return 0, fmt.Errorf("%w: %d sources", ErrInvalid, maxSources)
	}
	pool := int64(logSize) - maxEntry
	g := (pool / int64(maxSources)) &^ (entryAlign - 1)
	if g < maxEntry {
		return 0, fmt.Errorf("%w: a %d-byte log shared by %d sources leaves %d bytes each, less than one %d-byte entry",
			ErrInvalid, logSize, maxSources, g, maxEntry)
	}
	return g, nil
}

// ledger is a source's credit account. Credits spent since the last
// marker belong to the open epoch; sending a marker closes it; the
// target's acknowledgement of epoch k returns the credits of every epoch
// up to k. Invariant: avail + open + sum(closed) == grant.
type ledger struct {
	grant  int64
	avail  int64
	open   int64         // spent in the open epoch
	closed []epochCharge // closed, unacknowledged, oldest first
	last   uint64        // the newest closed epoch (0: none yet)
	acked  uint64        // the newest acknowledged epoch
}

type epochCharge struct {
	epoch  uint64
	amount int64
}

func newLedger(grant int64) *ledger { return &ledger{grant: grant, avail: grant} }

// charge spends c credits in the open epoch if they are available.
func (l *ledger) charge(c int64) bool {
	if c > l.avail {
		return false
	}
	l.avail -= c
	l.open += c
	return true
}

// closeEpoch closes the open epoch (a marker for it is being sent) and
// returns its number.
func (l *ledger) closeEpoch() uint64 {
	l.last++
	l.closed = append(l.closed, epochCharge{l.last, l.open})
	l.open = 0
	return l.last
}

// ack returns the credits of every closed epoch up to epoch and reports
// how many it returned. Acknowledging an epoch never closed, or going
// backwards, is a protocol error.
func (l *ledger) ack(epoch uint64) (int64, error) {
	if epoch > l.last {
		return 0, fmt.Errorf("%w: acknowledgement of epoch %d, only %d sent", ErrProtocol, epoch, l.last)
	}
	if epoch <= l.acked {
		return 0, nil
	}
	var r int64
	i := 0
	for ; i < len(l.closed) && l.closed[i].epoch <= epoch; i++ {
		r += l.closed[i].amount
	}
	l.closed = append(l.closed[:0], l.closed[i:]...)
	l.avail += r
	l.acked = epoch
	return r, nil
}

// uncharge takes back a charge of the open epoch that was not used.
func (l *ledger) uncharge(c int64) {
	l.avail += c
	l.open -= c
}

// outstanding is the number of markers sent and not yet acknowledged.
func (l *ledger) outstanding() int { return int(l.last - l.acked) }

// check verifies the invariant (tests).
func (l *ledger) check() error {
	s := l.avail + l.open
	for _, c := range l.closed {
		s += c.amount
	}
	if s != l.grant || l.avail < 0 || l.open < 0 {
		return fmt.Errorf("ledger: avail %d + open %d + closed = %d, grant %d", l.avail, l.open, s, l.grant)
	}
	return nil
}

// staging is a ring allocator over a source's staging memory. Spans are
// handed out in order and may be freed in any order; space is reused once
// every older span was freed (completions of one queue pair come in
// order, so in practice frees are in order).
type staging struct {
	size       int
	head, tail int      // free-running byte positions
	spans      []stSpan // live and freed-but-not-reclaimed, oldest first
}

type stSpan struct {
	start, end int // free-running positions; [start, end) includes padding before the data
	off        int // offset of the data in the memory
	freed      bool
}

func newStaging(size int) *staging { return &staging{size: size} }

// alloc reserves n contiguous bytes (never wrapping) and returns their
// offset and a handle for free; ok is false when they do not fit now.
func (s *staging) alloc(n int) (off int, h int, ok bool) {
	if n <= 0 || n > s.size {
		return 0, 0, false
	}
	start := s.head
	pos := start % s.size
	if s.size-pos < n { // skip the tail end of the area
		start += s.size - pos
		pos = 0
	}
	if start+n-s.tail > s.size {
		return 0, 0, false
	}
	s.spans = append(s.spans, stSpan{start: s.head, end: start + n, off: pos})
	s.head = start + n
	return pos, start + n, true
}

// free releases the span alloc returned h for. Frees in allocation order
// (the usual case) take constant time.
func (s *staging) free(h int) {
	for i := range s.spans {
		if s.spans[i].end == h && !s.spans[i].freed {
			s.spans[i].freed = true
			break
		}
	}
	i := 0
	for ; i < len(s.spans) && s.spans[i].freed; i++ {
		s.tail = s.spans[i].end
	}
	// Drop the reclaimed spans from the front without copying the rest;
	// alloc's append moves the live ones to the start of a new array
	// once the slice reaches its capacity.
	s.spans = s.spans[i:]
	if len(s.spans) == 0 {
		// Empty: start again at 0, so any size up to the whole area
		// fits (a span never wraps).
		s.head, s.tail = 0, 0
	}
}

// cancel undoes the newest alloc (h is its handle), or frees h if it is
// not the newest.
func (s *staging) cancel(h int) {
	if n := len(s.spans); n > 0 && s.spans[n-1].end == h && !s.spans[n-1].freed {
		s.head = s.spans[n-1].start
		s.spans = s.spans[:n-1]
		if len(s.spans) == 0 {
			s.head, s.tail = 0, 0
		}
		return
	}
	s.free(h)
}

// used returns the bytes reserved (data and padding).
func (s *staging) used() int { return s.head - s.tail }
