package rvma

import (
	"errors"
	"fmt"
	"slices"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Batching the binds of counted windows (docs/rvma.md, section 6).
//
// A window the kernel module counts binds a buffer's key ring (ring.go:
// ringKeys memory windows, one bind each) when the buffer is first shown
// and again once its keys are used up, and unbinds it when the buffer is
// retired. The engine keeps these binds back and posts them together, as
// one chain of work requests (verbs.QP.BindMWs: one system call on rxe),
// when a window must show senders its entry (a ring bind always: its
// buffer waits for it), when maxDeferred have gathered, when a window is
// freed, or when the progress loop idles. Other binds (windows the library
// counts, whose handover waits for the unbind; read-only windows for Get)
// are posted at once.

// maxDeferred bounds the binds kept back.
const maxDeferred = 32

// deferredBind is a bind or unbind kept back: what engine.post would have
// posted.
type deferredBind struct {
	id     uint64
	op     bindOp
	mw     *verbs.MW
	mr     *verbs.MR
	length uint64
}

// submit posts a bind or unbind, or keeps it back when it is of a counted
// window's key ring and the device takes chained binds.
func (e *engine) submit(id uint64, op bindOp, mw *verbs.MW, mr *verbs.MR, length uint64) {
	if !e.chain || op.ex != nil || op.w == nil || !op.w.st.counted { // counted never changes
		e.post(id, op, mw, mr, length)
		return
	}
	e.mu.Lock()
	if op.w.freed {
		// The module forgets a freed window once its binds are done
		// (maybeDropModuleWindow): none may wait here meanwhile.
		e.mu.Unlock()
		e.post(id, op, mw, mr, length)
		return
	}
	e.deferred = append(e.deferred, deferredBind{id: id, op: op, mw: mw, mr: mr, length: length})
	full := len(e.deferred) >= maxDeferred
	e.mu.Unlock()
	if full {
		e.postDeferred()
	}
}

// postDeferred posts the binds kept back, in the order they were
// submitted, as chains of work requests (a memory window appears at most
// once in a chain: the provider reads its current key when it is posted).
func (e *engine) postDeferred() {
	e.mu.Lock()
	ds := e.deferred
	e.deferred = nil
	for _, d := range ds {
		e.ops[d.id] = d.op
	}
	e.mu.Unlock()
	for len(ds) > 0 {
		n := 1
		for n < len(ds) && !slices.ContainsFunc(ds[:n], func(d deferredBind) bool { return d.mw == ds[n].mw }) {
			n++
		}
		e.postChain(ds[:n])
		ds = ds[n:]
	}
}

// postChain posts ds as one chain. The binds that were not posted fail
// the engine, as a failed engine.post does.
func (e *engine) postChain(ds []deferredBind) {
	binds := make([]verbs.MWBind, len(ds))
	for i, d := range ds {
		binds[i] = verbs.MWBind{MW: d.mw, MR: d.mr, Addr: d.op.b.addr, Length: d.length,
			Access: verbs.AccessRemoteWrite, ID: d.id, Flags: verbs.SendSignaled}
	}
	err := e.bindQP.BindMWs(binds)
	posted := len(ds)
	if err != nil {
		posted = 0
		var pe *verbs.PostError
		if errors.As(err, &pe) {
			posted = max(0, min(pe.Index, len(ds)))
		}
	}
	for i, d := range ds {
		d.op.key <- binds[i].RKey // 0 for one not posted
		if i < posted {
			continue
		}
		e.mu.Lock()
		delete(e.ops, d.id)
		e.mu.Unlock()
	}
	if posted < len(ds) {
		e.fail(fmt.Errorf("rvma: binds for window %v: %w", ds[posted].op.w.mailbox, err))
	}
}

// appendOnce appends w to ws unless it is nil or in ws already.
func appendOnce(ws []*Window, w *Window) []*Window {
	if w == nil || slices.Contains(ws, w) {
		return ws
	}
	return append(ws, w)
}
