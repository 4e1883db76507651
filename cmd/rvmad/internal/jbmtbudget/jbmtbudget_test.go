package jbmtbudget

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
)

func TestApply(t *testing.T) {
	root := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	cfg := config.Default()
	cfg.SysfsRoot = root
	cfg.JBMTPinBudgetPages = 64

	// no module: not an error, nothing written
	if err := New(log, cfg).Start(ctx); err != nil {
		t.Fatalf("Start without the module: %v", err)
	}
	param := filepath.Join(root, Param)
	if err := os.MkdirAll(filepath.Dir(param), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(param, []byte("32768\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := New(log, cfg)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	read := func() string {
		b, err := os.ReadFile(param)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := read(); got != "64" {
		t.Errorf("after Start: %q, want 64", got)
	}
	cfg.JBMTPinBudgetPages = 0 // leaves the module's
	if err := s.Reload(ctx, cfg); err != nil || read() != "64" {
		t.Errorf("Reload with 0: %v, %q", err, read())
	}
	cfg.JBMTPinBudgetPages = 1
	if err := s.Reload(ctx, cfg); err != nil || read() != "1" {
		t.Errorf("Reload with 1: %v, %q", err, read())
	}
	// a parameter that cannot be written
	if err := os.Remove(param); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(param, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.JBMTPinBudgetPages = 2
	if err := s.Reload(ctx, cfg); err == nil {
		t.Error("Reload with an unwritable parameter: no error")
	}
}
