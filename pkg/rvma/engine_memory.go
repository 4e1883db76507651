package rvma

import (
	"fmt"
	"sync"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// memory is the engine's registered memory and the memory windows over
// it: the arenas Alloc hands out (with the module, each with a guarded
// second registration, the placement), the pool of free type 1 memory
// windows, the windows bound over posted buffers of windows the library
// counts, the read-only windows exposed for Get (endpoint_get.go), and
// the loopback RC pair that carries only binds. A bind's completion comes
// on the engine's CQ; the progress loop hands it back (bindDone).
//
// Lock order: a window's dispatch lock, then mu (binds, unbinds and hides
// are dispatched under it). mu is a leaf: nothing else is locked while it
// is held. It also guards the engine's lingering, and closed is the
// engine's (engine.Close): one mutex, so that no linger starts and no
// Get is exposed once Close set it.
type memory struct {
	pd               *verbs.PD // the engine's
	bindQP, bindPeer *verbs.QP
	fail             func(error) // engine.fail

	mu     sync.Mutex
	arenas []*verbs.MR
	// placement: with the module, each arena's second registration, with
	// remote write and guarded (kmod.Mailboxes.Guard): the module
	// translates puts to a counted window's mailbox key into it, and
	// lets nothing else in.
	placement map[*verbs.MR]*verbs.MR
	mws       map[*verbs.MR][]*verbs.MW // free type 1 windows, by the MR they were last bound over
	bound     map[*buffer]*verbs.MW     // windows bound over posted buffers
	// exposed holds the read-only windows over kept buffers that Get
	// reads through (endpoint_get.go).
	exposed map[*buffer]*exposure
	ops     map[uint64]bindOp // bind work request id -> what it was
	nextID  uint64
	closed  bool // the engine closed (engine.Close)
}

func newMemory(fail func(error)) memory {
	return memory{fail: fail, bound: map[*buffer]*verbs.MW{}, exposed: map[*buffer]*exposure{}, mws: map[*verbs.MR][]*verbs.MW{},
		ops: map[uint64]bindOp{}}
}

type bindOp struct {
	w      *Window
	b      *buffer
	from   *buffer // the buffer whose window this bind took over (its key is now invalid)
	unbind bool
	retire bool // an unbind after the window was freed: the window is not told
	// ex is set for the binds and unbinds of a read-only window for Get.
	ex *exposure
	// key receives the rkey QP.BindMW returned. The bind loop must take
	// the key from here, not from MW.RKey(): on rxe the bind executes in
	// the ibv_bind_mw call itself, so its completion can be polled before
	// BindMW has returned and recorded the new key (reading MW.RKey() at
	// completion published the previous key, which rxe then refused).
	key chan uint32
}

// alloc returns n bytes of registered memory that windows accept as
// buffers. The region grants no remote access itself: peers reach a
// posted buffer only through the memory window bound to it (which needs
// local write and MW binding on the region), never through the region's
// own rkey, which is not sent anywhere. With the module, the memory is
// registered a second time with remote write, for the module's
// translation of mailbox keys alone: the module guards that registration,
// refusing every write it did not translate. mod is the engine's module,
// nil when the library counts.
func (m *memory) alloc(n int, mod *module) ([]byte, error) {
	mr, err := m.pd.AllocMR(n, verbs.AccessLocalWrite|verbs.AccessMWBind)
	if err != nil {
		return nil, err
	}
	var pm *verbs.MR
	if mod != nil {
		if pm, err = m.pd.RegMR(mr.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err == nil {
			if err = mod.mb.Guard(pm.LKey()); err != nil {
				pm.Close()
			}
		}
		if err != nil {
			mr.Close()
			return nil, fmt.Errorf("registering %d bytes for mailbox keys: %w", n, err)
		}
	}
	m.addArena(mr, pm)
	return mr.Bytes(), nil
}

// addArena records an arena Alloc handed out and, with the module, its
// guarded registration pm (nil without).
func (m *memory) addArena(mr, pm *verbs.MR) {
	m.mu.Lock()
	m.arenas = append(m.arenas, mr)
	if pm != nil {
		if m.placement == nil {
			m.placement = map[*verbs.MR]*verbs.MR{}
		}
		m.placement[mr] = pm
	}
	m.mu.Unlock()
}

// arenaOf returns the endpoint's arena (Alloc) holding [a, a+n), or nil.
func (m *memory) arenaOf(a, n uint64) *verbs.MR {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.arenaLocked(a, n)
}

// placementOf returns the guarded registration (placement) of the arena
// holding [a, a+n), which the module translates mailbox-key writes into;
// nil if there is none.
func (m *memory) placementOf(a, n uint64) *verbs.MR {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.placement[m.arenaLocked(a, n)]
}

// arenaLocked is arenaOf with m.mu held.
func (m *memory) arenaLocked(a, n uint64) *verbs.MR {
	for _, mr := range m.arenas {
		if a >= mr.Addr() && a+n <= mr.Addr()+uint64(mr.Len()) {
			return mr
		}
	}
	return nil
}

// post binds mw over length bytes of op's buffer (0: unbinds it) with
// remote write access, or remote read for a Get's window.
func (m *memory) post(id uint64, op bindOp, mw *verbs.MW, mr *verbs.MR, length uint64) {
	m.mu.Lock()
	m.ops[id] = op
	m.mu.Unlock()
	access := verbs.AccessRemoteWrite
	if op.ex != nil {
		access = verbs.AccessRemoteRead
	}
	key, err := m.bindQP.BindMW(mw, mr, op.b.addr, length, access, id, verbs.SendSignaled)
	op.key <- key // the completion may already be in the bind loop, waiting for it
	if err != nil {
		m.mu.Lock()
		delete(m.ops, id)
		m.mu.Unlock()
		err = fmt.Errorf("rvma: bind for window %v: %w", op.w.mailbox, err)
		if op.ex != nil && !op.unbind {
			m.exposeFailed(op, err)
			return
		}
		m.fail(err)
	}
}

// bind binds a memory window over b, for a window the library counts:
// from's (see bindAction) or, with from nil, b's own, a free one or a new
// one. It is asynchronous: the completion (bindDone) reports it to the
// window (Window.noteBound, and noteUnbound for from), from the progress
// loop or a goroutine that runs its step.
func (m *memory) bind(w *Window, b, from *buffer) {
	mr := m.arenaOf(b.addr, b.cap)
	m.mu.Lock()
	// The window to use: from's, lent to b; b's own, still bound from its
	// last epoch (GuardNone hands buffers over without unbinding); or a
	// free one.
	mw := m.bound[b]
	if from != nil {
		if fmw := m.bound[from]; fmw != nil {
			delete(m.bound, from)
			if mw != nil {
				m.mws[mr] = append(m.mws[mr], mw) // cannot happen: a bound buffer is not re-bound
			}
			mw = fmw
		}
	}
	if mw == nil {
		if n := len(m.mws[mr]); n > 0 {
			mw = m.mws[mr][n-1]
			m.mws[mr] = m.mws[mr][:n-1]
		}
	}
	m.nextID++
	id := m.nextID
	m.mu.Unlock()
	if mw == nil {
		var err error
		if mw, err = m.pd.AllocMW(verbs.MWType1); err != nil {
			m.fail(fmt.Errorf("rvma: memory window for window %v: %w", w.mailbox, err))
			return
		}
	}
	m.mu.Lock()
	m.bound[b] = mw
	m.mu.Unlock()
	m.post(id, bindOp{w: w, b: b, from: from, key: make(chan uint32, 1)}, mw, mr, b.cap)
}

// unbind unbinds the memory window over b; its completion, or a goroutine
// of its own if none is bound, reports it (Window.unbound).
func (m *memory) unbind(w *Window, b *buffer) {
	if !m.postUnbind(w, b, false) {
		go w.unbound(b) // never bound
	}
}

// postUnbind posts the unbind of the memory window bound over b (retire:
// the window is not told when it completes) and reports whether there was
// one.
func (m *memory) postUnbind(w *Window, b *buffer, retire bool) bool {
	mr := m.arenaOf(b.addr, b.cap)
	m.mu.Lock()
	mw := m.bound[b]
	m.nextID++
	id := m.nextID
	m.mu.Unlock()
	if mw == nil {
		return false
	}
	m.post(id, bindOp{w: w, b: b, unbind: true, retire: retire, key: make(chan uint32, 1)}, mw, mr, 0)
	return true
}

// retire hides bufs, the buffers of a freed window, from Get and unbinds
// the memory windows still bound over them (GuardNone hands buffers over
// bound), which return to the pool; the window is not told. Buffers with
// a bind or unbind in flight are left to it. The caller holds w's
// dispatch lock.
func (m *memory) retire(w *Window, bufs []*buffer) {
	m.mu.Lock()
	busy := make(map[*buffer]bool, len(m.ops))
	for _, op := range m.ops {
		busy[op.b] = true
	}
	m.mu.Unlock()
	for _, b := range bufs {
		m.hide(w, b)
		if !busy[b] {
			m.postUnbind(w, b, true)
		}
	}
}

func (m *memory) bindsPending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ops) > 0
}

// bindDone takes a bind or unbind completion into its window's state and
// returns the window, which the caller flushes once the whole batch of
// completions is in: a window with several binds completed is flushed
// once.
func (m *memory) bindDone(wc verbs.WC) *Window {
	m.mu.Lock()
	op, ok := m.ops[wc.ID]
	delete(m.ops, wc.ID)
	m.mu.Unlock()
	if !ok {
		return nil
	}
	if err := wc.Err(); err != nil {
		err = fmt.Errorf("rvma: bind on window %v: %w", op.w.mailbox, err)
		if op.ex != nil && !op.unbind {
			m.exposeFailed(op, err)
			return op.w
		}
		m.fail(err)
		return op.w
	}
	if op.ex != nil {
		m.exposeDone(op)
		return op.w
	}
	if op.unbind {
		mr := m.arenaOf(op.b.addr, op.b.cap)
		m.mu.Lock()
		if mw := m.bound[op.b]; mw != nil {
			delete(m.bound, op.b)
			m.mws[mr] = append(m.mws[mr], mw)
		}
		m.mu.Unlock()
		if !op.retire {
			op.w.noteUnbound(op.b)
		}
		return op.w
	}
	key := <-op.key
	if op.from != nil {
		op.w.noteUnbound(op.from)
	}
	op.w.noteBound(op.b, wire.Desc{Addr: op.b.addr, RKey: key})
	return op.w
}

// abandon ends the binds and unbinds still outstanding once the device is
// gone (engine.Close): the Gets waiting for a read-only window fail with
// ErrClosed, and unbinds are reported done (the device that could write
// the buffers is gone), so no waiter hangs.
func (m *memory) abandon() {
	m.mu.Lock()
	ops := m.ops
	m.ops = map[uint64]bindOp{}
	m.mu.Unlock()
	for _, op := range ops {
		switch {
		case op.ex != nil:
			if !op.unbind {
				m.settle(op.ex, wire.Desc{}, fmt.Errorf("rvma: endpoint closed: %w", ErrClosed))
			}
		case op.unbind && !op.retire:
			op.w.unbound(op.b)
		}
	}
}
