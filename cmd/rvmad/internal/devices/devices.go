// Package devices is the "devices" service: it exports every RDMA port's
// state and counters (package portmetrics) and answers readiness for the
// devices the configuration requires.
package devices

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/portmetrics"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sysfs"
)

// ErrMissing is wrapped when a required device does not exist.
var ErrMissing = errors.New("required RDMA device missing")

// ErrNotActive is wrapped when a port of a required device is not ACTIVE.
var ErrNotActive = errors.New("port not ACTIVE")

// Service is the "devices" service. Create it with New.
type Service struct {
	fs  sysfs.FS
	log *slog.Logger
	col *portmetrics.Collector

	mu       sync.Mutex
	required []string
}

// New returns the service reading fs, requiring cfg.RequiredDevices().
func New(fs sysfs.FS, log *slog.Logger, cfg config.Config) *Service {
	return &Service{fs: fs, log: log, col: portmetrics.New(fs), required: cfg.RequiredDevices()}
}

// Name returns "devices".
func (s *Service) Name() string { return "devices" }

// Start checks that every required device exists (its ports need not be
// ACTIVE yet: that is readiness). It fails with ErrMissing naming the
// device and listing those present, or with sysfs.ErrNoRDMA when required
// devices exist but the RDMA subsystem does not. With nothing required it
// only logs what it finds.
func (s *Service) Start(ctx context.Context) error {
	req := s.requiredDevices()
	devs, err := s.fs.Devices()
	if err != nil {
		if len(req) == 0 {
			s.log.Warn("no RDMA devices to export", "err", err)
			return nil
		}
		return fmt.Errorf("required devices %s: %w", strings.Join(req, ", "), err)
	}
	for _, d := range req {
		if !contains(devs, d) {
			return fmt.Errorf("%s: %w (present: %s)", d, ErrMissing, list(devs))
		}
	}
	s.log.Info("RDMA devices", "present", list(devs), "required", list(req))
	s.warnUnknownSpeed(devs)
	return nil
}

// warnUnknownSpeed explains, once at start, the kernel log lines every
// scrape causes on a RoCE port whose netdev reports no speed.
func (s *Service) warnUnknownSpeed(devs []string) {
	for _, d := range devs {
		ports, err := s.fs.Ports(d)
		if err != nil {
			continue
		}
		for _, p := range ports {
			info, err := s.fs.Port(d, p)
			if err != nil || info.Netdev == "" || s.fs.NetdevSpeedKnown(info.Netdev) {
				continue
			}
			s.log.Warn("the netdev under this RoCE port reports no speed: the kernel logs \"speed is unknown\" each time the port is queried, so at every scrape; give it one (ethtool -s "+info.Netdev+" speed 10000 duplex full)",
				"device", d, "port", p, "netdev", info.Netdev)
		}
	}
}

// Stop does nothing: the service owns no resources.
func (s *Service) Stop(context.Context) error { return nil }

// Ready fails while a required device is missing (ErrMissing) or has a
// port that is not ACTIVE (ErrNotActive); errors name device and port.
func (s *Service) Ready(ctx context.Context) error {
	var errs []error
	for _, d := range s.requiredDevices() {
		ports, err := s.fs.Ports(d)
		if errors.Is(err, sysfs.ErrNoDevice) || errors.Is(err, sysfs.ErrNoRDMA) {
			errs = append(errs, fmt.Errorf("%s: %w", d, ErrMissing))
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(ports) == 0 {
			errs = append(errs, fmt.Errorf("%s has no ports: %w", d, ErrNotActive))
		}
		for _, p := range ports {
			info, err := s.fs.Port(d, p)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !info.Active() {
				errs = append(errs, fmt.Errorf("%s port %d is %s: %w", d, p, info.StateName, ErrNotActive))
			}
		}
	}
	return errors.Join(errs...)
}

// Reload takes the new list of required devices; it never fails.
func (s *Service) Reload(_ context.Context, cfg config.Config) error {
	s.mu.Lock()
	s.required = cfg.RequiredDevices()
	s.mu.Unlock()
	return nil
}

// Describe implements prometheus.Collector (unchecked: sends nothing).
func (s *Service) Describe(ch chan<- *prometheus.Desc) { s.col.Describe(ch) }

// Collect implements prometheus.Collector.
func (s *Service) Collect(ch chan<- prometheus.Metric) { s.col.Collect(ch) }

// CollectErr implements service.FallibleCollector.
func (s *Service) CollectErr(ch chan<- prometheus.Metric) error { return s.col.CollectErr(ch) }

func (s *Service) requiredDevices() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.required...)
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func list(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}
