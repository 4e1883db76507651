package aametrics

import (
	"context"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
)

// Service is the "activeaccess" service. Create it with NewService.
type Service struct {
	col *Collector
	log *slog.Logger
}

// NewService returns the service reading under the sysfs at sysfsRoot.
func NewService(sysfsRoot string, log *slog.Logger) *Service {
	return &Service{col: New(sysfsRoot), log: log}
}

// Name returns "activeaccess".
func (s *Service) Name() string { return "activeaccess" }

// Start only logs whether the module is there; it never fails (the module
// may be loaded later, and its metrics then appear).
func (s *Service) Start(context.Context) error {
	if dirExists(s.col.dir) {
		s.log.Info("rdmaplus module found: exporting its Active Access counters", "dir", s.col.dir)
	} else {
		s.log.Info("rdmaplus module not loaded: rdmaplus_aa_module_loaded is 0 until it is", "dir", s.col.dir)
	}
	return nil
}

// Stop does nothing: the service owns no resources.
func (s *Service) Stop(context.Context) error { return nil }

// Describe implements prometheus.Collector.
func (s *Service) Describe(ch chan<- *prometheus.Desc) { s.col.Describe(ch) }

// Collect implements prometheus.Collector.
func (s *Service) Collect(ch chan<- prometheus.Metric) { s.col.Collect(ch) }

// CollectErr implements service.FallibleCollector.
func (s *Service) CollectErr(ch chan<- prometheus.Metric) error { return s.col.CollectErr(ch) }

func dirExists(dir string) bool {
	st, err := os.Stat(dir)
	return err == nil && st.IsDir()
}
