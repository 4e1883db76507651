package dht

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
)

// Table is a source's handle on one target's volume; AATable, RMATable
// and AMTable implement it. Insert and Delete may return before the
// target applied them (AA, AM); Flush waits until it did and reports
// what failed (ErrFull, ErrRejected). Lookups see what was applied.
type Table interface {
	Insert(ctx context.Context, key, value uint32) error
	Delete(ctx context.Context, key uint32) error
	Lookup(ctx context.Context, key uint32) (value uint32, found bool, err error)
	Flush(ctx context.Context) error
	Layout() Layout
	Close() error
}

// Target is a table's target; AATarget, RMATarget and AMTarget
// implement it.
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

// Config configures Serve.
type Config struct {
	Kind   Kind
	Layout Layout
	// Mode (KindAA): transparent or library-mediated.
	Mode activeaccess.Mode
	// Notify (KindAA, KindAM): the handler's driver, Event or Poll.
	Notify activeaccess.Notification
	// LogSize, MaxSources (KindAA): the access log and credit shares.
	LogSize, MaxSources int
}

// Serve starts a target of cfg.Kind on addr. Errors: ErrInvalid for an
// unknown kind, else those of ServeAA, ServeRMA or ServeAM.
func Serve(addr netip.AddrPort, cfg Config) (Target, error) {
	switch cfg.Kind {
	case KindAA:
		return ServeAA(addr, AAConfig{Layout: cfg.Layout, Mode: cfg.Mode, Notify: cfg.Notify, LogSize: cfg.LogSize, MaxSources: cfg.MaxSources})
	case KindRMA:
		return ServeRMA(addr, cfg.Layout)
	case KindAM:
		return ServeAM(addr, AMConfig{Layout: cfg.Layout, Notify: cfg.Notify})
	}
	return nil, fmt.Errorf("%w: table kind %q (aa, rma or am)", ErrInvalid, cfg.Kind)
}

// Dial connects a source of kind k to the target at addr (name: the
// AA source's name, for the target's handlers). Errors as for DialAA,
// DialRMA or DialAM, or ErrInvalid for an unknown kind.
func Dial(ctx context.Context, k Kind, addr netip.AddrPort, name string) (Table, error) {
	switch k {
	case KindAA:
		return DialAA(ctx, addr, name)
	case KindRMA:
		return DialRMA(ctx, addr)
	case KindAM:
		return DialAM(ctx, addr)
	}
	return nil, fmt.Errorf("%w: table kind %q (aa, rma or am)", ErrInvalid, k)
}

var (
	_ Table  = (*AATable)(nil)
	_ Table  = (*RMATable)(nil)
	_ Table  = (*AMTable)(nil)
	_ Target = (*AATarget)(nil)
	_ Target = (*RMATarget)(nil)
	_ Target = (*AMTarget)(nil)
)
