//go:build lab

package dht_test

import (
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/internal/aalab"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// TestMain lets a test run a target in a child process it can kill.
func TestMain(m *testing.M) {
	if k := os.Getenv(childEnv); k != "" {
		os.Exit(childTarget(dht.Kind(k)))
	}
	os.Exit(m.Run())
}

// guest returns this guest's index; the tests need three guests: guest
// 1 the target, guests 2 and 3 the sources.
func guest(t *testing.T) int {
	t.Helper()
	labenv.Device(t)
	n, err := labenv.Guests()
	if err != nil || n != 3 {
		t.Fatalf("these tests need three guests (have %d, %v)", n, err)
	}
	i, err := labenv.Index()
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// Barriers and addresses, as the other Active Access lab tests have them
// (pkg/activeaccess/internal/aalab).
var (
	targetAddr = aalab.TargetAddr
	signal     = aalab.Signal
	await      = aalab.Await
	timeout    = aalab.Timeout
)

// design is one table design and configuration under test.
type design struct {
	name string
	cfg  dht.Config
}

func designs() []design {
	return []design{
		{"aa-transparent-event", dht.Config{Kind: dht.KindAA, Mode: activeaccess.ModeTransparent, Notify: activeaccess.Event}},
		{"aa-transparent-poll", dht.Config{Kind: dht.KindAA, Mode: activeaccess.ModeTransparent, Notify: activeaccess.Poll}},
		{"aa-mediated-event", dht.Config{Kind: dht.KindAA, Mode: activeaccess.ModeMediated, Notify: activeaccess.Event}},
		{"aa-mediated-poll", dht.Config{Kind: dht.KindAA, Mode: activeaccess.ModeMediated, Notify: activeaccess.Poll}},
		{"rma", dht.Config{Kind: dht.KindRMA}},
		{"am", dht.Config{Kind: dht.KindAM, Notify: activeaccess.Poll}},
	}
}

func serve(t *testing.T, port uint16, cfg dht.Config) dht.Target {
	t.Helper()
	tg, err := dht.Serve(targetAddr(t, port), cfg)
	if err != nil {
		t.Fatalf("Serve: %v", err)
	}
	t.Cleanup(func() {
		if err := tg.Err(); err != nil {
			t.Errorf("target: %v", err)
		}
		tg.Close()
	})
	return tg
}

func dial(t *testing.T, k dht.Kind, port uint16) dht.Table {
	t.Helper()
	tb, err := dht.Dial(timeout(t, 60*time.Second), k, targetAddr(t, port), "source-"+labenv.Addr())
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { tb.Close() })
	return tb
}

func parseAddrPort(addr, port string) (netip.AddrPort, error) {
	return netip.ParseAddrPort(addr + ":" + port)
}
