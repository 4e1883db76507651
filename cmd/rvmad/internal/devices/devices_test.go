package devices

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sysfs"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func svc(fixture string, devs ...string) *Service {
	c := config.Default()
	c.Devices = devs
	return New(sysfs.New(filepath.Join("..", "..", "testdata", fixture)), quiet, c)
}

func TestStartAndReady(t *testing.T) {
	ctx := context.Background()
	s := svc("sysfs-rxe", "rxe0")
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("rxe0 ACTIVE but not ready: %v", err)
	}
}

func TestMissingDevice(t *testing.T) {
	err := svc("sysfs-rxe", "mlx5_0").Start(context.Background())
	if !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), "mlx5_0") || !strings.Contains(err.Error(), "rxe0") {
		t.Fatalf("got %v", err)
	}
	s := New(sysfs.New(t.TempDir()), quiet, config.Default())
	if err := s.Start(context.Background()); err != nil {
		t.Fatalf("nothing required, no RDMA: %v", err)
	}
}

func TestNotReadyWhenPortDown(t *testing.T) {
	err := svc("sysfs-hca", "hca0").Ready(context.Background())
	if !errors.Is(err, ErrNotActive) || !strings.Contains(err.Error(), "port 2 is DOWN") {
		t.Fatalf("got %v", err)
	}
}

func TestReloadChangesRequirement(t *testing.T) {
	s := svc("sysfs-rxe", "rxe0")
	c := config.Default()
	c.Devices = []string{"gone0"}
	_ = s.Reload(context.Background(), c)
	if err := s.Ready(context.Background()); !errors.Is(err, ErrMissing) {
		t.Fatalf("got %v", err)
	}
}
