package daemon

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/buildinfo"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/service"
)

// Collectors returns the collectors /metrics serves: rvmad_build_info,
// every service's metrics with their scrape accounting (service.Collector),
// and, with runtime set, the Go runtime and process collectors.
func Collectors(log *slog.Logger, services []service.Service, runtime bool) []prometheus.Collector {
	cs := []prometheus.Collector{buildinfo.Collector(), service.NewCollector(log, services)}
	if runtime {
		cs = append(cs, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return cs
}

// NewRegistry returns a registry of Collectors(log, services, runtime). It
// fails when two collectors describe the same metric.
func NewRegistry(log *slog.Logger, services []service.Service, runtime bool) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	for _, c := range Collectors(log, services, runtime) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics registry: %w", err)
		}
	}
	return reg, nil
}
