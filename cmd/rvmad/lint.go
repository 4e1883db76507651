package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/daemon"
)

// cmdLint runs the Prometheus linter over rvmad's metrics: those a running
// rvmad serves (--url), or those this process collects from --sysfs-root.
// It fails when the linter finds a problem or the metrics cannot be had.
func cmdLint(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("lint", stderr)
	url := fs.String("url", "", "lint the metrics served at this `URL` (e.g. http://127.0.0.1:9470/metrics) instead of collecting locally")
	root := fs.String("sysfs-root", config.DefaultSysfsRoot, "`dir` where sysfs is mounted (local collection)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var problems []promlint.Problem
	var n int
	if *url != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
		if err != nil {
			return usageError{fmt.Errorf("--url: %w", err)}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("scrape: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("scrape %s: HTTP %s", *url, resp.Status)
		}
		problems, err = promlint.New(resp.Body).Lint()
		if err != nil {
			return fmt.Errorf("lint: %w", err)
		}
	} else {
		cfg := config.Default()
		cfg.SysfsRoot = *root
		if err := config.Validate(cfg); err != nil {
			return usageError{err}
		}
		if err := config.CheckHost(cfg); err != nil {
			return usageError{err}
		}
		log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		reg, err := daemon.NewRegistry(log, buildServices(cfg, log), true)
		if err != nil {
			return err
		}
		mfs, err := reg.Gather()
		if err != nil {
			return fmt.Errorf("gather: %w", err)
		}
		n = len(mfs)
		problems, err = promlint.NewWithMetricFamilies(mfs).Lint()
		if err != nil {
			return fmt.Errorf("lint: %w", err)
		}
	}
	for _, p := range problems {
		fmt.Fprintf(stdout, "%s: %s\n", p.Metric, p.Text)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d lint problem(s)", len(problems))
	}
	if n > 0 {
		fmt.Fprintf(stdout, "ok: %d metric families, no lint problems\n", n)
	} else {
		fmt.Fprintln(stdout, "ok: no lint problems")
	}
	return nil
}
