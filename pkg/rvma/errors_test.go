package rvma

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

func TestNackErr(t *testing.T) {
	want := map[wire.NackReason]error{wire.NackNoMailbox: ErrNoMailbox, wire.NackClosed: ErrMailboxClosed,
		wire.NackStale: ErrStale, wire.NackTooLarge: ErrTooLarge, wire.NackNoBuffer: ErrNoBuffer}
	for r, e := range want {
		if err := nackErr(r); !errors.Is(err, e) {
			t.Fatalf("reason %d: %v, want %v", r, err, e)
		}
	}
	if !errors.Is(nackErr(0), ErrInvalid) {
		t.Fatal("unknown reason")
	}
}

func TestWireErr(t *testing.T) {
	_, err := wire.AppendCtrl(nil, wire.Ctrl{Type: 0})
	if err = wireErr(err); !errors.Is(err, ErrInvalid) || !errors.Is(err, wire.ErrInvalid) {
		t.Fatal(err)
	}
}

func TestSentinelOr(t *testing.T) {
	raw := errors.New("verbs: ENOMEM")
	if err := sentinelOr(ErrDevice, raw); !errors.Is(err, ErrDevice) || !errors.Is(err, raw) {
		t.Fatal(err)
	}
	for _, err := range []error{nil, ErrStale, fmt.Errorf("x: %w", context.Canceled), context.DeadlineExceeded} {
		if got := sentinelOr(ErrDevice, err); got != err {
			t.Fatalf("%v became %v", err, got)
		}
	}
}

func TestDialErr(t *testing.T) {
	ep := &Endpoint{opts: EndpointOptions{DialTimeout: time.Millisecond}}
	ep.ctx, ep.cancel = context.WithCancel(context.Background())
	ctx, cancel := ep.dialContext()
	defer cancel()
	<-ctx.Done()
	err := errPeer(netip.MustParseAddrPort("10.0.0.1:1"), dialErr(ctx, ctx.Err()))
	if !errors.Is(err, ErrPeerGone) || !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial timeout: %v", err)
	}
	ctx2, cancel2 := ep.dialContext()
	defer cancel2()
	ep.cancel()
	<-ctx2.Done()
	if err := dialErr(ctx2, ctx2.Err()); !errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled) {
		t.Fatalf("closing: %v", err)
	}
}

func TestPutErrorEpoch(t *testing.T) {
	e := &PutError{Dest: "10.0.0.1:1", Mailbox: 5, Err: ErrNoMailbox}
	if s := e.Error(); !strings.Contains(s, "no epoch chosen") {
		t.Fatal(s)
	}
	e.Epoch, e.HasEpoch = 0, true
	if s := e.Error(); !strings.Contains(s, "epoch 0") || !errors.Is(e, ErrNoMailbox) {
		t.Fatal(s)
	}
}
