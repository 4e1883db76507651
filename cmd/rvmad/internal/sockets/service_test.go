package sockets

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func gather(t *testing.T, s *Service) map[string]int {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(s); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil || len(problems) > 0 {
		t.Fatalf("promlint: %v %v", problems, err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		out[mf.GetName()] = len(mf.GetMetric())
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				// Aggregates only: labels of fixed sets, never a process's or a connection's.
				switch l.GetName() {
				case "result", "reason", "path", "direction":
				default:
					t.Errorf("%s has label %s", mf.GetName(), l.GetName())
				}
			}
		}
	}
	return out
}

func TestServiceDisabled(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(log, config.Default())
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.b != nil {
		t.Fatal("disabled, but serving")
	}
	got := gather(t, s)
	for _, name := range []string{"rdmaplus_sockets_clients", "rdmaplus_sockets_registrations", "rdmaplus_sockets_attach_total",
		"rdmaplus_sockets_demote_total", "rdmaplus_sockets_pairing_errors_total",
		"rdmaplus_sockets_shim_processes", "rdmaplus_sockets_shim_connections", "rdmaplus_sockets_shim_connections_total",
		"rdmaplus_sockets_shim_bytes_total", "rdmaplus_sockets_shim_demotes_total", "rdmaplus_sockets_shim_fallbacks_total",
		"rdmaplus_sockets_shim_segments_refused_total", "rdmaplus_sockets_shim_upgrades_total",
		"rdmaplus_sockets_shim_attachable_total", "rdmaplus_sockets_shim_rdma_writes_total"} {
		if got[name] == 0 {
			t.Errorf("%s not exported while disabled", name)
		}
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestServiceEnabled(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := config.Default()
	cfg.Sockets.Enabled = true
	cfg.Sockets.Socket = filepath.Join(t.TempDir(), "run", "sockets.sock")
	cfg.Sockets.PairingPort = freePort(t)
	s := New(log, cfg)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unixpacket", cfg.Sockets.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close() // not to the garbage collector: tests count descriptors
	waitFor(t, "the client to count", func() bool { n, _ := s.counts(); return n == 1 })
	next := cfg
	next.Sockets.MaxPerUID = 7
	next.Sockets.PairingPort++
	if err := s.Reload(context.Background(), next); err != nil {
		t.Fatal(err)
	}
	if s.b.tab.maxPerUID != 7 || s.cfg.PairingPort != cfg.Sockets.PairingPort {
		t.Errorf("reload: cap %d, port %d", s.b.tab.maxPerUID, s.cfg.PairingPort)
	}
	gather(t, s)

	// A second service on the same port fails to start, saying which key.
	other := cfg
	other.Sockets.Socket = filepath.Join(t.TempDir(), "other.sock")
	if err := New(log, other).Start(context.Background()); err == nil || !strings.Contains(err.Error(), "sockets.pairing_port") {
		t.Errorf("second start on one port: %v", err)
	}

	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 8)); err != io.EOF {
		t.Errorf("client after stop: %v", err)
	}
	if _, err := os.Stat(cfg.Sockets.Socket); !os.IsNotExist(err) {
		t.Errorf("socket file left: %v", err)
	}
}
