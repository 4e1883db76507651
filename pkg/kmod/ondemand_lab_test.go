//go:build lab

package kmod_test

import (
	"errors"
	"testing"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// TestLabOnDemandRegion: an rxe with on-demand paging (7.x) copies into
// an ODP region under a mutex, faulting pages in, which the module's
// hooks cannot do (they never sleep), and does its atomics in a function
// the module does not hook. So ARM, POST and GUARD refuse an ODP region
// (ErrInvalid), and the same region registered without ODP is taken. On
// an rxe without ODP there is nothing to refuse.
func TestLabOnDemandRegion(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 2)
	attr, err := p.ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	if !attr.HasODP() {
		t.Log("this rxe has no on-demand paging: nothing to refuse")
		return
	}
	odp, err := p.dst.pd.AllocMR(2*page, verbs.AccessAll|verbs.AccessOnDemand)
	if err != nil {
		t.Fatalf("an ODP region on an rxe that reports ODP: %v", err)
	}
	defer odp.Close()
	dm := newDomain(t, d, 4096)
	if err := dm.Arm(odp.RKey(), odp.Addr(), page, kmod.W|kmod.WL); !errors.Is(err, kmod.ErrInvalid) {
		t.Errorf("Arm of an ODP region: %v, want ErrInvalid", err)
	}
	mb := newMailboxes(t, d, 1, 1)
	if err := mb.Guard(odp.RKey()); !errors.Is(err, kmod.ErrInvalid) {
		t.Errorf("Guard of an ODP region: %v, want ErrInvalid", err)
	}
	id := newWindow(t, mb, kmod.CountBytes)
	post := kmod.MailboxPost{Key: odp.RKey(), IOVA: odp.Addr(), Length: 100, Threshold: 100}
	if err := mb.Post(id, post); !errors.Is(err, kmod.ErrInvalid) {
		t.Errorf("Post into an ODP region: %v, want ErrInvalid", err)
	}
	// the pinned region beside it is served
	if err := dm.Arm(p.key(), p.addr(0), page, kmod.W|kmod.WL); err != nil {
		t.Fatalf("Arm of a pinned region: %v", err)
	}
	if err := p.write(0, 0, []byte("pinned")); err != nil {
		t.Fatalf("write into the armed pinned region: %v", err)
	}
	if es := readAll(t, dm); len(es) != 1 {
		t.Fatalf("log after one write: %d entries, want 1", len(es))
	}
}
