package dht

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
)

// Table is a source's handle on one target's volume; AATable, RMATable
// and AMTable implement it. Insert and Delete may return before the
// target applied them (AA, AM); Flush waits until it did and reports
// what failed (ErrFull, ErrRejected). Lookups see what was applied.
//
// Every call but Layout and Close takes a context and honours it as
// pkg/activeaccess does: a call whose context is already done returns
// the context's error, wrapped, and sends nothing; one whose context ends
// while it waits returns the context's error. After Close the calls fail
// with an error that wraps ErrClosed and names the call ("dht: insert:
// dht: closed"); a second Close returns nil.
type Table interface {
	Insert(ctx context.Context, key, value uint32) error
	Delete(ctx context.Context, key uint32) error
	Lookup(ctx context.Context, key uint32) (value uint32, found bool, err error)
	Flush(ctx context.Context) error
	Layout() Layout
	Close() error
}

// Target is a table's target; AATarget, RMATarget and AMTarget
// implement it. Close disconnects every source and frees the volume
// (a second Close returns nil); Err reports failures while serving.
type Target interface {
	Volume() *Volume
	Err() error
	Close() error
}

// Kind names a table design.
type Kind string

// The three designs.
const (
	KindAA  Kind = "aa"  // Active Access: inserts as active puts, a handler at the target
	KindRMA Kind = "rma" // RMA only: remote atomics and puts (Listing 2)
	KindAM  Kind = "am"  // active messages: SENDs and a handler at the target
)

// TargetOptions tune Serve, ServeAA and ServeAM; each uses the fields of
// its design and ignores the others. A nil *TargetOptions, like the zero
// value, means a transparent AA target with an event-driven handler woken
// every 10 entries or 1 ms, and an event-driven AM target. Values out of
// range make Serve fail with ErrInvalid (AM) or activeaccess.ErrInvalid
// (AA).
type TargetOptions struct {
	// Mode (KindAA): activeaccess.ModeTransparent (0 means it: the
	// kernel module intercepts the sources' RDMA WRITEs) or
	// activeaccess.ModeMediated.
	Mode activeaccess.Mode
	// Notify (KindAA, KindAM): the handler's driver, activeaccess.Event
	// (the default: eventfd, or the AM target's completion channel) or
	// activeaccess.Poll (spinning: one CPU).
	Notify activeaccess.Notification
	// Threshold and Interval (KindAA, Event): the runtime wakes after
	// Threshold log entries or, while fewer arrived, every Interval
	// (activeaccess.DomainOptions); both 0 mean 10 and 1 ms (the paper's
	// AA-Int: an interrupt every 10 inserts).
	Threshold int
	Interval  time.Duration
	// LogSize and MaxSources (KindAA): the access log's size and the
	// sources that share it (activeaccess.TargetOptions); 0 means
	// activeaccess's defaults.
	LogSize    int
	MaxSources int
}

// SourceOptions tune Dial and DialAA. A nil *SourceOptions, like the
// zero value, means no name.
type SourceOptions struct {
	// Name (KindAA) identifies the source to the target's handlers
	// (activeaccess.SourceOptions.Name); at most 40 bytes.
	Name string
}

// Serve lays a volume of layout l out and starts a target of kind k that
// accepts sources on addr (a specific IP address of an RDMA device, and a
// port). opts may be nil (see TargetOptions). ctx bounds the set-up only:
// once Serve returned, the target serves until Close. Errors wrap ctx's
// error (at once when ctx is already done), ErrInvalid for an unknown
// kind, else those of ServeAA, ServeRMA or ServeAM.
func Serve(ctx context.Context, k Kind, addr netip.AddrPort, l Layout, opts *TargetOptions) (Target, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dht: serve: %w", err)
	}
	var t Target
	var err error
	switch k {
	case KindAA:
		t, err = ServeAA(ctx, addr, l, opts)
	case KindRMA:
		t, err = ServeRMA(ctx, addr, l)
	case KindAM:
		t, err = ServeAM(ctx, addr, l, opts)
	default:
		err = fmt.Errorf("dht: serve: %w: table kind %q (aa, rma or am)", ErrInvalid, k)
	}
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return t, nil
}

// Dial connects a source of kind k to the target at addr. opts may be nil
// (see SourceOptions). ctx bounds the connection set-up only. Errors wrap
// ctx's error (at once when ctx is already done), ErrInvalid for an
// unknown kind, else those of DialAA, DialRMA or DialAM.
func Dial(ctx context.Context, k Kind, addr netip.AddrPort, opts *SourceOptions) (Table, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dht: dial: %w", err)
	}
	var t Table
	var err error
	switch k {
	case KindAA:
		t, err = DialAA(ctx, addr, opts)
	case KindRMA:
		t, err = DialRMA(ctx, addr)
	case KindAM:
		t, err = DialAM(ctx, addr)
	default:
		err = fmt.Errorf("dht: dial: %w: table kind %q (aa, rma or am)", ErrInvalid, k)
	}
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return t, nil
}

// callErr names the call in an error of a table's state (closed, broken)
// or of the caller's context.
func callErr(call string, err error) error {
	return fmt.Errorf("dht: %s: %w", call, err)
}

var (
	_ Table  = (*AATable)(nil)
	_ Table  = (*RMATable)(nil)
	_ Table  = (*AMTable)(nil)
	_ Target = (*AATarget)(nil)
	_ Target = (*RMATarget)(nil)
	_ Target = (*AMTarget)(nil)
)
