package softroce

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
)

// fakeKernel models the kernel's rule: one rxe link per netdev.
type fakeKernel struct {
	mu      sync.Mutex
	links   map[string]string // name -> parent ("" = hardware)
	netdevs []string
	addErr  error
	log     []string
}

func newFake(netdevs ...string) *fakeKernel {
	return &fakeKernel{links: map[string]string{}, netdevs: netdevs}
}

func (f *fakeKernel) RDMADevices() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.links {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

func (f *fakeKernel) Parent(dev string) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.links[dev]
	if !ok {
		return "", false, errors.New("no such device")
	}
	return p, p != "", nil
}

func (f *fakeKernel) NetdevExists(n string) (bool, error) { return slices.Contains(f.netdevs, n), nil }

func (f *fakeKernel) AddRXE(name, netdev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.addErr != nil {
		return f.addErr
	}
	for _, p := range f.links {
		if p == netdev {
			return syscall.EEXIST
		}
	}
	f.links[name] = netdev
	f.log = append(f.log, "add "+name)
	return nil
}

func (f *fakeKernel) Del(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.links[name]; !ok {
		return errors.New("not found")
	}
	delete(f.links, name)
	f.log = append(f.log, "del "+name)
	return nil
}

func cfg(remove bool, links ...config.RXELink) config.Config {
	c := config.Default()
	c.RXE = links
	c.RemoveCreatedLinks = remove
	return c
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestCreateAndRemove(t *testing.T) {
	k := newFake("eth0", "eth1")
	s := New(k, quiet, cfg(true, config.RXELink{Name: "rxe0", Netdev: "eth0"}, config.RXELink{Name: "rxe1", Netdev: "eth1"}))
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := k.RDMADevices(); !slices.Equal(got, []string{"rxe0", "rxe1"}) {
		t.Fatalf("devices after start: %v", got)
	}
	if n := testutil.CollectAndCount(s, "rvmad_softroce_link_created"); n != 2 {
		t.Fatalf("%d link series", n)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := k.RDMADevices(); len(got) != 0 {
		t.Fatalf("left behind: %v", got)
	}
	if strings.Join(k.log, ",") != "add rxe0,add rxe1,del rxe1,del rxe0" {
		t.Fatalf("order: %v", k.log)
	}
}

func TestAdoptIsKept(t *testing.T) {
	k := newFake("eth0")
	k.links["rxe0"] = "eth0"
	s := New(k, quiet, cfg(true, config.RXELink{Name: "rxe0", Netdev: "eth0"}))
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.links["rxe0"]; !ok || len(k.log) != 0 {
		t.Fatalf("adopted link touched: %v", k.log)
	}
}

func TestStartTwiceIsIdempotent(t *testing.T) {
	k := newFake("eth0")
	c := cfg(true, config.RXELink{Name: "rxe0", Netdev: "eth0"})
	a := New(k, quiet, c)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A second daemon (or a restart after a crash) adopts, never duplicates.
	b := New(k, quiet, c)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(b.Created()) != 0 || len(k.links) != 1 {
		t.Fatalf("second start created %v; links %v", b.Created(), k.links)
	}
}

func TestKeepWhenNotRemoving(t *testing.T) {
	k := newFake("eth0")
	s := New(k, quiet, cfg(false, config.RXELink{Name: "rxe0", Netdev: "eth0"}))
	_ = s.Start(context.Background())
	_ = s.Stop(context.Background())
	if _, ok := k.links["rxe0"]; !ok {
		t.Fatal("link removed although remove_created_links is false")
	}
}

func TestErrors(t *testing.T) {
	ctx := context.Background()

	k := newFake("eth0")
	err := New(k, quiet, cfg(true, config.RXELink{Name: "rxe0", Netdev: "eth9"})).Start(ctx)
	if !errors.Is(err, ErrNoNetdev) || !strings.Contains(err.Error(), "eth9") {
		t.Errorf("missing netdev: %v", err)
	}

	k = newFake("eth0", "eth1")
	k.links["rxe0"] = "eth1"
	err = New(k, quiet, cfg(true, config.RXELink{Name: "rxe0", Netdev: "eth0"})).Start(ctx)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "eth1") {
		t.Errorf("name on other netdev: %v", err)
	}

	k = newFake("eth0")
	k.links["other"] = "eth0"
	err = New(k, quiet, cfg(true, config.RXELink{Name: "rxe0", Netdev: "eth0"})).Start(ctx)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "other") {
		t.Errorf("netdev taken: %v", err)
	}

	k = newFake("eth0")
	k.links["mlx5_0"] = ""
	err = New(k, quiet, cfg(true, config.RXELink{Name: "mlx5_0", Netdev: "eth0"})).Start(ctx)
	if !errors.Is(err, ErrConflict) {
		t.Errorf("hardware name: %v", err)
	}

	// A failure part-way removes what this start created.
	k = newFake("eth0")
	err = New(k, quiet, cfg(true, config.RXELink{Name: "rxe0", Netdev: "eth0"}, config.RXELink{Name: "rxe1", Netdev: "eth7"})).Start(ctx)
	if err == nil || len(k.links) != 0 {
		t.Errorf("partial start: err %v, links %v", err, k.links)
	}

	k = newFake("eth0")
	k.addErr = syscall.EOPNOTSUPP
	err = New(k, quiet, cfg(true, config.RXELink{Name: "rxe0", Netdev: "eth0"})).Start(ctx)
	if !errors.Is(err, syscall.EOPNOTSUPP) || !strings.Contains(err.Error(), "rdma_rxe") {
		t.Errorf("module missing: %v", err)
	}
}

func TestReload(t *testing.T) {
	k := newFake("eth0", "eth1")
	s := New(k, quiet, cfg(true, config.RXELink{Name: "rxe0", Netdev: "eth0"}))
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(ctx, cfg(true, config.RXELink{Name: "rxe1", Netdev: "eth1"})); err != nil {
		t.Fatal(err)
	}
	if got, _ := k.RDMADevices(); !slices.Equal(got, []string{"rxe1"}) {
		t.Fatalf("after reload: %v", got)
	}
	_ = s.Stop(ctx)
	if len(k.links) != 0 {
		t.Fatalf("left: %v", k.links)
	}
}

func TestLinkVanished(t *testing.T) {
	k := newFake("eth0")
	s := New(k, quiet, cfg(true, config.RXELink{Name: "rxe0", Netdev: "eth0"}))
	_ = s.Start(context.Background())
	delete(k.links, "rxe0") // an operator ran rdma link delete
	if err := s.Stop(context.Background()); err != nil {
		t.Fatalf("vanished link made Stop fail: %v", err)
	}
}
