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
// every counted window of the engine, and the module's window ids.
type module struct {
	dev *kmod.Device
	mb  *kmod.Mailboxes

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
func openModule(records int) (*module, error) {
	dev, err := kmod.Open()
	if err != nil {
		return nil, err
	}
	mb, err := dev.Mailboxes(engineSlots, records)
	if err != nil {
		dev.Close()
		return nil, err
	}
	return &module{dev: dev, mb: mb, records: records, wins: map[uint32]*Window{}}, nil
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

// completions implements windowDriver: the module's records for a window
// it counts (the default guard, with the module open, unless the window
// asks for CountLibrary), a slab of the window's own otherwise.
func (e *engine) completions(opts WindowOptions) (completionSource, bool) {
	if e.mod != nil && opts.Guard == GuardInvalidate && opts.Counting != CountLibrary {
		return e.mod, true
	}
	return newCompletionSlab(opts.MaxPosted + opts.Keep + 64), false
}

// moduleWindow creates the module's side of a counted window.
func (e *engine) moduleWindow(w *Window) error {
	kind := kmod.CountBytes
	if w.st.opts.Kind == EpochOps {
		kind = kmod.CountOps
	}
	id, key, err := e.mod.mb.CreateMailboxWindow(kind)
	if err != nil {
		return fmt.Errorf("window %v: %w", w.mailbox, err)
	}
	w.kid = id
	w.st.mbkey = key
	e.mod.mu.Lock()
	e.mod.wins[id] = w
	e.mod.mu.Unlock()
	return nil
}

// dropModuleWindow forgets a counted window in the module: its mailbox
// key is refused from then on, and its buffers are no longer counted.
func (e *engine) dropModuleWindow(w *Window) {
	if e.mod == nil || w.kid == 0 {
		return
	}
	e.mod.mu.Lock()
	delete(e.mod.wins, w.kid)
	e.mod.mu.Unlock()
	if err := e.mod.mb.DestroyWindow(w.kid); err != nil {
		e.fail(fmt.Errorf("rvma: window %v: %w", w.mailbox, err))
	}
}

// register implements windowDriver: one system call for the lot
// (kmod.Mailboxes.PostMany).
func (e *engine) register(w *Window, as []regAction) {
	ps := make([]kmod.MailboxPost, len(as))
	for i, a := range as {
		mr := e.mem.placementOf(a.b.addr, a.b.cap)
		if mr == nil { // cannot happen: alloc guards every arena when the module counts
			e.fail(fmt.Errorf("rvma: buffer at %#x of window %v is in no guarded registration", a.b.addr, w.mailbox))
			return
		}
		ps[i] = kmod.MailboxPost{Key: mr.LKey(), IOVA: a.b.addr, Length: a.b.cap,
			Threshold: a.threshold, Gen: a.gen, Record: e.mod.index(a.b.comp), OneTime: a.b.oneTime}
	}
	if n, err := e.mod.mb.PostMany(w.kid, ps); err != nil {
		e.fail(fmt.Errorf("rvma: registering buffer %d of %d (epoch %d) of window %v with the module: %w",
			n+1, len(ps), as[min(n, len(as)-1)].gen, w.mailbox, err))
	}
}

// end implements windowDriver. A generation the module published already
// (its threshold was reached just before) is not an error.
func (e *engine) end(w *Window, a endAction) {
	var f kmod.RecordFlags
	if a.flags&FlagPartial != 0 {
		f |= kmod.RecordPartial
	}
	if a.flags&FlagClosed != 0 {
		f |= kmod.RecordClosed
	}
	err := e.mod.mb.End(w.kid, a.gen, f, false)
	if err != nil && !errors.Is(err, kmod.ErrNotFound) {
		e.fail(fmt.Errorf("rvma: ending epoch %d of window %v in the module: %w", a.gen, w.mailbox, err))
	}
}

// published implements windowDriver.
func (e *engine) published(w *Window) uint64 {
	if w.kid == 0 {
		return 0
	}
	return e.mod.mb.Done(w.kid)
}

// refusedPackets implements windowDriver.
func (e *engine) refusedPackets(w *Window) uint64 {
	if w.kid == 0 {
		return 0
	}
	return e.mod.mb.Refused(w.kid)
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
