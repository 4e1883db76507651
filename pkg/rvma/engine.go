package rvma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// engine is the receiving half of an endpoint on one RDMA device. It is
// made of parts that each do one job, and routes between them:
//
//   - prog (progress, engine_progress.go): the one CQ, the SRQ every
//     link's queue pairs take their receive WQEs from, and who polls the
//     CQ (the engine's loop, spinners, waiters); the engine's handle
//     routes each completion to the links, mem's binds or a window;
//   - mem (memory, engine_memory.go): the memory the application
//     allocates for buffers, the memory windows bound over posted
//     buffers and exposed for Get, and the loopback RC pair that carries
//     only binds;
//   - desc (descTable, engine_desc.go): the descriptor table senders
//     read, and the pushes of entries deferred to the next idle poll;
//   - mod (module, module.go): the kernel module's counted mailboxes,
//     nil when the library counts.
//
// Each window has a counter (counter.go), picked when it is opened: the
// library's (mem's binds and unbinds) or mod. The engine itself keeps the
// mailbox table, the linger of closed windows and the goroutines. It
// implements windowDriver.
//
// The endpoint (links to peers, the sending half) hooks in through links;
// a test without an endpoint attaches queue pairs to the SRQ itself
// (engine_lab_test.go).
//
// Lock order, outermost first (each part's type says the same of its own):
//
//	prog.pollMu            held while a batch of completions is handled;
//	                       only TryLocked by goroutines holding another
//	Window.dispatch        held while a window's actions are dispatched
//	Window.mu              the window's state; released before dispatch
//	                       goes on to anything below, except mod.mu
//	                       (records: module.get and put)
//	desc.mu (shared)       then the mailbox table's lock, the endpoint's
//	                       and the links' locks (pushEntry), desc.pushMu
//	mem.mu, mod.mu         leaves; mem.mu also guards lingering
//
// desc.pushMu is a leaf, also taken under the endpoint's mu (deferPush).
type engine struct {
	dev   *verbs.Context
	own   bool      // dev is the engine's to close
	pd    *verbs.PD // everything the engine and its endpoint create is on it
	gid   verbs.GIDEntry
	table *mailboxTable[*Window]

	// rdDepth is the RDMA READ depth links ask for in both directions and
	// the READs a Get keeps in flight: readDepth, or less if the device
	// supports less.
	rdDepth int

	prog progress  // the CQ, the SRQ and who polls them
	mem  memory    // arenas and memory windows
	desc descTable // the descriptor table and deferred pushes
	// mod is the kernel module's counted mailboxes; nil when the library
	// counts.
	mod *module

	bounce bounce // registered copies of small put sources (bounce.go)

	links linkHandler            // nil without an endpoint
	trace func(wire.Imm, uint32) // test hook: every DATA arrival, in order

	// lingering holds the closed windows whose mailbox is still reserved,
	// each with the timer that frees it (WindowOptions.Linger). It is
	// guarded by mem.mu, as mem.closed, which Close sets.
	lingering map[*Window]*time.Timer

	opts     engineOptions
	stop     context.CancelFunc
	wg       sync.WaitGroup
	failOnce sync.Once // opts.onFail is told of the first failure only
}

// engineOptions tune an engine.
type engineOptions struct {
	// Spin makes the receive and bind loops busy-poll their CQs (CQ.Spin)
	// instead of sleeping on the completion channel: lower latency for two
	// busy CPUs.
	Spin bool
	// onFail is told, on a goroutine of its own, of the first failure
	// of a bind, an unbind or a receive post (nil: nobody).
	onFail func(error)
	// counting and records: EndpointOptions.Counting and EndpointOptions.Records.
	counting Counting
	records  int
}

// linkHandler is the endpoint's side of the engine: the completions of
// work requests the links posted (their IDs carry sendTag) and the
// receives that are not data for a window.
type linkHandler interface {
	sendDone(wc verbs.WC)
	ctrl(wc verbs.WC, imm wire.Imm, msg []byte)
	notice(wc verbs.WC, viewSlot uint32)
	recvFailed(wc verbs.WC)
	late(wc verbs.WC, slot uint32, epoch uint64, stale bool) // a put wc counted late into the window in slot
	// pushEntry sends entry to the subscribers of slot: all of them, or
	// only those an earlier push could not reach; false when some could
	// not be reached now either (push again later, not all).
	pushEntry(slot uint32, entry []byte, all bool) bool
	dropSubscribers(slot uint32, entry []byte)
	subscribers(slot uint32) int
}

const (
	engineSRQDepth = 512
	engineBindWR   = 256
	engineSlots    = MaxWindows
	// recvSlot is the room a receive WQE offers an incoming SEND: a
	// control message.
	recvSlot = 64
	// sendTag marks the work request IDs of link sends, so that their
	// completions (which share the CQ with receives) are told apart even
	// when their opcode is not reliable (error completions).
	sendTag = 1 << 63
)

// newEngine sets up the receiving machinery on dev. If own, the engine
// owns dev from then on (Close closes it, also on error); otherwise dev is
// shared (rdma_cm's context, one per device and process) and the engine
// closes only what it created on it. ip selects the RoCE v2 GID (nil: the
// first IPv4 one). Errors wrap ErrNotSupported from verbs when the device
// has no memory windows.
func newEngine(dev *verbs.Context, own bool, ip net.IP, opts engineOptions) (_ *engine, err error) {
	e := &engine{dev: dev, own: own, opts: opts, table: newMailboxTable[*Window](engineSlots), prog: newProgress(opts.Spin)}
	e.mem = newMemory(e.fail)
	e.desc = descTable{fail: e.fail, pushes: map[uint32]pendingPush{}}
	defer func() {
		if err != nil {
			e.release()
		}
	}()
	attr, err := e.dev.QueryDevice()
	if err != nil {
		return nil, err
	}
	if !attr.HasMemoryWindows() {
		return nil, fmt.Errorf("rvma: device %s: %w", e.dev.Name(), verbs.ErrNotSupported)
	}
	e.rdDepth = max(1, min(readDepth, attr.MaxQPRdAtom, attr.MaxQPInitRdAtom))
	if e.gid, err = e.dev.RoCEv2GID(1, ip); err != nil {
		return nil, err
	}
	if e.pd, err = e.dev.AllocPD(); err != nil {
		return nil, err
	}
	e.mem.pd = e.pd
	if e.prog.ch, err = e.dev.NewCompChannel(); err != nil {
		return nil, err
	}
	if e.prog.cq, err = e.dev.NewCQ(2*engineBindWR+4*engineSRQDepth, &verbs.CQOptions{Channel: e.prog.ch}); err != nil {
		return nil, err
	}
	mk := func() (*verbs.QP, error) {
		return e.pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: e.prog.cq, RecvCQ: e.prog.cq,
			Cap: verbs.QPCap{MaxSendWR: engineBindWR, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	}
	if e.mem.bindQP, err = mk(); err != nil {
		return nil, err
	}
	if e.mem.bindPeer, err = mk(); err != nil {
		return nil, err
	}
	a := verbs.QPInfo{QPN: e.mem.bindQP.QPN(), PSN: 1, GID: e.gid.GID}
	b := verbs.QPInfo{QPN: e.mem.bindPeer.QPN(), PSN: 2, GID: e.gid.GID}
	copts := &verbs.ConnectOptions{GIDIndex: e.gid.Index}
	if err = e.mem.bindQP.Connect(a, b, copts); err != nil {
		return nil, err
	}
	if err = e.mem.bindPeer.Connect(b, a, copts); err != nil {
		return nil, err
	}
	if e.prog.srq, err = e.pd.NewSRQ(&verbs.SRQAttr{MaxWR: engineSRQDepth, MaxSGE: 1}); err != nil {
		return nil, err
	}
	if e.prog.recvMR, err = e.pd.AllocMR(engineSRQDepth*recvSlot, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	wrs := make([]verbs.RecvWR, engineSRQDepth)
	for i := range wrs {
		wrs[i] = e.prog.recvWR(uint64(i))
	}
	if err = e.prog.srq.PostRecv(wrs...); err != nil {
		return nil, err
	}
	if e.desc.mr, err = e.pd.AllocMR(engineSlots*wire.EntrySize, verbs.AccessLocalWrite|verbs.AccessRemoteRead); err != nil {
		return nil, err
	}
	if opts.counting != CountLibrary {
		records := opts.records
		if records == 0 {
			records = DefaultRecords
		}
		if e.mod, err = openModule(records, &e.mem, e.fail); err != nil {
			if opts.counting == CountModule {
				return nil, fmt.Errorf("rvma: counting in the kernel module: %w", err)
			}
			e.mod, err = nil, nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.stop = cancel
	e.wg.Add(1)
	go e.progressLoop(ctx)
	if e.mod != nil {
		e.wg.Add(1)
		go e.moduleLoop(ctx)
	}
	return e, nil
}

// Close stops the goroutines and closes the device with everything on it.
// Unbinds still outstanding are reported done (the device that could
// write the buffers is gone), so no waiter hangs. It is idempotent.
func (e *engine) Close() error {
	e.mem.mu.Lock()
	if e.mem.closed {
		e.mem.mu.Unlock()
		return nil
	}
	e.mem.closed = true
	for w, t := range e.lingering {
		t.Stop()
		delete(e.lingering, w)
	}
	e.mem.mu.Unlock()
	e.stop() // the loops wait with this context
	e.wg.Wait()
	e.desc.close()
	e.bounce.close()
	err := e.release()
	e.mem.abandon()
	return err
}

// release closes the device if the engine owns it, else everything the
// engine created on it: the PD (with the MRs, windows, QPs and SRQ under
// it), the CQ and its channel.
func (e *engine) release() error {
	var errs []error
	if e.mod != nil {
		errs = append(errs, e.mod.close())
	}
	if e.own {
		return errors.Join(append(errs, e.dev.Close())...)
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Close())
	}
	if e.prog.cq != nil {
		errs = append(errs, e.prog.cq.Close())
	}
	if e.prog.ch != nil {
		errs = append(errs, e.prog.ch.Close())
	}
	return errors.Join(errs...)
}

// alloc returns n bytes of registered memory that windows accept as
// buffers (memory.alloc).
func (e *engine) alloc(n int) ([]byte, error) { return e.mem.alloc(n, e.mod) }

func (e *engine) addrOf(mem []byte) (uint64, error) {
	if e.mem.arenaOf(heapAddr(mem), uint64(len(mem))) == nil {
		return 0, invalidf("buffer memory was not allocated by the endpoint")
	}
	return heapAddr(mem), nil
}

// initWindow opens a window on mailbox mb. A closed window still
// lingering on mb is freed first.
func (e *engine) initWindow(mb Mailbox, opts WindowOptions) (*Window, error) {
	if opts.Counting == CountModule && e.mod == nil {
		return nil, invalidf("the window asks for CountModule, but the library counts this endpoint's puts (EndpointOptions.Counting, or no kernel module)")
	}
	if _, _, old, ok := e.table.Lookup(mb); ok && old != nil {
		old.mu.Lock()
		closed := old.st.closed()
		old.mu.Unlock()
		if closed {
			e.free(old)
		}
	}
	slot, inc, err := e.table.Add(mb, nil)
	if err != nil {
		return nil, err
	}
	w, err := newWindow(mb, slot, inc, opts, e)
	if err == nil {
		err = w.ctr.open(w)
	}
	if err != nil {
		e.table.Free(slot, inc)
		return nil, err
	}
	e.table.mu.Lock()
	e.table.slots[slot].val = w
	e.table.mu.Unlock()
	w.flush() // publish the empty entry
	return w, nil
}

func (e *engine) hide(w *Window, b *buffer) { e.mem.hide(w, b) }

// fail tells onFail of the engine's first failure; a window whose bind
// or unbind failed would otherwise wait for it for good.
func (e *engine) fail(err error) {
	e.failOnce.Do(func() {
		if e.opts.onFail != nil {
			go e.opts.onFail(err)
		}
	})
}

// windowClosed starts the linger of a window that was just closed: its mailbox
// stays reserved, so that late senders learn it closed, until
// WindowOptions.Linger has passed; then free releases it.
func (e *engine) windowClosed(w *Window) {
	d := w.st.opts.Linger // options do not change after InitWindow
	e.mem.mu.Lock()
	defer e.mem.mu.Unlock()
	if e.mem.closed {
		return // everything goes with the engine
	}
	if e.lingering == nil {
		e.lingering = map[*Window]*time.Timer{}
	}
	e.lingering[w] = time.AfterFunc(max(d, 0), func() { e.free(w) })
}

// free ends a closed window's linger: the window's subscribers get its
// last entry (StateGone, so they resolve the mailbox again), its slot is
// freed (a later InitWindow may take the mailbox), and memory windows
// still bound over its buffers (GuardNone hands buffers over bound) are
// unbound and return to the pool; a counted window is forgotten in the
// module. It does nothing for a window not lingering, or once the engine
// is closed.
func (e *engine) free(w *Window) {
	w.dispatch.Lock()
	defer w.dispatch.Unlock()
	e.mem.mu.Lock()
	t, ok := e.lingering[w]
	delete(e.lingering, w)
	done := e.mem.closed
	e.mem.mu.Unlock()
	if !ok || done {
		return
	}
	t.Stop()
	w.mu.Lock()
	w.st.seq += 2
	en := w.st.entry(w.incarnation) // closed: no descriptors
	en.State = wire.StateGone
	bufs := w.st.buffers()
	w.mu.Unlock()
	// under the table's lock, as every entry write: a Close racing this
	// free may be releasing the table
	e.desc.mu.RLock()
	if !e.desc.gone {
		if mem := e.desc.write(w.slot, &en); mem != nil && e.links != nil {
			e.links.dropSubscribers(w.slot, mem)
		}
	}
	e.desc.mu.RUnlock()
	e.table.Free(w.slot, w.incarnation)
	e.mem.retire(w, bufs)
	w.ctr.drop(w)
}

// appendOnce appends w to ws unless it is nil or in ws already.
func appendOnce(ws []*Window, w *Window) []*Window {
	if w == nil || slices.Contains(ws, w) {
		return ws
	}
	return append(ws, w)
}

// heapAddr is the address of a slice's first byte (for drivers that hand
// out Go or mmap memory alike).
func heapAddr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }
