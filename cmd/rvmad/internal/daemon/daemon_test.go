package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/devices"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/service"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sysfs"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// stub is a service that records its lifecycle.
type stub struct {
	name     string
	startErr error
	stopWait time.Duration
	mu       sync.Mutex
	events   *[]string
	reloaded int
	lastCfg  config.Config
}

func (s *stub) Name() string { return s.name }
func (s *stub) Start(ctx context.Context) error {
	s.record("start " + s.name)
	return s.startErr
}
func (s *stub) Stop(ctx context.Context) error {
	s.record("stop " + s.name)
	select {
	case <-time.After(s.stopWait):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (s *stub) Reload(_ context.Context, c config.Config) error {
	s.mu.Lock()
	s.reloaded++
	s.lastCfg = c
	s.mu.Unlock()
	return nil
}
func (s *stub) Describe(chan<- *prometheus.Desc) {}
func (s *stub) Collect(chan<- prometheus.Metric) {}
func (s *stub) record(e string) {
	s.mu.Lock()
	*s.events = append(*s.events, e)
	s.mu.Unlock()
}

type harness struct {
	reload func() (config.Config, error)
	log    *slog.Logger // nil: quiet
	sigs   chan os.Signal
	addr   chan net.Addr
	done   chan error
	events []string
	a, b   *stub
}

func start(t *testing.T, cfg config.Config, mod func(h *harness)) *harness {
	t.Helper()
	h := &harness{sigs: make(chan os.Signal, 4), addr: make(chan net.Addr, 1), done: make(chan error, 1)}
	h.a = &stub{name: "a", events: &h.events}
	h.b = &stub{name: "b", events: &h.events}
	if mod != nil {
		mod(h)
	}
	fixture := sysfs.New(filepath.Join("..", "..", "testdata", "sysfs-rxe"))
	log := h.log
	if log == nil {
		log = quiet
	}
	go func() {
		h.done <- Run(context.Background(), Options{
			Config: cfg,
			Reload: func() (config.Config, error) {
				if h.reload != nil {
					return h.reload()
				}
				return cfg, nil
			},
			Log:     log,
			Signals: h.sigs,
			Services: func(c config.Config) ([]service.Service, error) {
				return []service.Service{h.a, devices.New(fixture, quiet, c), h.b}, nil
			},
			Serving: func(a net.Addr) { h.addr <- a },
		})
	}()
	return h
}

func testConfig() config.Config {
	c := config.Default()
	c.Listen = "127.0.0.1:0"
	c.Devices = []string{"rxe0"}
	c.ShutdownTimeout = config.Duration(2 * time.Second)
	return c
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServeAndStop(t *testing.T) {
	h := start(t, testConfig(), nil)
	var addr net.Addr
	select {
	case addr = <-h.addr:
	case err := <-h.done:
		t.Fatalf("Run returned early: %v", err)
	}
	base := "http://" + addr.String()
	if code, body := get(t, base+"/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("/healthz %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz %d %q", code, body)
	}
	code, body := get(t, base+"/metrics")
	for _, want := range []string{
		`rvmad_hw_sent_packets_total{device="rxe0",port="1"} 1000`,
		`rvmad_build_info{`,
		`rvmad_scrape_success{service="devices"} 1`,
		`rvmad_scrape_errors_total{service="devices"} 0`,
		`go_goroutines`,
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Fatalf("/metrics %d lacks %q", code, want)
		}
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	h.sigs <- syscall.SIGHUP
	h.sigs <- syscall.SIGTERM
	if err := <-h.done; err != nil {
		t.Fatalf("clean shutdown returned %v", err)
	}
	if got := strings.Join(h.events, ","); got != "start a,start b,stop b,stop a" {
		t.Fatalf("lifecycle %s", got)
	}
	if h.a.reloaded != 1 {
		t.Fatalf("reloaded %d times", h.a.reloaded)
	}
}

func TestPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := testConfig()
	cfg.Listen = ln.Addr().String()
	h := start(t, cfg, nil)
	err = <-h.done
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), cfg.Listen) {
		t.Fatalf("got %v", err)
	}
	if len(h.events) != 0 {
		t.Fatalf("services started although the port was taken: %v", h.events)
	}
}

func TestStartFailureStopsStarted(t *testing.T) {
	boom := errors.New("boom")
	h := start(t, testConfig(), func(h *harness) { h.b.startErr = boom })
	err := <-h.done
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "b: boom") {
		t.Fatalf("got %v", err)
	}
	if got := strings.Join(h.events, ","); got != "start a,start b,stop a" {
		t.Fatalf("lifecycle %s", got)
	}
}

func TestMissingDeviceFailsStart(t *testing.T) {
	cfg := testConfig()
	cfg.Devices = []string{"mlx5_9"}
	h := start(t, cfg, nil)
	err := <-h.done
	if !errors.Is(err, devices.ErrMissing) {
		t.Fatalf("got %v", err)
	}
}

func TestShutdownIsBounded(t *testing.T) {
	cfg := testConfig()
	cfg.ShutdownTimeout = config.Duration(200 * time.Millisecond)
	h := start(t, cfg, func(h *harness) { h.a.stopWait = time.Hour })
	<-h.addr
	t0 := time.Now()
	h.sigs <- syscall.SIGINT
	err := <-h.done
	if !errors.Is(err, ErrShutdownTimeout) {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("shutdown took %v", d)
	}
}

func TestReload(t *testing.T) {
	cfg := testConfig()
	calls := 0
	h := start(t, cfg, func(h *harness) {
		h.reload = func() (config.Config, error) {
			calls++
			if calls == 1 {
				return config.Config{}, errors.New("bad file")
			}
			next := cfg.Clone()
			next.Listen = "127.0.0.1:1" // needs a restart: kept
			next.Devices = []string{"rxe0", "other"}
			return next, nil
		}
	})
	addr := <-h.addr
	h.sigs <- syscall.SIGHUP // rejected: nothing reloaded, still serving
	h.sigs <- syscall.SIGHUP
	deadline := time.Now().Add(5 * time.Second)
	for {
		// b reloads after the devices service (start order a, devices, b).
		h.b.mu.Lock()
		n, last := h.b.reloaded, h.b.lastCfg
		h.b.mu.Unlock()
		if n == 1 {
			if last.Listen != cfg.Listen || len(last.Devices) != 2 {
				t.Fatalf("reloaded with %+v", last)
			}
			break
		}
		if n > 1 || time.Now().After(deadline) {
			t.Fatalf("reloaded %d times", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// "other" is now required and missing: not ready.
	if code, body := get(t, "http://"+addr.String()+"/readyz"); code != 503 || !strings.Contains(body, "other") {
		t.Fatalf("/readyz %d %q", code, body)
	}
	h.sigs <- syscall.SIGTERM
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
}
