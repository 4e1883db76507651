package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
)

// Group runs services in order. It is safe for concurrent use once built.
type Group struct {
	log      *slog.Logger
	services []Service

	mu      sync.Mutex
	started int // services[:started] are running
}

// NewGroup returns a group of the services, which must have distinct,
// non-empty names; it fails otherwise.
func NewGroup(log *slog.Logger, services ...Service) (*Group, error) {
	seen := map[string]bool{}
	for _, s := range services {
		if s.Name() == "" || seen[s.Name()] {
			return nil, fmt.Errorf("service: name %q empty or used twice", s.Name())
		}
		seen[s.Name()] = true
	}
	return &Group{log: log, services: services}, nil
}

// Services returns the services in start order.
func (g *Group) Services() []Service { return append([]Service(nil), g.services...) }

// Start starts every service in order. When one fails, Start stops those
// already started (in reverse, each stop bounded by stopTimeout in all) and
// returns the failure, wrapped with the service's name.
func (g *Group) Start(ctx context.Context, stopTimeout time.Duration) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.services[g.started:] {
		g.log.Debug("starting service", "service", s.Name())
		if err := s.Start(ctx); err != nil {
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
			g.stopLocked(stopCtx)
			cancel()
			return fmt.Errorf("%s: %w", s.Name(), err)
		}
		g.started++
		g.log.Info("service started", "service", s.Name())
	}
	return nil
}

// Stop stops the started services in reverse order and returns their errors
// joined. A service whose Stop fails is still considered stopped.
func (g *Group) Stop(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stopLocked(ctx)
}

func (g *Group) stopLocked(ctx context.Context) error {
	var errs []error
	for g.started > 0 {
		s := g.services[g.started-1]
		g.started--
		if err := s.Stop(ctx); err != nil {
			g.log.Error("service stop failed", "service", s.Name(), "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", s.Name(), err))
			continue
		}
		g.log.Info("service stopped", "service", s.Name())
	}
	return errors.Join(errs...)
}

// Ready asks every Checker; it returns nil when all are ready, else their
// errors joined, each prefixed with the service name. A group that has not
// finished starting is not ready.
func (g *Group) Ready(ctx context.Context) error {
	g.mu.Lock()
	started := g.started
	g.mu.Unlock()
	if started < len(g.services) {
		return errors.New("starting")
	}
	var errs []error
	for _, s := range g.services {
		if c, ok := s.(Checker); ok {
			if err := c.Ready(ctx); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", s.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// Reload hands cfg to every Reloader, in start order, and returns their
// errors joined.
func (g *Group) Reload(ctx context.Context, cfg config.Config) error {
	var errs []error
	for _, s := range g.services {
		if r, ok := s.(Reloader); ok {
			if err := r.Reload(ctx, cfg); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", s.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}
