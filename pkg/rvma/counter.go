package rvma

// counter counts a window's puts: the library or the kernel module
// (docs/rvma.md, section 6). The engine picks one per window when it is
// opened (engine.counting), and it does not change; it replaces the
// library-or-module fork of every window operation outside the state
// machine (windowState.counted, which chooses the actions, is set from
// the same choice).
type counter interface {
	// carryOut carries out the counting actions flush took from the
	// window's state, under its dispatch lock: the library binds and
	// unbinds memory windows, the module registers and ends generations.
	// A window's state leaves only its own counter's kind of actions.
	carryOut(w *Window, a countActions)
	// sync takes what the module published for the window
	// (Window.syncCounted); where the library counts, there is nothing
	// to take: arrivals reach the window from the progress loop
	// (engine.recvDone counts the immediates).
	sync(w *Window)
	// refusedPackets is how many write packets the module refused for
	// the window (0 where the library counts).
	refusedPackets(w *Window) uint64
	// open sets the counter's side of a window up before it is
	// published (engine.initWindow); drop forgets it once its mailbox is
	// freed (engine.free).
	open(w *Window) error
	drop(w *Window)
}

// countActions are the actions of a window's state that its counter
// carries out (counter.carryOut).
type countActions struct {
	bind     []bindAction // the library's
	unbind   []*buffer    // the library's
	register []regAction  // the module's, in generation order
	end      []endAction  // the module's
}

func (a *countActions) empty() bool {
	return len(a.bind) == 0 && len(a.unbind) == 0 && len(a.register) == 0 && len(a.end) == 0
}

// counting implements windowDriver: the module counts a window (with its
// records, in memory it writes) when it is open, the window has the
// default guard and does not ask for CountLibrary; the library counts
// the others, with a slab of records of the window's own.
func (e *engine) counting(opts WindowOptions) (counter, completionSource, bool) {
	if e.mod != nil && opts.Guard == GuardInvalidate && opts.Counting != CountLibrary {
		return e.mod, e.mod, true
	}
	return libraryCounter{&e.mem}, newCompletionSlab(opts.MaxPosted + opts.Keep + 64), false
}

// libraryCounter is the counter of the windows the library counts: a put
// is a WRITE WITH IMMEDIATE into a memory window bound over its buffer,
// counted when its completion is polled (engine.recvDone). Its actions are
// the binds and unbinds of those memory windows.
type libraryCounter struct{ mem *memory }

func (c libraryCounter) carryOut(w *Window, a countActions) {
	for _, b := range a.bind {
		c.mem.bind(w, b.b, b.from)
	}
	for _, b := range a.unbind {
		c.mem.unbind(w, b)
	}
}

func (libraryCounter) sync(*Window)                  {}
func (libraryCounter) refusedPackets(*Window) uint64 { return 0 }
func (libraryCounter) open(*Window) error            { return nil }
func (libraryCounter) drop(*Window)                  {}
