package config

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strings"
	"time"
)

// Flags are the command-line flags of `rvmad serve`, bound to a FlagSet by
// BindFlags. Only flags given on the command line override the config file.
type Flags struct {
	fs *flag.FlagSet

	ConfigFile string

	listen          string
	logLevel        string
	logFormat       string
	sysfsRoot       string
	devices         listFlag
	rxe             listFlag
	removeCreated   bool
	shutdownTimeout time.Duration
	jbmtBudget      uint
}

// BindFlags defines rvmad's configuration flags on fs, with the defaults of
// Default.
func BindFlags(fs *flag.FlagSet) *Flags {
	d := Default()
	f := &Flags{fs: fs}
	fs.StringVar(&f.ConfigFile, "config", "", "optional JSON config `file`; flags given on the command line win over it")
	fs.StringVar(&f.listen, "listen", d.Listen, "`host:port` of the HTTP server (/metrics, /healthz, /readyz)")
	fs.StringVar(&f.logLevel, "log-level", d.LogLevel, "log `level`: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", d.LogFormat, "log `format`: text or json")
	fs.StringVar(&f.sysfsRoot, "sysfs-root", d.SysfsRoot, "`dir` where sysfs is mounted (a fixture tree in tests)")
	fs.Var(&f.devices, "device", "RDMA `device` readiness requires (present, ports ACTIVE); repeatable or comma-separated")
	fs.Var(&f.rxe, "rxe", "SoftRoCE link to provision, `NAME:NETDEV` (e.g. rxe0:eth0); repeatable or comma-separated")
	fs.BoolVar(&f.removeCreated, "remove-created-links", d.RemoveCreatedLinks, "on shutdown, remove the rxe links this process created (adopted links are always kept)")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", d.ShutdownTimeout.D(), "upper bound of a graceful shutdown")
	fs.UintVar(&f.jbmtBudget, "jbmt-pin-budget-pages", uint(d.JBMTPinBudgetPages), "JBMT pin budget to set in the rdmaplus module, `pages` per side (0: leave the module's)")
	return f
}

// Apply copies the flags that were set on the command line into cfg. It
// fails when an --rxe value is not NAME:NETDEV, and when --config,
// --device or --rxe is given an empty value (or an empty item of a
// comma-separated list), which would otherwise be silently ignored.
func (f *Flags) Apply(cfg *Config) error {
	var err error
	f.fs.Visit(func(fl *flag.Flag) {
		if err != nil {
			return
		}
		switch fl.Name {
		case "config":
			if f.ConfigFile == "" {
				err = errors.New("flag --config: empty file name (leave the flag out to run without a config file)")
			}
		case "device":
			if f.devices.empty != nil {
				err = fmt.Errorf("flag --device: empty device name in %q", *f.devices.empty)
				return
			}
			cfg.Devices = append([]string(nil), f.devices.vals...)
		case "listen":
			cfg.Listen = f.listen
		case "log-level":
			cfg.LogLevel = f.logLevel
		case "log-format":
			cfg.LogFormat = f.logFormat
		case "sysfs-root":
			cfg.SysfsRoot = f.sysfsRoot
		case "rxe":
			if f.rxe.empty != nil {
				err = fmt.Errorf("flag --rxe: empty NAME:NETDEV in %q", *f.rxe.empty)
				return
			}
			cfg.RXE = nil
			for _, s := range f.rxe.vals {
				l, perr := ParseRXELink(s)
				if perr != nil {
					err = fmt.Errorf("flag --rxe: %w", perr)
					return
				}
				cfg.RXE = append(cfg.RXE, l)
			}
		case "remove-created-links":
			cfg.RemoveCreatedLinks = f.removeCreated
		case "shutdown-timeout":
			cfg.ShutdownTimeout = Duration(f.shutdownTimeout)
		case "jbmt-pin-budget-pages":
			if f.jbmtBudget > math.MaxUint32 {
				err = fmt.Errorf("flag --jbmt-pin-budget-pages: %d is more than %d", f.jbmtBudget, uint32(math.MaxUint32))
				return
			}
			cfg.JBMTPinBudgetPages = uint32(f.jbmtBudget)
		}
	})
	return err
}

// Load builds the configuration: defaults, then the config file if one was
// named, then the flags set on the command line, then Validate and
// CheckHost. Every error names the file, key or flag at fault.
func (f *Flags) Load() (Config, error) {
	cfg := Default()
	if f.ConfigFile != "" {
		var err error
		if cfg, err = LoadFile(f.ConfigFile, cfg); err != nil {
			return cfg, err
		}
	}
	if err := f.Apply(&cfg); err != nil {
		return cfg, err
	}
	err := Validate(cfg)
	if err == nil {
		err = CheckHost(cfg)
	}
	if err != nil {
		if f.ConfigFile != "" {
			return cfg, fmt.Errorf("%w (config file %s, or flags)", err, f.ConfigFile)
		}
		return cfg, err
	}
	return cfg, nil
}

// listFlag is a repeatable flag whose values may also be comma-separated.
// It keeps the first value that had an empty item ("", "a,,b", "a,") for
// Apply to reject.
type listFlag struct {
	vals  []string
	empty *string
}

func (l *listFlag) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(l.vals, ",")
}

func (l *listFlag) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			l.vals = append(l.vals, p)
		} else if l.empty == nil {
			l.empty = &s
		}
	}
	return nil
}
