// Package config holds rvmad's configuration: its defaults, the optional
// JSON config file, the command-line flags that override the file, and the
// validation that runs before the daemon does anything.
//
// Precedence is defaults < config file < flags given on the command line, so
// a flag keeps winning when SIGHUP re-reads the file.
package config

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Defaults of the settings an operator does not give.
const (
	DefaultListen          = ":9470"
	DefaultLogLevel        = "info"
	DefaultLogFormat       = "text"
	DefaultSysfsRoot       = "/sys"
	DefaultShutdownTimeout = 10 * time.Second
)

// Config is everything rvmad can be told. The JSON names are the keys of the
// config file; the flag names are in Flags.
type Config struct {
	// Listen is the TCP address of the HTTP server (/metrics, /healthz,
	// /readyz), host:port; an empty host means every address.
	Listen string `json:"listen"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `json:"log_level"`
	// LogFormat is text or json.
	LogFormat string `json:"log_format"`
	// SysfsRoot is where sysfs is mounted; tests point it at a fixture tree.
	SysfsRoot string `json:"sysfs_root"`
	// Devices are the RDMA devices readiness requires (present, every port
	// ACTIVE). Empty means "whatever exists", and readiness then needs
	// only the devices rvmad provisions.
	Devices []string `json:"devices"`
	// RXE are the SoftRoCE links to provision at start.
	RXE []RXELink `json:"rxe"`
	// RemoveCreatedLinks removes, on shutdown, the rxe links this process
	// created (never links it adopted).
	RemoveCreatedLinks bool `json:"remove_created_links"`
	// ShutdownTimeout bounds a graceful shutdown.
	ShutdownTimeout Duration `json:"shutdown_timeout"`
	// JBMTPinBudgetPages, when not 0, is the JBMT pin budget rvmad sets in
	// the rdmaplus module (its parameter jbmt_pin_budget_pages) at start
	// and on SIGHUP; 0 leaves the module's own.
	JBMTPinBudgetPages uint32 `json:"jbmt_pin_budget_pages"`
	// Sockets is the broker of sockets over RDMA (sockets.go).
	Sockets Sockets `json:"sockets"`
}

// RXELink asks for the SoftRoCE device Name bound to the network device
// Netdev (`rdma link add NAME type rxe netdev NETDEV`).
type RXELink struct {
	Name   string `json:"name"`
	Netdev string `json:"netdev"`
}

// String returns the flag syntax of l, NAME:NETDEV.
func (l RXELink) String() string { return l.Name + ":" + l.Netdev }

// ParseRXELink parses NAME:NETDEV. It fails when either side is missing.
func ParseRXELink(s string) (RXELink, error) {
	name, netdev, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok || name == "" || netdev == "" {
		return RXELink{}, fmt.Errorf("%q is not NAME:NETDEV (e.g. rxe0:eth0)", s)
	}
	return RXELink{Name: name, Netdev: netdev}, nil
}

// Default returns the configuration rvmad runs with when told nothing.
func Default() Config {
	return Config{
		Listen:             DefaultListen,
		LogLevel:           DefaultLogLevel,
		LogFormat:          DefaultLogFormat,
		SysfsRoot:          DefaultSysfsRoot,
		RemoveCreatedLinks: true,
		ShutdownTimeout:    Duration(DefaultShutdownTimeout),
		Sockets:            DefaultSockets(),
	}
}

// Clone returns a deep copy of c.
func (c Config) Clone() Config {
	c.Devices = append([]string(nil), c.Devices...)
	c.RXE = append([]RXELink(nil), c.RXE...)
	return c
}

// RequiredDevices returns the devices readiness waits for: the configured
// devices plus the provisioned rxe links, without duplicates, in order.
func (c Config) RequiredDevices() []string {
	var out []string
	seen := map[string]bool{}
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	for _, d := range c.Devices {
		add(d)
	}
	for _, l := range c.RXE {
		add(l.Name)
	}
	return out
}

// Duration is a time.Duration written in the config file as a Go duration
// string ("10s", "1m30s").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string; it fails on numbers and on strings
// time.ParseDuration rejects.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"10s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}
