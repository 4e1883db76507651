// Package sockets is rvmad's service "sockets", the broker of sockets
// over RDMA (docs/sockets.md, "rvmad's sockets service"). Local processes
// under the shim (and Go programs of pkg/sockets) talk to it on a Unix
// socket, identified by SO_PEERCRED; the brokers of two hosts talk on a
// TCP pairing port. It proves which process owns a connection with the
// kernel's socket diagnostics, relays the connection's ATTACH_* and
// DEMOTE records in order to the process that owns it on the peer host,
// tells every process when an RDMA device is being removed, and exports
// aggregate metrics. It never carries data.
//
// One job per file: service.go (the service), broker.go (routing),
// client.go (the Unix socket), pairing.go (the pairing port), table.go
// (who owns what), owner.go and diag.go (ownership), msg.go (messages),
// devices.go (RDMA devices being removed), tuple.go, metrics.go.
package sockets

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
)

// Service runs a Broker when the configuration enables it.
type Service struct {
	log *slog.Logger
	m   *metrics

	mu  sync.Mutex
	cfg config.Sockets
	b   *Broker
}

// New returns the service for cfg.Sockets.
func New(log *slog.Logger, cfg config.Config) *Service {
	s := &Service{log: log, cfg: cfg.Sockets}
	s.m = newMetrics(s.counts)
	s.m.shimFn = s.shimView
	return s
}

// Name is "sockets".
func (s *Service) Name() string { return "sockets" }

func (s *Service) counts() (int, int) {
	s.mu.Lock()
	b := s.b
	s.mu.Unlock()
	if b == nil {
		return 0, 0
	}
	return b.counts()
}

// shimView reads the running broker's segments; stopped, only the
// values of the processes gone remain.
func (s *Service) shimView() shimView {
	s.mu.Lock()
	b := s.b
	s.mu.Unlock()
	if b == nil {
		return shimView{total: s.m.foldedTotals()}
	}
	return b.shimView()
}

// Start opens the Unix socket and the pairing port when enabled; either
// failing (a port in use, a path that is not a socket) fails the start.
// Disabled, it does nothing.
func (s *Service) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.cfg.Enabled {
		s.log.Debug("sockets broker disabled (sockets.enabled)")
		return nil
	}
	b := NewBroker(Options{MaxPerUID: s.cfg.MaxPerUID, PairingPort: s.cfg.PairingPort, Log: s.log}, s.m)
	if _, err := b.ListenPairing(net.JoinHostPort("", strconv.Itoa(s.cfg.PairingPort))); err != nil {
		return fmt.Errorf("pairing port (sockets.pairing_port): %w", err)
	}
	if err := b.Listen(s.cfg.Socket); err != nil {
		_ = b.Close(ctx)
		return fmt.Errorf("unix socket (sockets.socket): %w", err)
	}
	b.watchDevices(sysVerbs)
	s.b = b
	s.log.Info("sockets broker serving", "socket", s.cfg.Socket, "pairing_port", s.cfg.PairingPort,
		"max_registrations_per_uid", s.cfg.MaxPerUID)
	return nil
}

// Stop closes the broker: every process and peer is disconnected.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	b := s.b
	s.b = nil
	s.mu.Unlock()
	if b == nil {
		return nil
	}
	return b.Close(ctx)
}

// Reload applies a new max_registrations_per_uid at once; enabled, socket
// and pairing_port need a restart and keep their running values, with a
// warning.
func (s *Service) Reload(_ context.Context, cfg config.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := cfg.Sockets
	if next.Enabled != s.cfg.Enabled || next.Socket != s.cfg.Socket || next.PairingPort != s.cfg.PairingPort {
		s.log.Warn("SIGHUP: sockets.enabled, sockets.socket and sockets.pairing_port need a restart; keeping the running values")
	}
	s.cfg.MaxPerUID = next.MaxPerUID
	if s.b != nil {
		s.b.SetMaxPerUID(next.MaxPerUID)
	}
	return nil
}

// Describe implements prometheus.Collector.
func (s *Service) Describe(ch chan<- *prometheus.Desc) { s.m.describe(ch) }

// Collect implements prometheus.Collector.
func (s *Service) Collect(ch chan<- prometheus.Metric) { s.m.collect(ch) }
