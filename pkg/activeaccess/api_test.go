package activeaccess

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// doneContexts are a cancelled context and one past its deadline.
func doneContexts(t *testing.T) map[string]struct {
	ctx  context.Context
	want error
} {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	t.Cleanup(cancel2)
	return map[string]struct {
		ctx  context.Context
		want error
	}{
		"cancelled": {cancelled, context.Canceled},
		"expired":   {expired, context.DeadlineExceeded},
	}
}

// A call whose context is already done returns its error before doing
// anything: before checking its arguments (the invalid address would be
// ErrInvalid) and before touching the device or the module (which this
// host does not have: that would be another error).
func TestDoneContextListenDial(t *testing.T) {
	for name, c := range doneContexts(t) {
		t.Run(name, func(t *testing.T) {
			if _, err := Listen(c.ctx, netip.AddrPort{}, 0, nil); !errors.Is(err, c.want) || errors.Is(err, ErrInvalid) {
				t.Errorf("Listen: %v, want %v", err, c.want)
			}
			good := netip.MustParseAddrPort("127.0.0.1:7500")
			if _, err := Listen(c.ctx, good, 4096, &TargetOptions{Mode: ModeMediated}); !errors.Is(err, c.want) {
				t.Errorf("Listen of a valid target: %v, want %v", err, c.want)
			}
			if _, err := Dial(c.ctx, netip.AddrPort{}, &SourceOptions{Depth: -1}); !errors.Is(err, c.want) || errors.Is(err, ErrInvalid) {
				t.Errorf("Dial: %v, want %v", err, c.want)
			}
			if _, err := Dial(c.ctx, good, nil); !errors.Is(err, c.want) {
				t.Errorf("Dial of a valid address: %v, want %v", err, c.want)
			}
		})
	}
}

// The Source's calls check the context first: this Source has no
// connection, queue or memory, so any work would crash.
func TestDoneContextSource(t *testing.T) {
	s := &Source{}
	for name, c := range doneContexts(t) {
		t.Run(name, func(t *testing.T) {
			b := make([]byte, 8)
			for _, cf := range []struct {
				call string
				f    func() error
			}{
				{"put", func() error { _, err := s.Put(c.ctx, 0, b); return err }},
				{"get", func() error { _, err := s.Get(c.ctx, 0, b); return err }},
				{"plain put", func() error { _, err := s.PutPlain(c.ctx, 0, b); return err }},
				{"plain get", func() error { _, err := s.GetPlain(c.ctx, 0, b); return err }},
				{"put", func() error { return s.PutWait(c.ctx, 0, b) }},
				{"get", func() error { return s.GetWait(c.ctx, 0, b) }},
				{"flush", func() error { return s.Flush(c.ctx) }},
				{"flush plain", func() error { return s.FlushPlain(c.ctx) }},
				{"reply", func() error { _, err := s.Reply(c.ctx); return err }},
				{"wait", func() error { return (&Op{}).Wait(c.ctx) }},
			} {
				call, err := cf.call, cf.f()
				if !errors.Is(err, c.want) {
					t.Errorf("%s: %v, want %v", call, err, c.want)
				}
				if err != nil && !strings.Contains(err.Error(), "activeaccess: "+call+":") {
					t.Errorf("%s: %q does not name the call", call, err)
				}
			}
		})
	}
}

// A completed operation's Wait with a done context still reports the
// context: the rule has no exception.
func TestDoneContextCompletedOp(t *testing.T) {
	o := &Op{done: make(chan struct{})}
	close(o.done)
	if err := o.Wait(context.Background()); err != nil {
		t.Fatalf("Wait of a completed operation: %v", err)
	}
	for name, c := range doneContexts(t) {
		if err := o.Wait(c.ctx); !errors.Is(err, c.want) {
			t.Errorf("%s: Wait: %v, want %v", name, err, c.want)
		}
	}
}

// After Close, every call of a Source fails with ErrClosed and names
// itself, before it looks at its arguments; a second Close returns nil.
func TestSourceClosed(t *testing.T) {
	s := &Source{changed: make(chan struct{})}
	s.closed.Store(true)
	ctx := context.Background()
	for call, f := range map[string]func() error{
		"put":         func() error { _, err := s.Put(ctx, -1, nil); return err },
		"get":         func() error { _, err := s.Get(ctx, -1, nil); return err },
		"plain put":   func() error { _, err := s.PutPlain(ctx, 0, []byte{1}); return err },
		"plain get":   func() error { _, err := s.GetPlain(ctx, 0, []byte{1}); return err },
		"flush":       func() error { return s.Flush(ctx) },
		"flush plain": func() error { return s.FlushPlain(ctx) },
		"reply":       func() error { _, err := s.Reply(ctx); return err },
	} {
		err := f()
		if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "activeaccess: "+call+":") {
			t.Errorf("%s after Close: %v, want ErrClosed naming the call", call, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close of a closed Source: %v", err)
	}
	if !errors.Is(errPendingAtClose, ErrClosed) {
		t.Errorf("operations pending at Close fail with %v", errPendingAtClose)
	}
}

// A closed Target refuses new work with ErrClosed naming the call, and a
// second Close returns nil.
func TestTargetClosed(t *testing.T) {
	tg := &Target{closed: true, cfg: targetConfig{TargetOptions: TargetOptions{Mode: ModeTransparent}}}
	h := func(*Access) {}
	if _, err := tg.NewDomain(h, nil); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "new domain") {
		t.Errorf("NewDomain: %v", err)
	}
	if _, err := tg.Stats(); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "stats") {
		t.Errorf("Stats: %v", err)
	}
	if _, err := tg.PathMTU(); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "path MTU") {
		t.Errorf("PathMTU: %v", err)
	}
	if _, err := tg.ConnectPlain(verbs.QPInfo{QPN: 17}, nil); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "connect plain") {
		t.Errorf("ConnectPlain: %v", err)
	}
	if tg.Memory() != nil {
		t.Error("Memory after Close is not nil")
	}
	if err := tg.Close(); err != nil {
		t.Errorf("Close of a closed Target: %v", err)
	}
}

// NewDomain takes nil options as the defaults and refuses a nil handler
// and bad options before anything else.
func TestNewDomainOptions(t *testing.T) {
	tg := &Target{closed: true}
	h := func(*Access) {}
	for _, c := range []struct {
		h    Handler
		opts *DomainOptions
	}{
		{nil, nil},
		{h, &DomainOptions{Notify: 7}},
		{h, &DomainOptions{Threshold: -1}},
		{h, &DomainOptions{Interval: -1}},
		{h, &DomainOptions{PollIdle: -1}},
		{h, &DomainOptions{Adaptive: true}},
	} {
		if _, err := tg.NewDomain(c.h, c.opts); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewDomain(%v): %v, want ErrInvalid", c.opts, err)
		}
	}
	if _, err := tg.NewDomain(h, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("NewDomain with nil options: %v, want ErrClosed (valid options)", err)
	}
}

// A Domain's second Close returns nil, and its calls after Close fail
// with ErrClosed naming the call (a mediated domain whose runtime ended).
func TestDomainCloseTwice(t *testing.T) {
	tg := &Target{cfg: targetConfig{TargetOptions: TargetOptions{Mode: ModeMediated}, Size: 4 * pageSize},
		domains: map[*Domain]struct{}{}, pages: make([]pageSlot, 4)}
	d := &Domain{t: tg, sw: &swlog{kick: make(chan struct{}, 1)}, h: func(*Access) {}, stop: func() {},
		exited: make(chan struct{})}
	close(d.exited)
	tg.domains[d] = struct{}{}
	if err := d.Associate(0, pageSize, Intercept); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if tg.pages[0].d != nil {
		t.Error("Close left the domain's page associated")
	}
	if len(tg.domains) != 0 {
		t.Error("Close left the domain in its target")
	}
	for call, err := range map[string]error{
		"associate":  d.Associate(0, pageSize, Intercept),
		"dissociate": d.Dissociate(0, pageSize),
	} {
		if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "activeaccess: "+call+":") {
			t.Errorf("%s after Close: %v, want ErrClosed naming the call", call, err)
		}
	}
}

// Access.Reply to an access without a known source.
func TestReplyNoSource(t *testing.T) {
	a := &Access{}
	if err := a.Reply(1); !errors.Is(err, ErrNoSource) {
		t.Errorf("Reply: %v, want ErrNoSource", err)
	}
	c := &tconn{peer: &Peer{ID: 3}, down: true, changed: make(chan struct{})}
	a.c = c
	if err := a.Reply(1); !errors.Is(err, ErrClosed) {
		t.Errorf("Reply to a source gone: %v, want ErrClosed", err)
	}
}
