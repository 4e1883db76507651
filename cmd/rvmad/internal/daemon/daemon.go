// Package daemon runs `rvmad serve`: it opens the HTTP listener, starts the
// services, serves /metrics, /healthz and /readyz, re-reads the
// configuration on SIGHUP, and shuts down within a bounded time on SIGTERM
// or SIGINT.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/logging"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sdnotify"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/server"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/service"
)

// ErrShutdownTimeout is wrapped when a graceful shutdown did not finish
// within shutdown_timeout, or a second signal cut it short.
var ErrShutdownTimeout = errors.New("shutdown not finished in time")

// Options are what Run needs.
type Options struct {
	// Config is the validated configuration to start with.
	Config config.Config
	// Reload returns a fresh validated configuration on SIGHUP (the config
	// file re-read, command-line flags still winning); nil disables reload.
	Reload func() (config.Config, error)
	// Log is the logger; Level the level it honours, changed on reload.
	Log   *slog.Logger
	Level *slog.LevelVar
	// Signals delivers SIGTERM, SIGINT and SIGHUP (signal.Notify).
	Signals <-chan os.Signal
	// Services builds the services for a configuration, in start order.
	Services func(cfg config.Config) ([]service.Service, error)
	// Serving, if set, is called with the listen address once the HTTP
	// server runs and every service has started (tests use it).
	Serving func(addr net.Addr)
}

// Run runs the daemon until ctx ends or a SIGTERM/SIGINT arrives, then
// shuts down. It returns nil after a clean shutdown; an error when the
// listener cannot be opened (port in use), a service fails to start (the
// services already started are stopped first), the HTTP server dies, or
// the shutdown exceeds its bound (ErrShutdownTimeout).
func Run(ctx context.Context, o Options) error {
	cfg := o.Config
	log := o.Log
	ln, err := server.Listen(cfg.Listen)
	if err != nil {
		return fmt.Errorf("%w (set listen / --listen to a free address)", err)
	}
	services, err := o.Services(cfg)
	if err != nil {
		ln.Close()
		return err
	}
	group, err := service.NewGroup(log, services...)
	if err != nil {
		ln.Close()
		return err
	}
	reg, err := NewRegistry(log, services, true)
	if err != nil {
		ln.Close()
		return err
	}
	srv := server.Serve(ln, server.Handler(reg, group.Ready, log), log)
	log.Info("rvmad listening", "addr", srv.Addr().String(), "sysfs_root", cfg.SysfsRoot)

	// Start the services; a TERM/INT meanwhile cancels the start.
	startCtx, cancelStart := context.WithCancel(ctx)
	var sigDuringStart os.Signal
	var startWG sync.WaitGroup
	startDone := make(chan struct{})
	startWG.Add(1)
	go func() {
		defer startWG.Done()
		for {
			select {
			case sig := <-o.Signals:
				if sig == syscall.SIGHUP {
					log.Warn("SIGHUP ignored while starting")
					continue
				}
				sigDuringStart = sig
				cancelStart()
				return
			case <-startDone:
				return
			}
		}
	}()
	err = group.Start(startCtx, cfg.ShutdownTimeout.D())
	close(startDone)
	startWG.Wait()
	cancelStart()
	if err != nil || sigDuringStart != nil {
		shCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout.D())
		defer cancel()
		_ = srv.Shutdown(shCtx)
		if sigDuringStart != nil {
			log.Info("signal during start; stopped", "signal", sigDuringStart.String())
			if err == nil {
				return group.Stop(shCtx)
			}
			return nil
		}
		return fmt.Errorf("starting service %w", err)
	}
	if err := sdnotify.Notify("READY=1"); err != nil {
		log.Warn("cannot notify systemd", "err", err)
	}
	log.Info("rvmad ready to serve", "services", names(services))
	if o.Serving != nil {
		o.Serving(srv.Addr())
	}

	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			log.Info("context ended; shutting down")
			break loop
		case err := <-srv.Done():
			runErr = fmt.Errorf("http server: %w", err)
			log.Error("http server stopped", "err", err)
			break loop
		case sig := <-o.Signals:
			if sig == syscall.SIGHUP {
				cfg = reload(ctx, o, group, cfg)
				continue
			}
			log.Info("shutting down", "signal", sig.String(), "timeout", cfg.ShutdownTimeout.String())
			break loop
		}
	}
	return errors.Join(runErr, shutdown(ctx, o, srv, group, cfg.ShutdownTimeout.D()))
}

// shutdown stops the HTTP server and the services within timeout; a second
// TERM/INT abandons it.
func shutdown(ctx context.Context, o Options, srv *server.Server, group *service.Group, timeout time.Duration) error {
	_ = sdnotify.Notify("STOPPING=1")
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- errors.Join(srv.Shutdown(ctx), group.Stop(ctx))
	}()
	for {
		select {
		case err := <-done:
			if ctx.Err() != nil {
				return fmt.Errorf("%w (%v): %v", ErrShutdownTimeout, timeout, err)
			}
			if err == nil {
				o.Log.Info("rvmad stopped")
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("%w: still stopping after %v", ErrShutdownTimeout, timeout)
		case sig := <-o.Signals:
			if sig == syscall.SIGHUP {
				continue
			}
			return fmt.Errorf("%w: second signal %v", ErrShutdownTimeout, sig)
		}
	}
}

// reload applies a re-read configuration; settings that need a restart keep
// their running values, with a warning.
func reload(ctx context.Context, o Options, group *service.Group, cur config.Config) config.Config {
	log := o.Log
	if o.Reload == nil {
		log.Warn("SIGHUP: no configuration to reload")
		return cur
	}
	_ = sdnotify.Notify("RELOADING=1")
	defer sdnotify.Notify("READY=1")
	next, err := o.Reload()
	if err != nil {
		log.Error("SIGHUP: configuration rejected; keeping the running one", "err", err)
		return cur
	}
	for _, f := range []struct {
		name       string
		curV, newV string
		keep       func()
	}{
		{"listen", cur.Listen, next.Listen, func() { next.Listen = cur.Listen }},
		{"sysfs_root", cur.SysfsRoot, next.SysfsRoot, func() { next.SysfsRoot = cur.SysfsRoot }},
		{"log_format", cur.LogFormat, next.LogFormat, func() { next.LogFormat = cur.LogFormat }},
	} {
		if f.curV != f.newV {
			log.Warn("SIGHUP: setting needs a restart; keeping the running value", "field", f.name, "running", f.curV, "configured", f.newV)
			f.keep()
		}
	}
	if lvl, err := logging.ParseLevel(next.LogLevel); err == nil && o.Level != nil {
		o.Level.Set(lvl)
	}
	if err := group.Reload(ctx, next); err != nil {
		log.Error("SIGHUP: configuration applied in part", "err", err)
	} else {
		log.Info("SIGHUP: configuration reloaded")
	}
	return next
}

func names(ss []service.Service) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name()
	}
	return out
}
