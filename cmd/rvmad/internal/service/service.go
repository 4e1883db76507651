// Package service is how a piece of rvmad plugs into the daemon: it has a
// name, a lifecycle (Start, Stop), and its own Prometheus metrics. The
// daemon starts services in the order given, stops them in reverse, wraps
// their collectors with scrape accounting, and asks those that can answer
// whether they are ready.
//
// A new service (an RVMA endpoint, the sockets engine, ...) implements
// Service, optionally Checker, Reloader and FallibleCollector, and is added
// to the list in cmd/rvmad/services.go.
package service

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
)

// Service is one unit of the daemon.
//
// Start brings the service up; it must return once the service runs (work
// continues in goroutines the service owns) or fail with an error that says
// what the operator must fix; the daemon then stops the services started
// before it and exits non-zero. ctx bounds the start only.
//
// Stop undoes Start within ctx's deadline; it is called once, only after a
// successful Start, and its error is logged.
//
// Describe and Collect must be safe for concurrent use and must not block
// on anything slower than a sysfs read. Collect may be called before Start
// and after Stop (e.g. by `rvmad lint`).
type Service interface {
	Name() string
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	prometheus.Collector
}

// Checker is implemented by services that know whether they are ready to
// serve; /readyz fails while any Ready returns an error (the text goes into
// the response body).
type Checker interface {
	Ready(ctx context.Context) error
}

// Reloader is implemented by services that can apply a new configuration
// without restarting (SIGHUP). Reload must leave the service running on its
// old configuration when it fails.
type Reloader interface {
	Reload(ctx context.Context, cfg config.Config) error
}

// FallibleCollector is implemented by services whose metrics can be read only
// in part. The daemon calls CollectErr instead of Collect; the metrics sent
// are exported, and the error, if any, counts as one scrape error per joined
// error (errors.Join) in rvmad_scrape_errors_total.
type FallibleCollector interface {
	CollectErr(ch chan<- prometheus.Metric) error
}
