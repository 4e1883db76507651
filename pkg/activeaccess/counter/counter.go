// Package counter counts the remote accesses each page of an Active Access
// target receives (Besta and Hoefler, ICS'15, section 4.2): the pages get
// the control bits W|R|WL|RL (activeaccess.Count), so memory behaves as
// usual while the module (or, in the mediated mode, the target's runtime)
// logs one metadata-only entry per access, and a handler adds it to the
// page's counters. No data is copied into the log, and the sources need no
// counting code of their own: in the transparent mode even plain RDMA
// WRITEs and READs from peers that do not use pkg/activeaccess are counted.
//
// What is counted is the log's entries: one per packet and page (per page
// in the mediated mode). An access that fits in one path-MTU packet and
// one page is one entry, so for such accesses the counts are exactly the
// numbers of puts and gets; a larger access, or one that crosses a page
// boundary, counts once per packet and page it touched. The byte counts
// are exact for every access.
//
// The counts include an access once the target's handler processed its
// entry: after the source's activeaccess.Source.Flush for active accesses
// (and, for plain ones, FlushPlain followed by Flush), which is how the
// paper enforces the processing. An RDMA READ that the source's NIC
// retransmits is served, logged and counted again.
package counter

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
)

// Page is the granularity of the counts: one IOMMU page.
const Page = 4096

// Counts are a page's (or a range's) counters. Their sums wrap around
// after 2^64, as any uint64 does.
type Counts struct {
	Puts     uint64 // remote writes: log entries of kind put
	Gets     uint64 // remote reads served: log entries of kind get
	Atomics  uint64 // remote atomics (plain verbs sources only)
	PutBytes uint64 // bytes written
	GetBytes uint64 // bytes served
}

// Add returns the sum of c and o. It cannot fail.
func (c Counts) Add(o Counts) Counts {
	return Counts{c.Puts + o.Puts, c.Gets + o.Gets, c.Atomics + o.Atomics, c.PutBytes + o.PutBytes, c.GetBytes + o.GetBytes}
}

// Options tune New. A nil *Options, like the zero value, means an
// event-driven counter with the domain defaults of
// activeaccess.DomainOptions. Values the domain refuses (a negative
// PollIdle) make New fail with activeaccess.ErrInvalid.
type Options struct {
	// Notify is how the handler learns of new entries (activeaccess.Event
	// or activeaccess.Poll); PollIdle as in activeaccess.DomainOptions.
	Notify   activeaccess.Notification
	PollIdle time.Duration
}

type pageCounts struct {
	puts, gets, atomics, putBytes, getBytes atomic.Uint64
}

// Counter counts the accesses to a range of a target's pages. It is safe
// for concurrent use.
type Counter struct {
	off   int
	pages []pageCounts
	d     *activeaccess.Domain
	stray atomic.Uint64

	mu     sync.Mutex
	closed bool
}

// New counts the accesses to the pages [off, off+length) of tg's memory:
// it creates a domain whose handler counts and associates the pages with
// activeaccess.Count (replacing what they had). off and length must be
// multiples of Page. opts may be nil (see Options). New changes local
// state only (the module's tables), so it takes no context.
//
// Errors wrap activeaccess.ErrInvalid (a nil target, unaligned or empty
// pages, an option out of range), activeaccess.ErrRange (pages beyond the
// memory), activeaccess.ErrClosed (tg was closed), or the module's error
// (kmod.ErrTooManyDomains, ...).
func New(tg *activeaccess.Target, off, length int, opts *Options) (*Counter, error) {
	if tg == nil {
		return nil, fmt.Errorf("counter: %w: nil target", activeaccess.ErrInvalid)
	}
	if off < 0 || length <= 0 || off%Page != 0 || length%Page != 0 {
		return nil, fmt.Errorf("counter: %w: pages [%d, +%d) (whole %d-byte pages)", activeaccess.ErrInvalid, off, length, Page)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	c := &Counter{off: off, pages: make([]pageCounts, length/Page)}
	d, err := tg.NewDomain(c.handle, &activeaccess.DomainOptions{Notify: o.Notify, PollIdle: o.PollIdle})
	if err != nil {
		return nil, fmt.Errorf("counter: %w", err)
	}
	if err := d.Associate(off, length, activeaccess.Count); err != nil {
		d.Close()
		return nil, fmt.Errorf("counter: %w", err)
	}
	c.d = d
	return c, nil
}

// handle adds one log entry to its page's counters.
func (c *Counter) handle(a *activeaccess.Access) {
	i := (a.Offset - c.off) / Page
	if a.Offset < c.off || i >= len(c.pages) {
		c.stray.Add(1) // cannot happen: the domain has only our pages
		return
	}
	p := &c.pages[i]
	n := uint64(a.Length)
	switch a.Kind {
	case activeaccess.KindPut:
		p.puts.Add(1)
		p.putBytes.Add(n)
	case activeaccess.KindGet:
		p.gets.Add(1)
		p.getBytes.Add(n)
	case activeaccess.KindAtomic:
		p.atomics.Add(1)
	}
}

// Page returns the counts of the page that holds offset off of the
// target's memory. Errors wrap activeaccess.ErrRange outside the counted
// range. After Close it returns the final counts.
func (c *Counter) Page(off int) (Counts, error) {
	i := (off - c.off) / Page
	if off < c.off || i >= len(c.pages) {
		return Counts{}, fmt.Errorf("counter: %w: offset %d not in [%d, +%d)", activeaccess.ErrRange, off, c.off, len(c.pages)*Page)
	}
	return c.load(i), nil
}

func (c *Counter) load(i int) Counts {
	p := &c.pages[i]
	return Counts{p.puts.Load(), p.gets.Load(), p.atomics.Load(), p.putBytes.Load(), p.getBytes.Load()}
}

// All returns every page's counts, the first page's first. It cannot
// fail; after Close it returns the final counts.
func (c *Counter) All() []Counts {
	out := make([]Counts, len(c.pages))
	for i := range out {
		out[i] = c.load(i)
	}
	return out
}

// Total returns the sum over the counted pages. It cannot fail; after
// Close it returns the final sum.
func (c *Counter) Total() Counts {
	var t Counts
	for i := range c.pages {
		t = t.Add(c.load(i))
	}
	return t
}

// Processed returns how many log entries the handler processed. It
// cannot fail, and keeps its last value after Close.
func (c *Counter) Processed() uint64 { return c.d.Processed() }

// Err returns the error that stopped the counting (the domain's runtime
// failed: a corrupt log), or nil while it counts and after a clean
// Close. Counts are incomplete after such an error.
func (c *Counter) Err() error {
	if err := c.d.Err(); err != nil {
		return fmt.Errorf("counter: %w", err)
	}
	if n := c.stray.Load(); n != 0 {
		return fmt.Errorf("counter: %d entries outside the counted pages", n)
	}
	return nil
}

// Close stops counting (waiting for a running handler) and makes the
// pages plain memory; the counts stay readable. It returns the module's
// error freeing the domain's log, if any; a second Close returns nil.
func (c *Counter) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if err := c.d.Close(); err != nil {
		return fmt.Errorf("counter: %w", err)
	}
	return nil
}
