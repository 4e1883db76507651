//go:build lab

package activeaccess_test

import (
	"context"
	"hash/fnv"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

const page = 4096

// TestMain lets a test run a target in a child process it can kill.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childTarget())
	}
	os.Exit(m.Run())
}

// server reports whether this guest is the target (guest 1); every test
// here needs exactly two guests.
func server(t *testing.T) bool {
	t.Helper()
	labenv.Device(t)
	n, err := labenv.Guests()
	if err != nil || n != 2 {
		t.Fatalf("these tests need two guests (have %d, %v)", n, err)
	}
	return labenv.Role() == "server"
}

// targetAddr is the target's address with port p.
func targetAddr(t *testing.T, p uint16) netip.AddrPort {
	t.Helper()
	a, err := labenv.AddrOf(1)
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(a), p)
}

func signal(t *testing.T, name string) {
	t.Helper()
	if err := labenv.Signal(name); err != nil {
		t.Fatal(err)
	}
}

func await(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := labenv.Wait(ctx, name); err != nil {
		t.Fatal(err)
	}
}

func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// pattern is the data a source writes at offset off: every byte depends
// on its address and the seed.
func pattern(off, n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		a := off + i
		b[i] = seed ^ byte(a*7+a/251)
	}
	return b
}

func sum(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

func listen(t *testing.T, port uint16, cfg activeaccess.TargetConfig) *activeaccess.Target {
	t.Helper()
	tg, err := activeaccess.Listen(targetAddr(t, port), &cfg)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { tg.Close() })
	return tg
}

func dial(t *testing.T, port uint16, name string) *activeaccess.Source {
	t.Helper()
	s, err := activeaccess.Dial(timeout(t, 60*time.Second), targetAddr(t, port), &activeaccess.SourceConfig{Name: name})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// forModes runs f once per mode, as subtests; b names a barrier of that
// mode's run.
func forModes(t *testing.T, f func(t *testing.T, mode activeaccess.Mode, b func(string) string)) {
	for _, m := range []activeaccess.Mode{activeaccess.ModeTransparent, activeaccess.ModeMediated} {
		t.Run(m.String(), func(t *testing.T) {
			f(t, m, func(name string) string { return name + "-" + m.String() })
		})
	}
}
