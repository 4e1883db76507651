//go:build lab

package dht_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
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
	timeout    = aalab.Timeout
	barriers   = aalab.Barriers
)

// await waits for a barrier, and says so when that took long: the guest
// that logs no slow step is the one the others waited for.
func await(t *testing.T, name string) {
	t.Helper()
	defer slow(t, "barrier "+name, time.Now())
	aalab.Await(t, name)
}

// slow logs a step that took more than a few seconds (the steps take
// milliseconds to a second), to tell where a slow run spent its time.
func slow(t *testing.T, what string, start time.Time) {
	t.Helper()
	if d := time.Since(start); d > 3*time.Second {
		t.Logf("slow: %s took %v", what, d)
	}
}

// design is one table design and configuration under test.
type design struct {
	name string
	kind dht.Kind
	opts *dht.TargetOptions
}

func designs() []design {
	return []design{
		{"aa-transparent-event", dht.KindAA, &dht.TargetOptions{Mode: activeaccess.ModeTransparent, Notify: activeaccess.Event}},
		{"aa-transparent-poll", dht.KindAA, &dht.TargetOptions{Mode: activeaccess.ModeTransparent, Notify: activeaccess.Poll}},
		{"aa-mediated-event", dht.KindAA, &dht.TargetOptions{Mode: activeaccess.ModeMediated, Notify: activeaccess.Event}},
		{"aa-mediated-poll", dht.KindAA, &dht.TargetOptions{Mode: activeaccess.ModeMediated, Notify: activeaccess.Poll}},
		{"rma", dht.KindRMA, nil},
		{"am", dht.KindAM, &dht.TargetOptions{Notify: activeaccess.Poll}},
	}
}

// serve starts design d's target with layout l on port.
func serve(t *testing.T, port uint16, d design, l dht.Layout) dht.Target {
	t.Helper()
	start := time.Now()
	tg, err := dht.Serve(timeout(t, 60*time.Second), d.kind, targetAddr(t, port), l, d.opts)
	if err != nil {
		t.Fatalf("Serve: %v", err)
	}
	slow(t, "Serve", start)
	t.Cleanup(func() {
		if err := tg.Err(); err != nil {
			t.Errorf("target: %v", err)
		}
		defer slow(t, "the target's Close", time.Now())
		tg.Close()
	})
	t.Cleanup(func() { logCM(t); logState(t, tg) })
	return tg
}

// logState logs, when t failed, what a table or target with a DebugState
// (the AM ones) says of itself.
func logState(t *testing.T, x any) {
	if d, ok := x.(interface{ DebugState() string }); ok && t.Failed() {
		t.Log(d.DebugState())
	}
}

// logCM logs, when t failed, how many connection-management messages of
// each kind this guest's RDMA ports sent and received, and the last
// disconnect-related CM trace events (when aa-dht.sh could enable them):
// which side asked for a disconnect, and when.
func logCM(t *testing.T) {
	if !t.Failed() {
		return
	}
	var b strings.Builder
	for _, dir := range []string{"cm_tx_msgs", "cm_rx_msgs"} {
		files, _ := filepath.Glob("/sys/class/infiniband/*/ports/*/" + dir + "/*")
		fmt.Fprintf(&b, " %s", dir)
		for _, f := range files {
			if v, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(v)) != "0" {
				fmt.Fprintf(&b, " %s=%s", filepath.Base(f), strings.TrimSpace(string(v)))
			}
		}
	}
	t.Logf("CM messages:%s", b.String())
	b.Reset()
	// rxe's counters: RNR NAKs, retries, sequence errors and the like.
	files, _ := filepath.Glob("/sys/class/infiniband/*/ports/*/hw_counters/*")
	for _, f := range files {
		if v, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(v)) != "0" {
			fmt.Fprintf(&b, " %s=%s", filepath.Base(f), strings.TrimSpace(string(v)))
		}
	}
	t.Logf("device counters:%s", b.String())
	trace, err := os.ReadFile("/sys/kernel/tracing/trace")
	if err != nil {
		return
	}
	var evs []string
	for _, l := range strings.Split(string(trace), "\n") {
		f := strings.Fields(l)
		// comm-pid [cpu] flags time: event: cm.id=N src=A dst=B tos=T [EVENT ...]
		if len(f) < 8 || !strings.HasSuffix(f[4], ":") || !cmTraceWorthy.MatchString(l) {
			continue
		}
		evs = append(evs, strings.Join(append([]string{f[3], f[4], f[6], f[7]}, f[9:]...), " "))
	}
	for _, e := range evs[max(0, len(evs)-5):] {
		t.Logf("CM trace: %s", e)
	}
}

var cmTraceWorthy = regexp.MustCompile(`dreq|drep|disconnect|destroy|rej|stale|DISCONNECTED|UNREACHABLE|ERROR`)

func dial(t *testing.T, k dht.Kind, port uint16) dht.Table {
	t.Helper()
	start := time.Now()
	tb, err := dht.Dial(timeout(t, 60*time.Second), k, targetAddr(t, port), &dht.SourceOptions{Name: "source-" + labenv.Addr()})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	slow(t, "Dial", start)
	t.Cleanup(func() {
		defer slow(t, "the source's Close", time.Now())
		tb.Close()
	})
	t.Cleanup(func() { logCM(t); logState(t, tb) })
	return tb
}

func parseAddrPort(addr, port string) (netip.AddrPort, error) {
	return netip.ParseAddrPort(addr + ":" + port)
}
