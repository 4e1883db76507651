package rvma

import (
	"fmt"
	"strings"
	"sync/atomic"
	"unsafe"
)

// Flags describe how an epoch ended.
type Flags uint32

// Record flags.
const (
	// FlagPartial: IncEpoch handed the buffer over before its threshold
	// was reached; Len and Ops are the true counts.
	FlagPartial Flags = 1 << iota
	// FlagClosed: the window closed before the buffer completed.
	FlagClosed
	// FlagLate: puts arrived for the epoch after its threshold was
	// reached and before it was handed over (an overshoot); they are
	// included in Len and Ops.
	FlagLate
	// FlagOneTime: the buffer was posted as a one-time buffer.
	FlagOneTime
	// FlagFailed: the endpoint failed (ErrFailed) before the epoch
	// completed; the buffer was handed over without its memory window
	// unbound, once the links were down. Len and Ops count what arrived.
	FlagFailed
)

// String lists the flags by name, joined by |.
func (f Flags) String() string {
	if f == 0 {
		return "0"
	}
	var s []string
	for _, n := range []struct {
		f    Flags
		name string
	}{{FlagPartial, "partial"}, {FlagClosed, "closed"}, {FlagLate, "late"}, {FlagOneTime, "one-time"}, {FlagFailed, "failed"}} {
		if f&n.f != 0 {
			s = append(s, n.name)
			f &^= n.f
		}
	}
	if f != 0 {
		s = append(s, fmt.Sprintf("%#x", uint32(f)))
	}
	return strings.Join(s, "|")
}

// Record is what a completion pointer holds once a buffer's epoch is over:
// the paper's buffer address and length, plus the counts and the epoch.
type Record struct {
	Epoch uint64 // the epoch (generation) the buffer held
	Addr  uint64 // the address of the buffer's first byte
	Len   uint64 // bytes placed in the buffer (counted): the true length
	Ops   uint64 // puts counted
	Cap   uint64 // the buffer's capacity in bytes
	Flags Flags
}

// Completion is the memory a completion pointer designates: 64 bytes,
// cache-line aligned, written once per epoch by the library and readable by
// the application at any time without a lock (poll it, or watch its first
// word). Its layout, in 64-bit words:
//
//	0 seq    0: never published; odd: being written; even: published (it
//	         grows by 2 with every publication, across re-use of the slot)
//	1 epoch  2 addr  3 len  4 ops  5 cap  6 flags
//	7 seq    the sequence again, written just before word 0 turns even
//
// Load never returns a torn record. A Completion is reused when its buffer
// is re-posted: until the next publication it still holds the previous
// record, so compare Record.Epoch, or use Posted.Load, which knows which
// publication it waits for. In a window the kernel module counts, the
// Completion lies in memory the module maps: reading it after the
// endpoint closed faults, so stop polling before Close.
type Completion struct {
	w [8]atomic.Uint64
}

// CompletionSize is the size of a Completion in bytes.
const CompletionSize = 64

// Addr returns the address of the completion pointer's memory, for code
// that polls it or waits on it with MONITOR/MWAIT. It stays valid while
// the window lives.
func (c *Completion) Addr() uintptr { return uintptr(unsafe.Pointer(c)) }

// Seq returns the completion's sequence word: it changes (and is even)
// every time a record is published.
func (c *Completion) Seq() uint64 { return c.w[0].Load() }

// Load returns the last record published and true, or false when nothing
// was ever published. It retries while a publication is in progress, so
// the record is never torn.
func (c *Completion) Load() (Record, bool) {
	r, seq := c.load()
	return r, seq != 0
}

func (c *Completion) load() (Record, uint64) {
	for {
		s1 := c.w[0].Load()
		if s1 == 0 {
			return Record{}, 0
		}
		if s1&1 != 0 {
			continue // being written
		}
		r := Record{Epoch: c.w[1].Load(), Addr: c.w[2].Load(), Len: c.w[3].Load(),
			Ops: c.w[4].Load(), Cap: c.w[5].Load(), Flags: Flags(c.w[6].Load())}
		if c.w[7].Load() == s1 && c.w[0].Load() == s1 {
			return r, s1
		}
	}
}

// isOwnRecord reports whether r, read from a completion slot at sequence
// seq, is the record of epoch gen of the buffer armed on that slot at
// sequence armed: published since the arming (a slot that served another
// buffer holds that buffer's older records, possibly of the same epoch
// number), and of this epoch.
func isOwnRecord(r Record, seq, armed, gen uint64) bool { return seq > armed && r.Epoch == gen }

// publish writes r as the slot's next publication and returns its
// sequence: seq goes odd, the fields and the trailing copy are written, then
// seq goes even, two above its previous value. Sequences only grow, also
// across re-use of the slot, so a reader that remembers the sequence it
// saw when a buffer was armed can tell its own record from an older one.
// There is one writer per Completion (the window, under its lock).
func (c *Completion) publish(r Record) uint64 {
	seq := c.w[0].Load() + 2
	c.w[0].Store(seq - 1)
	c.w[1].Store(r.Epoch)
	c.w[2].Store(r.Addr)
	c.w[3].Store(r.Len)
	c.w[4].Store(r.Ops)
	c.w[5].Store(r.Cap)
	c.w[6].Store(uint64(r.Flags))
	c.w[7].Store(seq)
	c.w[0].Store(seq)
	return seq
}

// completionSource hands out completion records: a window's own slab, or
// the records the kernel module writes (counted windows).
type completionSource interface {
	get() *Completion // nil when none is left
	put(c *Completion)
	// load reads c's record (as Completion.load); false once the memory
	// behind c is gone (the module's records, after the endpoint closed).
	load(c *Completion) (Record, uint64, bool)
}

// completionSlab hands out cache-line aligned Completions carved from
// allocations of chunk slots each, in the Go heap (a Completion keeps its
// allocation alive). It grows when every slot is in use: a one-time buffer
// the application never releases keeps its slot, and its record, for as
// long as the application holds the Posted.
type completionSlab struct {
	chunk int
	mem   []uint64 // the current allocation
	base  int      // its first word of a 64-byte aligned line
	next  int      // its next unused slot
	free  []*Completion
}

func newCompletionSlab(chunk int) *completionSlab {
	s := &completionSlab{chunk: max(chunk, 1)}
	s.grow()
	return s
}

func (s *completionSlab) grow() {
	s.mem = make([]uint64, 8*(s.chunk+1))
	s.base, s.next = 0, 0
	for uintptr(unsafe.Pointer(&s.mem[s.base]))%CompletionSize != 0 {
		s.base++
	}
}

// get returns a recycled or a fresh Completion.
func (s *completionSlab) get() *Completion {
	if n := len(s.free); n > 0 {
		c := s.free[n-1]
		s.free = s.free[:n-1]
		return c
	}
	if s.next == s.chunk {
		s.grow()
	}
	i := s.base + 8*s.next
	s.next++
	return (*Completion)(unsafe.Pointer(&s.mem[i]))
}

// put returns a Completion to the slab. Its words are kept: a stale reader
// still sees the last record, never a torn one.
func (s *completionSlab) put(c *Completion) { s.free = append(s.free, c) }

// load reads c: the slab's memory lives as long as c does.
func (s *completionSlab) load(c *Completion) (Record, uint64, bool) {
	r, seq := c.load()
	return r, seq, true
}
