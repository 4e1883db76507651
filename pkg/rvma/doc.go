// Package rvma implements Remote Virtual Memory Access (Grant et al., IPDPS
// 2021) on real one-sided RDMA verbs: a sender puts bytes to (endpoint,
// 64-bit mailbox address, offset) and the receiver alone posts, rotates and
// retires the buffers behind the mailbox. Completion is counted in bytes or
// operations, independently of arrival order, and published through a
// per-buffer completion pointer that the application can poll or wait on.
//
// An Endpoint (Listen) is a process's presence on an RDMA device's IP
// address. As a receiver it opens windows (InitWindow) on mailbox
// addresses, posts buffers from its own registered memory (Alloc,
// Window.Post) and learns of completed buffers through Posted.Completion,
// Posted.Wait or Posted.Spin. As a sender it puts to the mailboxes of other
// endpoints by their listening address (Put, PutAsync): the link (several
// RC connections over rdma_cm) is made on first use and the sender never
// sees a buffer address or key.
//
//	ep, err := rvma.Listen(ctx, netip.MustParseAddrPort("10.77.0.1:7471"), nil)
//	w, err := ep.InitWindow(0x11FF0011, &rvma.WindowOptions{Threshold: 4096})
//	mem, err := ep.Alloc(4096)
//	p, err := w.Post(ctx, mem, nil)
//	rec, err := p.Wait(ctx) // after a peer's ep.Put(ctx, addr, 0x11FF0011, 0, data)
//
// Large puts are written by the NIC straight into the posted buffer. Where
// the rdmaplus kernel module is loaded (the default; Endpoint.Counting), a
// put is a plain RDMA WRITE to the window's mailbox key at the epoch's
// mailbox address: the module translates it into the buffer posted for
// that epoch, counts the bytes and writes the completion record, as the
// paper's NIC would, and binds nothing. Without the module a put is an
// RDMA WRITE WITH IMMEDIATE into a type 1 memory window bound over the
// buffer, and the library counts the immediates. Either way a buffer is
// closed to writes before it is handed over, so bytes arriving late for a
// completed epoch are refused and never change it (the sender gets
// ErrStale or, by default, its put is re-issued into the next epoch, up to
// 8 times).
// A sender that fills epochs alone is sent a notice only when it runs out
// of the buffers it was shown: with n buffers of one shape posted, once
// every n-2 epochs where the module counts (an entry derives every queued
// generation from its mailbox addresses), once every ShownBuffers-1 epochs
// where the library does (post ShownBuffers+1 buffers).
// Senders that fill epochs together learn of every completed epoch from a
// notice, unless the window promises each one's share
// (WindowOptions.Share, as in a halo exchange): then each moves on by its
// own count, as a lone sender does.
//
// Posted.Spin and the endpoint's goroutines hand work to each other; on a
// host with one CPU leave GOMAXPROCS at the runtime's 1 (a second P only
// lets each hand-off start a thread that preempts the spinner: the put
// ping-pong between one-vCPU guests took 747 µs at GOMAXPROCS 1 against
// 927 at 2; docs/rvma.md, "Measured findings").
//
// Get reads back bytes of a completed epoch that the receiving window
// still keeps for rewind (WindowOptions.Keep), through a read-only memory
// window the receiver binds on request and unbinds before the buffer is
// re-posted: an epoch's bytes or ErrStale, never a mixture.
// The design, the wire protocol and the reasons for them are in
// docs/rvma.md, with what is not built yet (the eager path).
//
// NewCollector exports an endpoint's and its windows' counters as
// Prometheus metrics. cmd/rvmacat is a small program built on this package
// (a receiver printing completed epochs, a sender putting its input).
//
// Conventions. Options are passed as pointers (*EndpointOptions,
// *WindowOptions, *PostOptions): nil, like a zero field, means the
// default each field states. Every call that waits, or sends on the
// network, takes a context.Context (Listen, Window.Post, Posted.Release,
// Window.IncEpoch, Posted.Wait, Posted.Spin, Endpoint.Put,
// Endpoint.PutAsync, PutOp.Wait, Endpoint.Get); a context that has already
// ended fails the call before it does anything, and one that ends while
// the call waits ends the wait. Post and Release only send (an entry
// update to the window's senders) and never wait for the network. Close
// (Endpoint.Close, Window.Close) takes none, does not wait for peers, and
// returns nil when called again. The endpoint's own timeout
// (EndpointOptions.DialTimeout) is reported as os.ErrDeadlineExceeded
// (with ErrPeerGone), never as context.DeadlineExceeded, which only the
// caller's context produces.
//
// Every error this package returns wraps one of the sentinel errors
// (ErrClosed, ErrNoBuffer, ErrTooLarge, ErrStale, ErrMailboxClosed,
// ErrNoMailbox, ErrPeerGone, ErrInvalid, ErrFailed, ErrDevice), or is the
// error of a context the caller passed (context.Canceled or
// context.DeadlineExceeded, possibly wrapped); test with errors.Is.
// Errors from the verbs layer or the kernel module are wrapped too (with
// ErrDevice where nothing more precise applies). A failed put is a
// *PutError saying where it went and which epoch, if any, it targeted.
package rvma
