package dht

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht/internal/layout"
)

// doneContexts are a cancelled context and one past its deadline.
func doneContexts(t *testing.T) []struct {
	ctx  context.Context
	want error
} {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	t.Cleanup(cancel2)
	return []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}}
}

// A call whose context is already done returns its error before doing
// anything: before checking its arguments (these are invalid) and before
// touching a device (this host has none: that would be another error).
func TestDoneContextServeDial(t *testing.T) {
	good := netip.MustParseAddrPort("127.0.0.1:7700")
	for _, c := range doneContexts(t) {
		for _, k := range []Kind{KindAA, KindRMA, KindAM, "nonsense"} {
			if tg, err := Serve(c.ctx, k, netip.AddrPort{}, Layout{}, &TargetOptions{Notify: 7}); !errors.Is(err, c.want) || errors.Is(err, ErrInvalid) || tg != nil {
				t.Errorf("Serve %s: %v, want %v", k, err, c.want)
			}
			if tb, err := Dial(c.ctx, k, netip.AddrPort{}, nil); !errors.Is(err, c.want) || errors.Is(err, ErrInvalid) || tb != nil {
				t.Errorf("Dial %s: %v, want %v", k, err, c.want)
			}
		}
		l := Layout{Buckets: 16, Heap: 16}
		if _, err := ServeAA(c.ctx, good, l, nil); !errors.Is(err, c.want) {
			t.Errorf("ServeAA: %v, want %v", err, c.want)
		}
		if _, err := ServeRMA(c.ctx, good, l); !errors.Is(err, c.want) {
			t.Errorf("ServeRMA: %v, want %v", err, c.want)
		}
		if _, err := ServeAM(c.ctx, good, l, nil); !errors.Is(err, c.want) {
			t.Errorf("ServeAM: %v, want %v", err, c.want)
		}
		if _, err := DialAA(c.ctx, good, &SourceOptions{Name: "x"}); !errors.Is(err, c.want) {
			t.Errorf("DialAA: %v, want %v", err, c.want)
		}
		if _, err := DialRMA(c.ctx, good); !errors.Is(err, c.want) {
			t.Errorf("DialRMA: %v, want %v", err, c.want)
		}
		if _, err := DialAM(c.ctx, good); !errors.Is(err, c.want) {
			t.Errorf("DialAM: %v, want %v", err, c.want)
		}
	}
}

// An unknown kind is ErrInvalid, and no typed nil hides in the interface.
func TestUnknownKind(t *testing.T) {
	ctx := context.Background()
	if tg, err := Serve(ctx, "nonsense", netip.AddrPort{}, Layout{Buckets: 1}, nil); !errors.Is(err, ErrInvalid) || tg != nil {
		t.Errorf("Serve: %v, %v", tg, err)
	}
	if tb, err := Dial(ctx, "nonsense", netip.AddrPort{}, nil); !errors.Is(err, ErrInvalid) || tb != nil {
		t.Errorf("Dial: %v, %v", tb, err)
	}
	if tb, err := Dial(ctx, KindRMA, netip.AddrPort{}, nil); err == nil || tb != nil {
		t.Errorf("Dial of an invalid address: %v (a nil Table), %v", tb, err)
	}
}

// tables are tables without connections: any work but checking the
// context would crash, or (AA) fail with another error.
func tables() map[string]Table {
	return map[string]Table{
		"aa":  &AATable{l: Layout{Buckets: 1}, g: layout.Layout{Buckets: 1}},
		"rma": &RMATable{},
		"am":  &AMTable{},
	}
}

// The tables' calls check the context first, before the key, and name
// themselves.
func TestDoneContextTable(t *testing.T) {
	for _, c := range doneContexts(t) {
		for name, tb := range tables() {
			for _, key := range []uint32{0, 5} {
				for call, f := range map[string]func() error{
					"insert": func() error { return tb.Insert(c.ctx, key, 1) },
					"delete": func() error { return tb.Delete(c.ctx, key) },
					"lookup": func() error { _, _, err := tb.Lookup(c.ctx, key); return err },
					"flush":  func() error { return tb.Flush(c.ctx) },
				} {
					err := f()
					if !errors.Is(err, c.want) || errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "dht: "+call+":") {
						t.Errorf("%s %s of key %d: %v, want %v naming the call", name, call, key, err, c.want)
					}
				}
			}
		}
	}
}

// After Close, the RMA and AM tables' calls fail with ErrClosed naming
// the call, and a second Close returns nil. (The AA table's are those of
// activeaccess.Source, which its own tests cover.)
func TestTableClosed(t *testing.T) {
	ctx := context.Background()
	for name, tb := range map[string]Table{"rma": &RMATable{closed: true}, "am": &AMTable{closed: true}} {
		for call, f := range map[string]func() error{
			"insert": func() error { return tb.Insert(ctx, 5, 1) },
			"delete": func() error { return tb.Delete(ctx, 5) },
			"lookup": func() error { _, _, err := tb.Lookup(ctx, 5); return err },
			"flush":  func() error { return tb.Flush(ctx) },
		} {
			if err := f(); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "dht: "+call+":") {
				t.Errorf("%s %s after Close: %v", name, call, err)
			}
		}
		if err := tb.Close(); err != nil {
			t.Errorf("%s: second Close: %v", name, err)
		}
	}
}

// Flush's report names the call and wraps both sentinels.
func TestFlushErr(t *testing.T) {
	if err := flushErr(0, 0); err != nil {
		t.Fatal(err)
	}
	err := flushErr(4, 2)
	if !errors.Is(err, ErrFull) || !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "dht: flush:") || !strings.Contains(err.Error(), "4 inserts") {
		t.Fatalf("flushErr: %v", err)
	}
}

// The accept's own time limit is reported as ErrDisconnected, never as
// a context's deadline.
func TestAcceptTimeoutErr(t *testing.T) {
	if !errors.Is(errAcceptTimeout, ErrDisconnected) || errors.Is(errAcceptTimeout, context.DeadlineExceeded) {
		t.Fatalf("errAcceptTimeout: %v", errAcceptTimeout)
	}
}
