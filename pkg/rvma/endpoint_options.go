package rvma

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
)

// EndpointOptions configure an endpoint (Listen); nil or a zero field means the default stated with the field.
type EndpointOptions struct {
	// Stripes is the number of RC connections of each link this endpoint
	// dials (1 if 0, at most MaxStripes). Puts are spread over them
	// round-robin, so with more than one they can arrive in another order
	// than they were issued; counting does not depend on the order.
	Stripes int
	// DialTimeout bounds connecting a link, and replacing one of its
	// stripes (10 s if 0). A dial that takes longer fails the puts and
	// Gets waiting for it with an error wrapping ErrPeerGone and
	// os.ErrDeadlineExceeded, never context.DeadlineExceeded, which only
	// a caller's own context produces.
	DialTimeout time.Duration
	// NoRetryStale makes a put refused as stale fail with ErrStale instead
	// of being re-issued on the window's next epoch. Without it a put is
	// issued at most 8 times: senders that together offer an epoch more
	// than its threshold race for it, and one that keeps losing (a slower
	// one, when another fills each epoch alone) gets ErrStale after that.
	NoRetryStale bool
	// Spin makes the progress loop busy-poll the completion queue instead
	// of sleeping on its channel: lower latency, one CPU kept busy.
	Spin bool
	// OnLate, if set, is called for each receiver's report that puts from
	// this endpoint arrived late (see LateReport; EndpointStats.LatePuts
	// counts them either way). The puts themselves have already completed
	// without error. OnLate runs on the endpoint's completion goroutine:
	// it must return quickly and must not call the endpoint.
	OnLate func(LateReport)
	// Counting says who counts puts into this endpoint's windows (CountAuto:
	// the rdmaplus kernel module when it is loaded, see docs/rvma.md,
	// section 6). Windows with GuardNone are always counted by the library.
	Counting Counting
	// Records is the number of completion records (64 bytes each) the
	// module writes for this endpoint: one per buffer posted to a counted
	// window and not released (DefaultRecords if 0).
	Records int
}

func (o EndpointOptions) normalize() (EndpointOptions, error) {
	if o.Stripes == 0 {
		o.Stripes = 1
	}
	if o.Stripes < 0 || o.Stripes > MaxStripes {
		return o, invalidf("%d stripes (1..%d)", o.Stripes, MaxStripes)
	}
	if o.Counting > CountModule {
		return o, invalidf("counting %d", o.Counting)
	}
	if o.Records < 0 || o.Records > kmod.MaxRecords {
		return o, invalidf("%d completion records (0..%d)", o.Records, kmod.MaxRecords)
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	return o, nil
}

// MaxStripes bounds EndpointOptions.Stripes.
const MaxStripes = 16

// Counting says who counts the puts of an endpoint's windows.
type Counting uint8

// Countings.
const (
	// CountAuto lets the rdmaplus kernel module count when it is loaded
	// and supports counted mailboxes, and the library otherwise.
	CountAuto Counting = 0
	// CountLibrary counts in the library, from the receive completions of
	// RDMA WRITE WITH IMMEDIATE (docs/rvma.md, section 6).
	CountLibrary Counting = 1
	// CountModule makes the kernel module count as the NIC of the paper
	// does: puts are plain RDMA WRITEs, each packet is counted as it is
	// placed, the module closes a buffer at its threshold and writes its
	// completion record. Listen fails when the module cannot.
	CountModule Counting = 2
)

// String names the counting: auto, library or module.
func (c Counting) String() string {
	switch c {
	case CountAuto:
		return "auto"
	case CountLibrary:
		return "library"
	case CountModule:
		return "module"
	}
	return fmt.Sprintf("Counting(%d)", uint8(c))
}

// DefaultRecords is the number of completion records an endpoint whose
// windows the module counts allocates (EndpointOptions.Records): 64 bytes each.
const DefaultRecords = 8192

// LateReport is a receiver's report that puts from this endpoint landed
// after their epoch had ended but before it was handed over: another
// sender's puts reached the threshold first (several senders sharing an
// epoch without dividing its threshold between them), the receiver ended
// the epoch (IncEpoch) while they were in flight, or this sender counted
// its puts differently from the receiver. Their bytes are in the epoch's buffer and
// in its record's length (the record carries FlagLate), so no data was
// lost; the report says the senders overshot. With Stale the epoch had
// already been handed over when the receiver counted the puts, and its
// record does not count them: a GuardNone window lets a put land then,
// and when the library counts, a put placed just before its epoch's
// unbind can have its completion taken after the hand-over (docs/rvma.md,
// section 4). The bytes may have changed a buffer the application holds.
//
// Late puts of one epoch that the receiver could not report at once (its
// control sends were backed up) arrive as one report.
type LateReport struct {
	Peer    netip.AddrPort // the receiving endpoint
	Mailbox Mailbox
	Epoch   uint64 // the epoch the puts were counted into
	Puts    int    // how many
	Bytes   uint64 // their length in total
	Stale   bool
}
