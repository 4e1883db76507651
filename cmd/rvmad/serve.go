package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/buildinfo"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/daemon"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/logging"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/service"
)

// cmdServe runs the daemon until SIGTERM or SIGINT.
func cmdServe(args []string, stderr io.Writer) error {
	fs := newFlagSet("serve", stderr)
	flags := config.BindFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := flags.Load()
	if err != nil {
		return usageError{err}
	}
	level := new(slog.LevelVar)
	lvl, _ := logging.ParseLevel(cfg.LogLevel) // validated
	level.Set(lvl)
	log, err := logging.New(stderr, cfg.LogFormat, level)
	if err != nil {
		return usageError{err}
	}
	log.Info("rvmad starting", "version", buildinfo.Version, "revision", buildinfo.Revision(), "config_file", flags.ConfigFile)

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)

	return daemon.Run(context.Background(), daemon.Options{
		Config:   cfg,
		Reload:   flags.Load,
		Log:      log,
		Level:    level,
		Signals:  sigs,
		Services: func(c config.Config) ([]service.Service, error) { return buildServices(c, log), nil },
	})
}
