package rvma

import (
	"context"
	"fmt"
	"runtime"
)

// Posted is a buffer posted to a window. It keeps its identity when the
// window re-posts it after Release: Wait and Load then refer to its new
// epoch.
type Posted struct {
	w   *Window
	b   *buffer
	mem []byte
}

// Post adds mem to the tail of the window's buffer queue (the paper's
// RVMA_Post_buffer), with opts (nil: the defaults of PostOptions). mem
// must lie in memory the endpoint allocated (Alloc), which the NIC may
// write. Post may send the window's new entry to its senders, but never
// waits for the network; a ctx that has ended fails it before it does
// anything. Errors wrap ErrClosed (the window is closed), ErrInvalid
// (memory not from the endpoint, empty, too many buffers posted, every
// completion record in use), ErrTooLarge (a byte threshold beyond the
// buffer) or ctx's error.
func (w *Window) Post(ctx context.Context, mem []byte, opts *PostOptions) (*Posted, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("post to window %v: %w", w.mailbox, err)
	}
	var po PostOptions
	if opts != nil {
		po = *opts
	}
	if len(mem) == 0 {
		return nil, fmt.Errorf("post to window %v: %w", w.mailbox, invalidf("empty buffer"))
	}
	addr, err := w.drv.addrOf(mem)
	if err != nil {
		return nil, fmt.Errorf("post to window %v: %w", w.mailbox, err)
	}
	w.mu.Lock()
	comp := w.comps.get()
	if comp == nil {
		w.mu.Unlock()
		return nil, fmt.Errorf("post to window %v: %w", w.mailbox,
			invalidf("every completion record of the endpoint is in use (EndpointOptions.Records)"))
	}
	b, err := w.st.post(addr, uint64(len(mem)), po, comp)
	if err != nil {
		w.comps.put(comp)
		w.mu.Unlock()
		return nil, fmt.Errorf("post to window %v: %w", w.mailbox, err)
	}
	w.mu.Unlock()
	w.flush()
	return &Posted{w: w, b: b, mem: mem}, nil
}

// Bytes returns the posted memory.
func (p *Posted) Bytes() []byte { return p.mem }

// Completion returns the buffer's completion pointer.
func (p *Posted) Completion() *Completion { return p.b.comp }

// Epoch returns the epoch the buffer is posted for (or held).
func (p *Posted) Epoch() uint64 {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	return p.b.gen
}

// Load returns the buffer's record and true once its current epoch was
// handed over; false while it is still posted.
func (p *Posted) Load() (Record, bool) {
	p.w.mu.Lock()
	armed, gen := p.b.armedSeq, p.b.gen
	p.w.mu.Unlock()
	r, seq, ok := p.w.comps.load(p.b.comp)
	if !ok || !isOwnRecord(r, seq, armed, gen) {
		return Record{}, false
	}
	return r, true
}

// Wait parks the goroutine until the buffer's current epoch is handed over
// (the paper's Monitor/MWait on the completion pointer) and returns its
// record; on a buffer the application released, it waits for the buffer's
// next epoch. Errors: ctx's error (also when ctx had ended before the
// call, whatever the buffer's state); ErrClosed (with the record of what
// arrived) when the window closed before the epoch completed; ErrFailed
// (with the record) when the endpoint failed first; ErrInvalid for a
// released one-time buffer, which has no next epoch.
func (p *Posted) Wait(ctx context.Context) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, fmt.Errorf("wait on window %v: %w", p.w.mailbox, err)
	}
	return p.wait(ctx)
}

// wait is Wait without the first look at ctx.
func (p *Posted) wait(ctx context.Context) (Record, error) {
	p.w.syncCounted()
	p.w.mu.Lock()
	done := p.b.done
	p.w.mu.Unlock()
	if err := await(ctx, p.w.drv, done); err != nil {
		return Record{}, fmt.Errorf("wait on window %v: %w", p.w.mailbox, err)
	}
	p.w.mu.Lock()
	r, retired := p.b.rec, p.b.retired
	p.w.mu.Unlock()
	if retired {
		if p.b.oneTime {
			return r, fmt.Errorf("wait on window %v: one-time buffer released: %w", p.w.mailbox, ErrInvalid)
		}
		return r, fmt.Errorf("wait on window %v: %w", p.w.mailbox, ErrClosed)
	}
	if r.Flags&FlagFailed != 0 {
		return r, fmt.Errorf("wait on window %v: %w", p.w.mailbox, ErrFailed)
	}
	if r.Flags&FlagClosed != 0 {
		return r, fmt.Errorf("wait on window %v: %w", p.w.mailbox, ErrClosed)
	}
	return r, nil
}

// Spin busy-waits for the buffer's current epoch like Wait, but runs the
// endpoint's progress step on the calling goroutine meanwhile, so the
// arrival that completes the epoch, the unbind and the publication happen
// without any goroutine hand-off: the lowest latency, for one CPU. Errors
// as for Wait.
//
// While goroutines spin, and for 2 ms after, the endpoint's own progress
// goroutine stays parked and is not woken when a spin ends; its naps grow
// to 16 ms while spins follow each other. The blocking calls (Wait,
// IncEpoch, Put, PutOp.Wait) wake it at once; what nobody blocks on (a
// PutOp's Done channel in a select, a completion pointer read directly)
// may wait until its next look, at most 16 ms after the last spin ended.
// At GOMAXPROCS 1 a spinning goroutine also leaves the goroutines of the
// process that wait on file descriptors (sockets; rdma_cm events, such as
// a link's stripe being dialled again) to the Go runtime's background
// network poll, which comes every 10 ms: spin where nothing else in the
// process needs prompt I/O meanwhile, or use Wait.
func (p *Posted) Spin(ctx context.Context) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, fmt.Errorf("wait on window %v: %w", p.w.mailbox, err)
	}
	p.w.mu.Lock()
	done := p.b.done
	st := p.b.state
	fast := p.w.st.counted && (st == bufQueued || st == bufCompleting)
	armed, gen := p.b.armedSeq, p.b.gen
	p.w.mu.Unlock()
	if fast {
		r, got, err := p.spinRecord(ctx, armed, gen)
		if got || err != nil {
			return r, err
		}
		return p.wait(ctx) // the window closed, or the endpoint failed or closed
	}
	if err := spin(ctx, p.w.drv, done); err != nil {
		return Record{}, fmt.Errorf("wait on window %v: %w", p.w.mailbox, err)
	}
	return p.wait(ctx)
}

// spinRecord is Spin on a counted window: it polls the completion record,
// which the module writes, like an RDMA program polling the last byte of
// a WRITE. Between polls it runs the endpoint's progress step now and then
// (put completions, views, binds), as spin does, so that the progress loop
// stays parked and no second thread takes the CPU from it. The buffer is
// handed over in Release, or by the endpoint's module loop once nobody
// spins. It returns false when the epoch did not complete (the window
// closed, the endpoint failed or closed): Wait, no longer spinning, tells
// how it ended.
func (p *Posted) spinRecord(ctx context.Context, armed, gen uint64) (Record, bool, error) {
	c := p.b.comp
	ps := p.w.drv
	ps.spinBegin()
	defer ps.spinEnd()
	oneP := runtime.GOMAXPROCS(0) == 1
	for n := 1; ; n++ {
		r, seq, ok := p.w.comps.load(c)
		if !ok {
			return Record{}, false, nil
		}
		if isOwnRecord(r, seq, armed, gen) {
			if r.Flags&FlagClosed == 0 {
				return r, true, nil
			}
			p.w.syncCounted()
			return Record{}, false, nil
		}
		if n%16 != 0 {
			continue
		}
		if ps.pollOnce() {
			continue
		}
		if err := spinIdle(ctx, ps, n, oneP); err != nil {
			return Record{}, false, fmt.Errorf("wait on window %v: %w", p.w.mailbox, err)
		}
	}
}

// Release gives the buffer back to the window once the application is
// done with its epoch. A reusable buffer is re-posted at the tail of the
// queue when it has also left the rewind ring; a one-time buffer is not,
// nor any buffer of a closed window (a Wait on it returns ErrClosed).
// Like Post, Release may send the window's new entry to its senders but
// never waits for the network; a ctx that has ended fails it before it
// does anything (the buffer stays held). Errors wrap ErrInvalid when the
// buffer is not held by the application (still posted, or already
// released), or ctx's error.
func (p *Posted) Release(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("release on window %v: %w", p.w.mailbox, err)
	}
	p.w.syncCounted() // Spin may have seen the record before the endpoint did
	p.w.mu.Lock()
	err := p.w.st.release(p.b)
	if err == nil && p.b.oneTime {
		// A one-time buffer's completion slot serves another buffer later;
		// its last record stays readable until then.
		p.w.comps.put(p.b.comp)
	}
	p.w.mu.Unlock()
	if err != nil {
		return fmt.Errorf("release on window %v: %w", p.w.mailbox, err)
	}
	p.w.flush()
	// The bind that re-posting may have issued completes within its post
	// on rxe: handling it now pushes the entry to the senders before the
	// application goes back to spinning, where a counted window's spin
	// would poll the CQ only every 16th round.
	p.w.drv.pollOnce()
	return nil
}
