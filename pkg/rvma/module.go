package rvma

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
)

// module is an engine's use of the kernel module's counted mailboxes
// (docs/rvma.md, section 6): the records the module writes, shared by
// every counted window of the engine (it is their completionSource), and
// the module's window ids. It is the counter of the windows it counts.
//
// Lock order: mu and memMu are leaves; register takes the memory's mutex
// (placementOf) under a window's dispatch lock, holding neither.
type module struct {
	dev  *kmod.Device
	mb   *kmod.Mailboxes
	mem  *memory     // the engine's: the guarded registrations (placementOf)
	fail func(error) // engine.fail

	mu      sync.Mutex
	records int
	next    int
	free    []uint32
	wins    map[uint32]*Window // by module window id

	// memMu guards the records' mapping against close: readers hold it
	// shared and find gone set once close unmaps it.
	memMu sync.RWMutex
	gone  bool
}

// openModule opens /dev/rdmaplus and sets up records completion records.
func openModule(records int, mem *memory, fail func(error)) (*module, error) {
	dev, err := kmod.Open()
	if err != nil {
		return nil, err
	}
	mb, err := dev.Mailboxes(engineSlots, records)
	if err != nil {
		dev.Close()
		return nil, err
	}
	return &module{dev: dev, mb: mb, mem: mem, fail: fail, records: records, wins: map[uint32]*Window{}}, nil
}

func (m *module) close() error {
	m.memMu.Lock()
	m.gone = true
	m.memMu.Unlock()
	return errors.Join(m.mb.Close(), m.dev.Close())
}

// load reads record c; false once close unmapped the records.
func (m *module) load(c *Completion) (Record, uint64, bool) {
	m.memMu.RLock()
	defer m.memMu.RUnlock()
	if m.gone {
		return Record{}, 0, false
	}
	r, seq := c.load()
	return r, seq, true
}

// get hands out a record; nil when all are in use.
func (m *module) get() *Completion {
	m.mu.Lock()
	defer m.mu.Unlock()
	var i uint32
	switch {
	case len(m.free) > 0:
		i = m.free[len(m.free)-1]
		m.free = m.free[:len(m.free)-1]
	case m.next < m.records:
		i = uint32(m.next)
		m.next++
	default:
		return nil
	}
	return (*Completion)(m.mb.Record(int(i)))
}

// put returns a record. Its words are kept: a stale reader still sees the
// last record, never a torn one.
func (m *module) put(c *Completion) {
	m.mu.Lock()
	m.free = append(m.free, m.index(c))
	m.mu.Unlock()
}

// index is the number of record c.
func (m *module) index(c *Completion) uint32 {
	return uint32((uintptr(unsafe.Pointer(c)) - uintptr(m.mb.Record(0))) / CompletionSize)
}

// windows returns the counted windows.
func (m *module) windows() []*Window {
	m.mu.Lock()
	defer m.mu.Unlock()
	ws := make([]*Window, 0, len(m.wins))
	for _, w := range m.wins {
		ws = append(ws, w)
	}
	return ws
}

// open implements counter: it creates the module's side of a counted
// window, whose mailbox key senders write to.
func (m *module) open(w *Window) error {
	kind := kmod.CountBytes
	if w.st.opts.Kind == EpochOps {
		kind = kmod.CountOps
	}
	id, key, err := m.mb.CreateMailboxWindow(kind)
	if err != nil {
		return fmt.Errorf("window %v: %w", w.mailbox, err)
	}
	w.kid = id
	w.st.mbkey = key
	m.mu.Lock()
	m.wins[id] = w
	m.mu.Unlock()
	return nil
}

// drop implements counter: it forgets a counted window in the module: its
// mailbox key is refused from then on, and its buffers are no longer
// counted.
func (m *module) drop(w *Window) {
	if w.kid == 0 {
		return
	}
	m.mu.Lock()
	delete(m.wins, w.kid)
	m.mu.Unlock()
	if err := m.mb.DestroyWindow(w.kid); err != nil {
		m.fail(fmt.Errorf("rvma: window %v: %w", w.mailbox, err))
	}
}

// carryOut implements counter: it registers the window's buffers with the
// module, one system call for the lot (kmod.Mailboxes.PostMany), then
// ends generations there. A generation the module published already
// (its threshold was reached just before) is not an error.
func (m *module) carryOut(w *Window, acts countActions) {
	if as := acts.register; len(as) > 0 {
		m.register(w, as)
	}
	for _, a := range acts.end {
		var f kmod.RecordFlags
		if a.flags&FlagPartial != 0 {
			f |= kmod.RecordPartial
		}
		if a.flags&FlagClosed != 0 {
			f |= kmod.RecordClosed
		}
		err := m.mb.End(w.kid, a.gen, f, false)
		if err != nil && !errors.Is(err, kmod.ErrNotFound) {
			m.fail(fmt.Errorf("rvma: ending epoch %d of window %v in the module: %w", a.gen, w.mailbox, err))
		}
	}
}

// register tells the module of a counted window's buffers, in generation
// order, before they are shown: counted from their first byte.
func (m *module) register(w *Window, as []regAction) {
	ps := make([]kmod.MailboxPost, len(as))
	for i, a := range as {
		mr := m.mem.placementOf(a.b.addr, a.b.cap)
		if mr == nil { // cannot happen: alloc guards every arena when the module counts
			m.fail(fmt.Errorf("rvma: buffer at %#x of window %v is in no guarded registration", a.b.addr, w.mailbox))
			return
		}
		ps[i] = kmod.MailboxPost{Key: mr.LKey(), IOVA: a.b.addr, Length: a.b.cap,
			Threshold: a.threshold, Gen: a.gen, Record: m.index(a.b.comp), OneTime: a.b.oneTime}
	}
	if n, err := m.mb.PostMany(w.kid, ps); err != nil {
		m.fail(fmt.Errorf("rvma: registering buffer %d of %d (epoch %d) of window %v with the module: %w",
			n+1, len(ps), as[min(n, len(as)-1)].gen, w.mailbox, err))
	}
}

// sync implements counter: it takes the epochs the module has published
// for the window.
func (m *module) sync(w *Window) {
	var done uint64
	if w.kid != 0 {
		done = m.mb.Done(w.kid)
	}
	w.takePublished(done)
}

// refusedPackets implements counter.
func (m *module) refusedPackets(w *Window) uint64 {
	if w.kid == 0 {
		return 0
	}
	return m.mb.Refused(w.kid)
}

// syncCounted takes what the module published for every counted window.
func (e *engine) syncCounted() {
	if e.mod == nil {
		return
	}
	for _, w := range e.mod.windows() {
		w.syncCounted()
	}
}

// moduleLoop waits for the module's publications and hands the buffers
// over: this wakes Wait and moves the windows on. While an application
// goroutine spins (Posted.Spin polls the records itself and its Release
// hands the buffer over) it neither runs nor arms the module's eventfd,
// so that no publication wakes a thread to take the CPU from the
// spinner. It arms before it looks at what was published, so that a
// publication in between still wakes it (kmod.Mailboxes.Arm).
func (e *engine) moduleLoop(ctx context.Context) {
	defer e.wg.Done()
	for {
		if !e.prog.napWhileSpinning(ctx, e.prog.modKick) {
			return
		}
		if err := e.mod.mb.Arm(); err != nil {
			if ctx.Err() == nil {
				e.fail(fmt.Errorf("rvma: arming the module's eventfd: %w", err))
			}
			return
		}
		e.syncCounted()
		if err := e.mod.mb.Wait(ctx); err != nil {
			return
		}
	}
}
