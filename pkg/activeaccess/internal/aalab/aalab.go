// Package aalab holds what the Active Access lab tests (pkg/activeaccess
// and its use cases counter, getlog, checkpoint; dht uses its barriers)
// share: the two-guest layout (guest 1 the target, guest 2 the sources),
// barriers that fail the test instead of hanging, targets and sources closed by t.Cleanup, and
// both modes as subtests. It is only used from *_lab_test.go files; outside
// the lab every helper fails the test (labenv reports ErrNotInLab).
package aalab

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// Page is the granularity of active pages.
const Page = 4096

// Server reports whether this guest is the target (guest 1). It fails the
// test without an RDMA device or unless the boot has exactly two guests.
func Server(t testing.TB) bool {
	t.Helper()
	labenv.Device(t)
	n, err := labenv.Guests()
	if err != nil || n != 2 {
		t.Fatalf("these tests need two guests (have %d, %v)", n, err)
	}
	return labenv.Role() == "server"
}

// TargetAddr is guest 1's address with port p.
func TargetAddr(t testing.TB, p uint16) netip.AddrPort {
	t.Helper()
	a, err := labenv.AddrOf(1)
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(a), p)
}

// Signal raises the barrier name for every guest of the boot.
func Signal(t testing.TB, name string) {
	t.Helper()
	if err := labenv.Signal(name); err != nil {
		t.Fatal(err)
	}
}

// Await waits at most two minutes for the barrier name. For a barrier of
// ForModes (b(name)) it gives up at once when the other guest's side of
// that run failed (it raises the run's abort barrier), instead of waiting
// out the two minutes.
func Await(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	abort := ""
	if pre, _, ok := strings.Cut(name, sep); ok {
		abort = pre + sep + "abort"
	}
	for {
		wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := labenv.Wait(wctx, name)
		wcancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		if abort != "" && raised(abort) {
			t.Fatalf("waiting for %q: the other guest failed (%s)", name, abort)
		}
	}
}

// raised reports whether barrier name was signalled.
func raised(name string) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return labenv.Wait(ctx, name) == nil
}

// sep separates a ForModes run's prefix from a barrier's name.
const sep = "__"

// Timeout is a context that ends after d or with the test.
func Timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Listen starts a target of size bytes on guest 1's address, closed with
// the test; opts may be nil.
func Listen(t testing.TB, port uint16, size int, opts *activeaccess.TargetOptions) *activeaccess.Target {
	t.Helper()
	tg, err := activeaccess.Listen(Timeout(t, 60*time.Second), TargetAddr(t, port), size, opts)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { tg.Close() })
	return tg
}

// Dial connects a source named name to the target on guest 1, closed with
// the test.
func Dial(t testing.TB, port uint16, name string) *activeaccess.Source {
	t.Helper()
	s, err := activeaccess.Dial(Timeout(t, 60*time.Second), TargetAddr(t, port), &activeaccess.SourceOptions{Name: name})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// ForModes runs f once per mode as subtests; b names a barrier of that
// mode's run, so the two runs never share one. When a run fails on one
// guest, Await on the other guest's barriers of that run fails at once.
func ForModes(t *testing.T, f func(t *testing.T, mode activeaccess.Mode, b func(string) string)) {
	for _, m := range []activeaccess.Mode{activeaccess.ModeTransparent, activeaccess.ModeMediated} {
		t.Run(m.String(), func(t *testing.T) {
			f(t, m, Barriers(t, strings.ReplaceAll(t.Name(), "/", ".")))
		})
	}
}

// Barriers names the barriers of one run of a test (run: a name no other
// run uses). When t fails on one guest, Await on the other guests'
// barriers of that run fails at once instead of waiting out its two
// minutes.
func Barriers(t *testing.T, run string) func(string) string {
	t.Cleanup(func() {
		if t.Failed() {
			labenv.Signal(run + sep + "abort") // the other guests stop waiting
		}
	})
	return func(name string) string { return run + sep + name }
}

// Pattern is the data version seed holds at offset off: every byte depends
// on its address and the seed.
func Pattern(off, n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		a := off + i
		b[i] = seed ^ byte(a*7+a/251)
	}
	return b
}
