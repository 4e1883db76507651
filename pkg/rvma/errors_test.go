package rvma

import (
	"errors"
	"testing"

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
