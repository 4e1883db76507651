// Package verbs is a Go binding to libibverbs and librdmacm: RDMA devices,
// protection domains, memory regions and windows, completion queues, RC and
// UD queue pairs, shared receive queues, every work request kind, async
// events and rdma_cm connection management.
//
// It links dynamically against the system's libibverbs and librdmacm (a
// static binary finds no devices unless the provider is linked in too).
//
// # Object tree and the parent/child rule
//
// Objects form a tree rooted at a Context (an open device):
//
//	Context ─┬─ CompChannel ── CQ
//	         ├─ CQ ──────────── QP (as its send or receive CQ)
//	         └─ PD ─┬─ MR ───── (also a child of the Buffer it covers)
//	                ├─ MW
//	                ├─ AH
//	                ├─ SRQ ──── QP (attached to the SRQ)
//	                └─ QP
//
// Every object has Close, which is idempotent and safe to call from any
// goroutine. Closing an object first closes its live children, newest first,
// so the verbs destruction order is always respected: QPs before the CQs,
// SRQ and PD they use, MRs before their PD and before their Buffer, CQs
// before their completion channel, everything before the device. A QP is a
// child of each of its PD, CQs and SRQ, so closing any one of them closes the
// QP. Any use of a closed object returns an error wrapping ErrClosed (also
// the AH of a posted work request, or the MW and MR of a bind: the post
// holds them, so a concurrent Close waits until the provider has read
// them); a goroutine blocked in CQ.Wait, Context.WaitAsyncEvent or a CMID
// call on an object being closed returns at once with ErrClosed.
//
// # Memory
//
// The NIC must only see memory outside the Go heap. Alloc maps anonymous
// memory (mmap) and returns a Buffer whose Bytes are an ordinary []byte;
// PD.RegMR registers any sub-slice of such a buffer and refuses anything else
// with ErrInvalid. PD.AllocMR does both and unmaps the buffer when the MR is
// closed. Work requests and scatter/gather lists are built in C memory owned
// by the QP, and a chain of work requests is posted with a single cgo call.
//
// # Completions
//
// CQ.Poll fetches a batch of completions without blocking (one cgo call per
// batch). CQ.Wait blocks by parking the goroutine: the completion channel's
// descriptor is non-blocking and registered with Go's netpoller, and one
// goroutine per channel hands events to the CQ waiting for them. CQ.Spin
// busy-polls in C for the lowest latency. A failed completion is a WC whose
// Err method returns a *WCError; its Status is a WCStatus carrying the verbs
// name (IBV_WC_REM_ACCESS_ERR) and message, and errors.Is(err,
// verbs.WCRemAccessErr) works.
//
// # Queue pairs
//
// PD.NewQP creates a QP in RESET. QP.ToInit, ToRTR and ToRTS walk the state
// machine with every RoCE knob (path MTU, GID index, PSNs, timeouts, retry
// and RNR settings); QP.Connect does all three from a QPInfo the peer sent
// out of band; ToError and Reset complete the machine. On RoCE (rxe), the
// address vector needs a GRH: Context.RoCEv2GID finds the GID index for an
// IP address (index 1 is the IPv4 RoCE v2 GID on rxe).
//
// QP.PostSend validates each work request before posting and reports
// misuse as errors, never as a crash: ErrInvalid (zero-length SGE,
// misaligned or wrongly sized atomic, too many SGEs, too much inline data),
// ErrWrongState (posting before RTS), ErrQueueFull (a chain longer than
// the queue, or ENOMEM from the provider when the queue is full). A
// *PostError tells which work request of a chain failed.
//
// # Performance
//
// Every post and every poll is one cgo call, so post chains (one call for
// many work requests) and poll in batches. Posts and polls allocate nothing
// on the Go heap, and cgo makes no pointer checks on them. A loop that
// posts the same shape again and again should build it once as a SendPlan
// (QP.NewSendPlan): its Post is the cgo call and nothing else (PostSend
// validates and converts every work request each time), and its Set
// methods change an ID, immediate, remote address or flags in place. What
// is left between such a loop and the same loop in C is the cgo crossings,
// one or two per one-way trip (1.5 to 3 µs each under qemu TCG).
//
// A post that runs long in the kernel (on rxe every post does the whole
// transfer inside the system call) lets the Go runtime hand the
// goroutine's P to another thread, and the goroutine must get it back
// through the scheduler; with an idle P (GOMAXPROCS of 2 or more) that
// does not happen. A process pinned to one CPU with taskset gets
// GOMAXPROCS 1 from Go and pays the hand-off on every long post, so run
// pinned verbs loops with GOMAXPROCS=2 (or call runtime.GOMAXPROCS(2)).
// Measured on rxe, pinned: read latency 1.5 to 2.5x slower at GOMAXPROCS 1
// than at 2, and one work request per post 2.4x slower for small writes
// than one chain per post (1.2 to 1.5x unpinned); docs/benchmarks.md,
// "pkg/verbs: rdmaperf against perftest". (A program whose goroutines hand
// work to each other on one CPU may do better at 1: pkg/rvma does.)
//
// Even with an idle P, the runtime takes the P away from a goroutine that
// is inside a cgo call when it has not been through the scheduler for
// 10 ms, and its monitor thread then wakes every 20 µs for a while: on a
// one-CPU machine that cost the Go ping-pong 22 to 26 context switches per
// round trip and more than doubled its latency. CQ.Spin therefore returns to Go
// after at most 64 polls in C (tens of microseconds) and yields
// (runtime.Gosched) every YieldEvery (5 ms). Not more
// often: each runtime.Gosched also wakes a thread for an idle P, which on
// one CPU takes the CPU from the spinner. A goroutine that spins on memory
// itself (on the last byte of a buffer, as perftest's ib_write_lat does)
// should do the same with a Yielder.
//
// # Connection management
//
// Dial connects to an address in one call, and Listen and Listener.Accept
// take connections on one: each returns a Conn, a connected RC endpoint with
// its rdma_cm identifier, PD, QP in RTS and a CQ sized so that it cannot
// overrun (ExampleDial is a complete ping-pong). When the connection ends,
// whoever ends it and however (Close or Disconnect on either side, the peer's
// process killed, the device removed), the QP moves to the error state at
// once: every work request posted before completes (WCWRFlushErr), and then
// the Conn's Wait and Poll return ErrPeerGone, the io.EOF of verbs.
//
// The low-level objects stay for those who need them: NewCMID, ResolveAddr,
// ResolveRoute, NewQP and Connect on the active side; NewCMID, Listen and
// GetRequest, then NewQP and Accept (or Reject) on the passive side. Once an
// identifier is connected the package reads its events itself, acts on the
// end of the connection as above and keeps the events for WaitEvent;
// Disconnect is correct whether or not WaitEvent already returned
// CMDisconnected, and waits for the peer at most DisconnectWait. LocalAddr
// and PeerAddr tell the two ends' IP addresses and ports. A refused
// connection is a *RejectError (errors.Is(err, syscall.ECONNREFUSED); NoListener
// when nothing listens at the address).
//
// # Conventions
//
// Optional settings are *XxxOptions (CQOptions, ConnectOptions,
// ConnOptions): nil means the defaults each field documents. The
// attributes of a verbs object or a state transition are *XxxAttr
// (QPInitAttr, InitAttr, RTRAttr, RTSAttr, SRQAttr, AHAttr), mirroring
// libibverbs' structs; nil is refused where the verb has nothing to
// default to (an address, a queue's size). Close is safe to call twice,
// from any goroutine.
//
// # Contexts
//
// Every call that blocks takes a context.Context, honoured one way: a call
// whose context is already done returns the context's error before doing
// anything (a completion waiting in a CQ stays there for the next call), and
// a wait that ends because the context ended returns its error. The
// package's own bounds (DisconnectWait) are never reported as the context's
// deadline.
//
// # Errors
//
// Errors from a verb are *OpError values naming the call and wrapping its
// syscall.Errno (errors.Is(err, syscall.EINVAL) works); features the device
// lacks (on-demand paging on rxe, memory windows elsewhere) give errors
// wrapping ErrNotSupported.
package verbs
