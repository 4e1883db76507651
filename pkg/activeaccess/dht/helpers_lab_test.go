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
	await      = aalab.Await
	timeout    = aalab.Timeout
	barriers   = aalab.Barriers
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
	t.Cleanup(func() { logCM(t) })
	return tg
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
	tb, err := dht.Dial(timeout(t, 60*time.Second), k, targetAddr(t, port), "source-"+labenv.Addr())
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { tb.Close() })
	t.Cleanup(func() { logCM(t) })
	return tb
}

func parseAddrPort(addr, port string) (netip.AddrPort, error) {
	return netip.ParseAddrPort(addr + ":" + port)
}
