//go:build lab

package kmod_test

import (
	"errors"
	"testing"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
)

// Without rdma_rxe (suite aa-lifecycle unloads it first) the module still
// loads and answers, with its hooked services off: the version flags are
// clear, and what needs the hooks fails with ErrNotSupported rather than
// misbehaving. (Not a TestLab* test: aa-kmod runs those with rxe loaded.)
func TestWithoutRxe(t *testing.T) {
	d, err := kmod.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if v := d.Version(); v.ActiveAccess || v.Mailboxes || v.ABI != kmod.ABIVersion {
		t.Fatalf("version without rxe: %+v", v)
	}
	dm, err := d.NewDomain(kmod.MinLogSize)
	if err != nil {
		t.Fatalf("a domain (needs no hook): %v", err)
	}
	if err := dm.Arm(0x100, 0, kmod.PageSize, kmod.W|kmod.WL); !errors.Is(err, kmod.ErrNotSupported) {
		t.Fatalf("Arm without rxe: %v, want ErrNotSupported", err)
	}
	if _, err := d.Mailboxes(1, 1); !errors.Is(err, kmod.ErrNotSupported) {
		t.Fatalf("Mailboxes without rxe: %v, want ErrNotSupported", err)
	}
}
