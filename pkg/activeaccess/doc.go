// Package activeaccess is the programming model of Active Access (Besta
// and Hoefler, ICS'15, Listing 1) on RDMA: remote puts and gets that
// touch designated pages of a target process become active, and a
// handler in the target processes them from an access log.
//
// # Target
//
// A process that exposes memory calls Listen with the address sources
// will connect to and the size of the memory. The Target registers that
// many bytes with the NIC (outside the Go heap; Target.Memory is the
// process's view of them) and accepts sources in the background.
// Target.NewDomain creates a Domain: an access log in the kernel module
// (the paper's IUID) and a Handler. Domain.Associate gives page ranges of the memory the paper's
// control bits (Actions: W, R, WL, WLD, RL, RLD; Intercept and Count are
// common sets) and the domain's handler (the paper's assoc_page). From
// then on every remote write and read of those pages is steered by the
// bits and, when a logging bit is set, reaches the handler as an Access:
// its kind, offset, length, data (with WLD or RLD), the log's sequence
// number and the source (Peer) it came from. The runtime runs each
// domain's handler on its own goroutine, one access at a time, in log
// order, either woken by the module through an eventfd (Event, the
// paper's AA-Int) or polling the log (Poll, AA-Poll), chosen per domain.
// A handler may answer the source with Access.Reply, a 64-bit value the
// source reads with Source.Reply (the paper's replies, for consistency
// schemes the application builds).
//
// # Source
//
// A process that accesses a target calls Dial with the target's address.
// The target's memory description (address, key, size) and the source's
// credits arrive over the connection; the application handles no keys.
// Put and Get start active accesses at an offset of the target's memory
// and return an *Op (Wait, Done, Err); PutWait and GetWait block. Data is
// staged through the source's own registered memory, so the caller's
// slices are ordinary Go memory. Flush (the paper's active flush)
// returns once every active access issued before it completed and was
// processed by the target's handlers; the replies those handlers sent are
// then queued at the source. PutPlain and GetPlain are plain RMA, with
// their own FlushPlain that waits only for their completion; the two
// flushes are independent, as in the paper.
//
// # Modes
//
// The target chooses the mode (TargetOptions.Mode) and announces it when a
// source connects; the same source code works with both. In the
// transparent mode (ModeTransparent) sources issue plain RDMA WRITE and
// READ, and the target's rdmaplus kernel module (pkg/kmod,
// docs/activeaccess.md) makes them active: any RDMA peer that holds the
// key is intercepted, even one that does not use this package. The
// library-mediated mode (ModeMediated) is for NICs the module cannot hook:
// each source writes its active accesses into its own inbox at the target
// with RDMA WRITE_WITH_IMM, within its credits, and the target's runtime
// applies the pages' actions in software (memory writes, reads served or
// zeroed, logging), in the order the source issued them.
//
// # Credits: no access is lost
//
// A log has a fixed size, and the module refuses a write that does not
// fit (the writer's work request fails, its connection breaks). So every
// source receives a grant of log bytes when it connects (the log less
// room for one padding entry, shared equally among TargetOptions.MaxSources
// sources) and spends, per active access, the most log bytes it can take
// (Source.Cost: one entry per packet and page, with its data). It sends
// markers behind its accesses; the target acknowledges a marker once its
// handlers processed everything logged before the marker arrived, which
// returns the credits spent before it. A source that runs out waits in
// Put or Get. Sources that use this package therefore never fill a log,
// and the module never refuses them; a departed source's share is handed
// to a new one only after its entries were processed. In ModeMediated the
// credits are the bytes of the source's inbox, returned the same way.
//
// # What can go wrong
//
//   - The target closes, its process dies, or the network fails: every
//     pending and later operation of the Source fails with
//     ErrDisconnected (a refused access with ErrRefused, which also breaks
//     the connection). Nothing waits forever on a dead target: its host's
//     kernel ends the connection, and if the whole host vanishes the
//     keep-alive probes of a waiting Flush, Reply or Put fail once the
//     transport gives up (SourceOptions.KeepAlive and AckTimeout: about
//     15 s by default). With KeepAlive negative only the context bounds
//     such a wait.
//   - Plain RMA, or another RDMA peer, that writes to logging pages uses
//     log space no credit reserved: the module may refuse it, or an
//     access of a credit-respecting source after it. Aim plain accesses at
//     pages without logging bits. In ModeMediated plain accesses bypass
//     the actions altogether (W=0 and R=0 do not stop them).
//   - In ModeMediated a put's memory effect happens when the target's
//     runtime applies it (visible after Flush, not at the Op's
//     completion), the handler sees accesses per page rather than per
//     packet, and an active get is at most 256 KiB (larger ones fail with
//     ErrTooLarge).
//   - The handler sees the module's entries: an access larger than the
//     path MTU, or crossing a page boundary, arrives as several Accesses.
//     An RDMA READ that the source's NIC retransmits is served and logged
//     again, so a handler can see a logged get twice (writes are never
//     logged twice); and a retransmitted READ spends log space no credit
//     reserved.
//   - A handler that blocks stalls its domain and every Flush of a source
//     that accessed it; Target.Close waits for it.
//   - Local stores to Target.Memory are not seen by the module.
//   - Target.Memory must not be used after Target.Close (it is unmapped).
//
// # Conventions
//
// Options are passed as a pointer to an XxxOptions struct (TargetOptions,
// DomainOptions, SourceOptions, PlainOptions); nil, like the zero value,
// means the documented defaults. What a call cannot do without (the
// memory's size, the handler) is an argument of its own.
//
// Every call that blocks or talks to the peer takes a context.Context
// (Listen, Dial, Put, Get and their Plain and Wait forms, Op.Wait, Flush,
// FlushPlain, Reply), and honours it the same way: a call whose context
// is already done returns the context's error, wrapped, without doing
// anything (Put issues no access, Flush sends no marker); a wait that ends
// because the context ended returns the context's error, and what was
// issued before goes on; the package's own time limits (a source's
// connection set-up at the target, the disconnect in Close) are never
// reported as context.DeadlineExceeded. A context only bounds its call:
// cancelling the one given to Listen or Dial later does not end the
// Target or Source. Calls that only change local state (NewDomain,
// Associate, ConnectPlain) take none.
//
// Close ends an object and releases its resources; it takes no context:
// Target.Close and Domain.Close wait for running handlers to return, and
// Source.Close waits at most 5 s for the target to answer its
// disconnect. A second Close returns nil. After Close, calls that can
// fail return an error wrapping ErrClosed that names the call
// ("activeaccess: flush: activeaccess: closed").
//
// Errors wrap the sentinels of this package (ErrClosed, ErrInvalid,
// ErrRange, ErrTooLarge, ErrDisconnected, ErrRefused, ErrRejected,
// ErrProtocol, ErrNoSource), context errors, or errors of pkg/verbs and
// pkg/kmod; test them with errors.Is (a refused connection is a
// *RejectError, for errors.As).
package activeaccess
