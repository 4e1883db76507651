package rvma

import (
	"fmt"
	"time"
)

// CloseMode says what senders see when they put to a closed window.
type CloseMode uint8

// Close modes (the paper: operations on a closed mailbox are discarded and
// "may result in a NACK"; NACKs may be disabled against denial of service).
const (
	// CloseNack makes puts to the closed window fail at the sender with
	// an error wrapping ErrMailboxClosed.
	CloseNack CloseMode = 0
	// CloseSilent makes puts to the closed window succeed at the sender
	// while their bytes go nowhere; the receiver still counts them
	// (WindowStats.Drops).
	CloseSilent CloseMode = 1
)

// Guard selects how a window keeps late bytes out of buffers already handed
// to the application.
type Guard uint8

// Guards.
const (
	// GuardInvalidate closes a buffer to writes before its completion is
	// published (the kernel module closes it when it counts the window,
	// the library unbinds its memory window otherwise), so every later
	// write to it is refused (the sender's put fails with ErrStale). The
	// default.
	GuardInvalidate Guard = 0
	// GuardNone publishes completions without unbinding first: late
	// writes are counted (WindowStats.Stale) but not prevented. For measuring
	// the price of the guarantee only.
	GuardNone Guard = 1
)

// EpochKind says whether a window's threshold counts bytes or operations.
type EpochKind uint8

// Epoch kinds (the paper's EPOCH_BYTES and EPOCH_OPS).
const (
	EpochBytes EpochKind = 1
	EpochOps   EpochKind = 2
)

// String names the kind.
func (k EpochKind) String() string {
	switch k {
	case EpochBytes:
		return "bytes"
	case EpochOps:
		return "ops"
	}
	return fmt.Sprintf("EpochKind(%d)", uint8(k))
}

// ShownBuffers is how many of a window's posted buffers a sender is shown
// at a time where the library counts the window: the head and the six
// after it (where the kernel module counts, a sender is shown every buffer
// posted). A sender that fills epochs alone is sent a notice only when it
// is down to the last buffer it was shown, so with ShownBuffers+1 buffers
// posted (the application holding one) it is sent one notice per
// ShownBuffers-1 epochs; with fewer, one per epoch.
const ShownBuffers = 7

// DefaultMaxPosted is the default limit on buffers posted to one window and
// not yet completed.
const DefaultMaxPosted = 1024

// WindowOptions configure a window (the paper's RVMA_Init_window); nil or
// a zero field means the default stated with the field.
type WindowOptions struct {
	// Kind says whether Threshold counts bytes (EpochBytes, the default)
	// or puts (EpochOps).
	Kind EpochKind
	// Threshold completes an epoch when the bytes or puts counted for its
	// buffer reach it. For EpochBytes, 0 means the buffer's length; for
	// EpochOps it must be at least 1. A buffer may override it
	// (PostOptions.Threshold).
	Threshold uint64
	// Share promises that every sender puts exactly Share bytes
	// (EpochBytes) or puts (EpochOps) into every epoch, as in a halo
	// exchange where each neighbour sends one face per step. A sender
	// then moves to the next epoch as soon as it has put its share, by
	// its own count, as a window's only sender does, and the receiver
	// tells senders of completed epochs only when they run short of
	// buffers (about one notice per ShownBuffers-1 epochs instead of one per
	// epoch and sender; docs/rvma.md, section 5). 0 (the default) makes
	// no promise: with several senders, each learns of every completed
	// epoch from the receiver. Breaking the promise loses nothing but
	// costs time: a sender that puts less than its share into an epoch
	// the others complete has its next put to it refused (ErrStale, or
	// retried into the next epoch unless EndpointOptions.NoRetryStale; one
	// refusal, and one stripe replaced, for each epoch it fell behind
	// since its entry was last pushed, at most ShownBuffers-1), and one
	// put carrying more than a share may complete an epoch early, so that
	// another sender's share is refused the same way. InitWindow fails
	// with ErrInvalid for a Share above a non-zero Threshold.
	Share uint64
	// Keep is the rewind depth: the records of the last Keep epochs stay
	// available to Rewind, and their buffers are not re-posted.
	Keep int
	// CloseMode says what senders see after Close (CloseNack by default).
	CloseMode CloseMode
	// Guard selects the late-write protection (GuardInvalidate by default).
	Guard Guard
	// Counting chooses who counts this window's puts: CountAuto (the
	// default) follows the endpoint (Endpoint.Counting); CountLibrary
	// makes the library count it even where the kernel module counts the
	// endpoint's other windows; CountModule requires the module (InitWindow
	// fails with ErrInvalid on an endpoint that counts in the library, or
	// with GuardNone, which the module cannot honour: it always closes a
	// completed buffer).
	Counting Counting
	// MaxPosted limits the buffers posted and not yet completed
	// (DefaultMaxPosted if 0).
	MaxPosted int
	// Linger is how long the mailbox stays reserved after Close, so that
	// late senders get ErrMailboxClosed (or a counted silent drop) rather
	// than ErrNoMailbox: DefaultLinger if 0, none if negative. InitWindow
	// on the same mailbox ends it at once.
	Linger time.Duration
}

// DefaultLinger is how long a closed window's mailbox stays reserved when
// WindowOptions.Linger is 0.
const DefaultLinger = time.Minute

func (o WindowOptions) normalize() (WindowOptions, error) {
	if o.Kind == 0 {
		o.Kind = EpochBytes
	}
	if o.Kind != EpochBytes && o.Kind != EpochOps {
		return o, invalidf("epoch kind %d", o.Kind)
	}
	if o.Kind == EpochOps && o.Threshold == 0 {
		return o, invalidf("an ops window needs a threshold of at least 1")
	}
	if o.Threshold > 0 && o.Share > o.Threshold {
		return o, invalidf("share %d above the threshold %d", o.Share, o.Threshold)
	}
	if o.Keep < 0 {
		return o, invalidf("negative rewind depth %d", o.Keep)
	}
	if o.CloseMode > CloseSilent {
		return o, invalidf("close mode %d", o.CloseMode)
	}
	if o.Guard > GuardNone {
		return o, invalidf("guard %d", o.Guard)
	}
	if o.Counting > CountModule {
		return o, invalidf("counting %d", o.Counting)
	}
	if o.Counting == CountModule && o.Guard == GuardNone {
		return o, invalidf("a window the kernel module counts cannot have GuardNone: the module closes every completed buffer")
	}
	if o.MaxPosted < 0 {
		return o, invalidf("negative MaxPosted %d", o.MaxPosted)
	}
	if o.MaxPosted == 0 {
		o.MaxPosted = DefaultMaxPosted
	}
	if o.Linger == 0 {
		o.Linger = DefaultLinger
	}
	return o, nil
}

// PostOptions configure one posted buffer (the paper's RVMA_Post_buffer);
// nil means a reusable buffer with the window's threshold.
type PostOptions struct {
	// OneTime buffers are used for one epoch and never re-posted: after
	// their epoch they belong to the application for good.
	OneTime bool
	// Threshold overrides the window's threshold for this buffer's epoch
	// (0: the window's). For byte windows it must not exceed the buffer.
	Threshold uint64
}
