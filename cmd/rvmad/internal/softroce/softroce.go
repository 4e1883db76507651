// Package softroce provisions SoftRoCE (rxe) links: the service "softroce"
// makes sure every configured link exists at start, adopting one that
// already does, and on shutdown removes only the links it created itself.
package softroce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
)

// ErrConflict is wrapped when a configured link cannot be provisioned
// because something else already holds its name or its netdev.
var ErrConflict = errors.New("conflicting RDMA device")

// ErrNoNetdev is wrapped when a configured netdev does not exist.
var ErrNoNetdev = errors.New("no such network device")

// Kernel is what provisioning needs from the system; Netlink is the real
// one, tests use a fake.
type Kernel interface {
	// RDMADevices lists the RDMA device names.
	RDMADevices() ([]string, error)
	// Parent returns the netdev a software RDMA device is bound to, "" for
	// a device that has none (hardware), and isRXE whether it is SoftRoCE.
	Parent(dev string) (parent string, isRXE bool, err error)
	// NetdevExists reports whether the network device exists.
	NetdevExists(netdev string) (bool, error)
	// AddRXE runs `rdma link add NAME type rxe netdev NETDEV`.
	AddRXE(name, netdev string) error
	// Del runs `rdma link delete NAME`.
	Del(name string) error
}

// Service is the "softroce" service. Create it with New.
type Service struct {
	k   Kernel
	log *slog.Logger

	mu      sync.Mutex
	want    []config.RXELink
	remove  bool
	created []string        // links this process created, in creation order
	adopted map[string]bool // links that existed already
	errors  prometheus.Counter
	owned   *prometheus.Desc
}

// New returns the service for cfg.RXE and cfg.RemoveCreatedLinks.
func New(k Kernel, log *slog.Logger, cfg config.Config) *Service {
	return &Service{
		k:       k,
		log:     log,
		want:    append([]config.RXELink(nil), cfg.RXE...),
		remove:  cfg.RemoveCreatedLinks,
		adopted: map[string]bool{},
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "rvmad", Subsystem: "softroce", Name: "provision_errors_total",
			Help: "Failed attempts to create, adopt or remove a SoftRoCE link.",
		}),
		owned: prometheus.NewDesc("rvmad_softroce_link_created",
			"One series per SoftRoCE link rvmad manages: 1 if rvmad created it (and removes it on shutdown when configured to), 0 if it adopted an existing one.",
			[]string{"device"}, nil),
	}
}

// Name returns "softroce".
func (s *Service) Name() string { return "softroce" }

// Start creates or adopts every configured link. It fails, naming the link,
// when a netdev does not exist, when the name or the netdev is taken by
// another device (ErrConflict), or when the kernel refuses the link (for
// instance rdma_rxe is not loaded); links created before the failure are
// then removed again.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.want {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.ensure(l); err != nil {
			s.errors.Inc()
			if rerr := s.removeCreated(func(string) bool { return true }); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return err
		}
	}
	return nil
}

// Stop removes the links this process created when remove_created_links is
// set; adopted links are always left alone. It returns the removals that
// failed, joined.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.remove {
		if len(s.created) > 0 {
			s.log.Info("leaving SoftRoCE links in place (remove_created_links is false)", "links", s.created)
		}
		return nil
	}
	return s.removeCreated(func(string) bool { return true })
}

// Reload provisions the links cfg adds and, when remove_created_links is
// set, removes the links this process created that cfg no longer lists.
func (s *Service) Reload(ctx context.Context, cfg config.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.want = append([]config.RXELink(nil), cfg.RXE...)
	s.remove = cfg.RemoveCreatedLinks
	var errs []error
	for _, l := range s.want {
		if err := s.ensure(l); err != nil {
			s.errors.Inc()
			errs = append(errs, err)
		}
	}
	if s.remove {
		wanted := func(name string) bool {
			return !slices.ContainsFunc(s.want, func(l config.RXELink) bool { return l.Name == name })
		}
		if err := s.removeCreated(wanted); err != nil {
			errs = append(errs, err)
		}
	}
	for name := range s.adopted {
		if !slices.ContainsFunc(s.want, func(l config.RXELink) bool { return l.Name == name }) {
			delete(s.adopted, name) // no longer managed; left in place
		}
	}
	return errors.Join(errs...)
}

// ensure makes l exist. Called with s.mu held.
func (s *Service) ensure(l config.RXELink) error {
	if slices.Contains(s.created, l.Name) || s.adopted[l.Name] {
		return nil
	}
	devs, err := s.k.RDMADevices()
	if err != nil {
		return fmt.Errorf("rxe link %s: listing RDMA devices: %w", l.Name, err)
	}
	if slices.Contains(devs, l.Name) {
		parent, isRXE, err := s.k.Parent(l.Name)
		if err != nil {
			return fmt.Errorf("rxe link %s: %w", l.Name, err)
		}
		switch {
		case !isRXE:
			return fmt.Errorf("rxe link %s: RDMA device %s exists and is not a SoftRoCE link: %w", l.Name, l.Name, ErrConflict)
		case parent != l.Netdev:
			return fmt.Errorf("rxe link %s: it exists on netdev %s, not %s (rdma link delete %s, or fix the configuration): %w",
				l.Name, parent, l.Netdev, l.Name, ErrConflict)
		}
		s.adopted[l.Name] = true
		s.log.Info("adopted existing SoftRoCE link; it will be kept on shutdown", "device", l.Name, "netdev", l.Netdev)
		return nil
	}
	for _, d := range devs {
		parent, isRXE, err := s.k.Parent(d)
		if err == nil && isRXE && parent == l.Netdev {
			return fmt.Errorf("rxe link %s: netdev %s already carries SoftRoCE device %s, and the kernel allows one per netdev (name it %s in the configuration, or rdma link delete %s): %w",
				l.Name, l.Netdev, d, d, d, ErrConflict)
		}
	}
	ok, err := s.k.NetdevExists(l.Netdev)
	if err != nil {
		return fmt.Errorf("rxe link %s: looking up netdev %s: %w", l.Name, l.Netdev, err)
	}
	if !ok {
		return fmt.Errorf("rxe link %s: netdev %s: %w", l.Name, l.Netdev, ErrNoNetdev)
	}
	if err := s.k.AddRXE(l.Name, l.Netdev); err != nil {
		return fmt.Errorf("rxe link %s: rdma link add %s type rxe netdev %s: %w%s", l.Name, l.Name, l.Netdev, err, addHint(err))
	}
	s.created = append(s.created, l.Name)
	s.log.Info("created SoftRoCE link", "device", l.Name, "netdev", l.Netdev)
	return nil
}

// removeCreated deletes, newest first, the created links for which sel is
// true. A link that has vanished already is not an error.
func (s *Service) removeCreated(sel func(string) bool) error {
	var errs []error
	kept := s.created[:0:0]
	for i := len(s.created) - 1; i >= 0; i-- {
		name := s.created[i]
		if !sel(name) {
			kept = append([]string{name}, kept...)
			continue
		}
		devs, err := s.k.RDMADevices()
		if err == nil && !slices.Contains(devs, name) {
			s.log.Warn("SoftRoCE link this process created is already gone", "device", name)
			continue
		}
		if err := s.k.Del(name); err != nil {
			s.errors.Inc()
			errs = append(errs, fmt.Errorf("rdma link delete %s: %w", name, err))
			kept = append([]string{name}, kept...)
			continue
		}
		s.log.Info("removed SoftRoCE link this process created", "device", name)
	}
	s.created = kept
	return errors.Join(errs...)
}

// Created returns the links this process created and still manages.
func (s *Service) Created() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.created...)
}

// Describe implements prometheus.Collector.
func (s *Service) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.owned
	s.errors.Describe(ch)
}

// Collect implements prometheus.Collector.
func (s *Service) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	for _, n := range s.created {
		ch <- prometheus.MustNewConstMetric(s.owned, prometheus.GaugeValue, 1, n)
	}
	for n := range s.adopted {
		ch <- prometheus.MustNewConstMetric(s.owned, prometheus.GaugeValue, 0, n)
	}
	s.mu.Unlock()
	s.errors.Collect(ch)
}
