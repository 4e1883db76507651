// Package jbmtbudget is rvmad's service "jbmt-budget": it sets the JBMT pin
// budget of the rdmaplus module (docs/jbmt.md) from the configuration
// (jbmt_pin_budget_pages, --jbmt-pin-budget-pages), at start and on SIGHUP,
// through the module's parameter in sysfs. The budget in force is exported
// by the jbmt service (rdmaplus_jbmt_pin_budget_pages).
package jbmtbudget

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
)

// Param is the module parameter's path under the sysfs mount.
const Param = "module/rdmaplus/parameters/jbmt_pin_budget_pages"

// Service applies the configured budget. It exports no metric.
type Service struct {
	root string
	log  *slog.Logger

	mu    sync.Mutex
	pages uint32
}

// New returns the service for cfg (its SysfsRoot and JBMTPinBudgetPages).
func New(log *slog.Logger, cfg config.Config) *Service {
	return &Service{root: cfg.SysfsRoot, log: log, pages: cfg.JBMTPinBudgetPages}
}

// Name is "jbmt-budget".
func (s *Service) Name() string { return "jbmt-budget" }

// Start sets the budget when one is configured. A module that is not
// loaded is not an error (it is said in the log, and the next SIGHUP tries
// again); a parameter that cannot be written is.
func (s *Service) Start(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.apply(s.pages)
}

// Stop does nothing: the budget stays as set.
func (s *Service) Stop(context.Context) error { return nil }

// Reload sets the newly configured budget (0: leaves the module's). On an
// error the module keeps the budget it had.
func (s *Service) Reload(_ context.Context, cfg config.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.apply(cfg.JBMTPinBudgetPages); err != nil {
		return err
	}
	s.pages = cfg.JBMTPinBudgetPages
	return nil
}

func (s *Service) apply(pages uint32) error {
	if pages == 0 {
		return nil
	}
	path := filepath.Join(s.root, Param)
	err := os.WriteFile(path, []byte(strconv.FormatUint(uint64(pages), 10)), 0o644)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.log.Warn("the rdmaplus module (with JBMT) is not loaded: its pin budget is not set", "jbmt_pin_budget_pages", pages)
		return nil
	case err != nil:
		return fmt.Errorf("jbmt_pin_budget_pages: %w", err)
	}
	s.log.Info("JBMT pin budget set", "jbmt_pin_budget_pages", pages)
	return nil
}

// Describe sends nothing: the service has no metric.
func (s *Service) Describe(chan<- *prometheus.Desc) {}

// Collect sends nothing.
func (s *Service) Collect(chan<- prometheus.Metric) {}
