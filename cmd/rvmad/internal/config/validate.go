package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// MaxShutdownTimeout caps shutdown_timeout: systemd's default stop timeout is
// 90 s and rvmad must finish well before it is killed.
const MaxShutdownTimeout = time.Minute

// FieldError is one invalid setting. Field is the config-file key, Flag the
// command-line flag that sets the same value ("" for keys without one).
type FieldError struct {
	Field string
	Flag  string
	Value string
	Err   error
}

// Error names the key, the flag and the bad value.
func (e *FieldError) Error() string {
	if e.Flag == "" {
		return fmt.Sprintf("invalid %s %q: %v", e.Field, e.Value, e.Err)
	}
	return fmt.Sprintf("invalid %s (flag --%s) %q: %v", e.Field, e.Flag, e.Value, e.Err)
}

// Unwrap returns the reason.
func (e *FieldError) Unwrap() error { return e.Err }

// Validate checks every value of c and returns all problems at once, joined
// (errors.As finds each *FieldError). It checks form only: whether a device
// or netdev exists is the daemon's business at start.
func Validate(c Config) error {
	var errs []error
	bad := func(field, flag, value string, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Flag: flag, Value: value, Err: fmt.Errorf(format, args...)})
	}

	if err := checkListen(c.Listen); err != nil {
		bad("listen", "listen", c.Listen, "%w", err)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log_level", "log-level", c.LogLevel, "want debug, info, warn or error")
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		bad("log_format", "log-format", c.LogFormat, "want text or json")
	}
	if c.SysfsRoot == "" || !filepath.IsAbs(c.SysfsRoot) {
		bad("sysfs_root", "sysfs-root", c.SysfsRoot, "want an absolute path")
	}
	seenDev := map[string]bool{}
	for i, d := range c.Devices {
		field := fmt.Sprintf("devices[%d]", i)
		if err := CheckDeviceName(d); err != nil {
			bad(field, "device", d, "%w", err)
		} else if seenDev[d] {
			bad(field, "device", d, "listed twice")
		}
		seenDev[d] = true
	}
	seenName, seenNetdev := map[string]bool{}, map[string]bool{}
	for i, l := range c.RXE {
		if err := CheckDeviceName(l.Name); err != nil {
			bad(fmt.Sprintf("rxe[%d].name", i), "rxe", l.Name, "%w", err)
		} else if seenName[l.Name] {
			bad(fmt.Sprintf("rxe[%d].name", i), "rxe", l.Name, "listed twice")
		}
		if err := CheckNetdevName(l.Netdev); err != nil {
			bad(fmt.Sprintf("rxe[%d].netdev", i), "rxe", l.Netdev, "%w", err)
		} else if seenNetdev[l.Netdev] {
			bad(fmt.Sprintf("rxe[%d].netdev", i), "rxe", l.Netdev, "listed twice: the kernel allows one rxe link per netdev")
		}
		seenName[l.Name], seenNetdev[l.Netdev] = true, true
	}
	if d := c.ShutdownTimeout.D(); d <= 0 || d > MaxShutdownTimeout {
		bad("shutdown_timeout", "shutdown-timeout", c.ShutdownTimeout.String(), "want more than 0 and at most %v", MaxShutdownTimeout)
	}
	errs = append(errs, validateSockets(c.Sockets)...)
	return errors.Join(errs...)
}

// CheckHost checks what Validate cannot see in the values alone, on this
// host: sysfs_root must be an existing directory (a mistyped one would
// start a daemon that exports nothing). It returns a *FieldError.
func CheckHost(c Config) error {
	fi, err := os.Stat(c.SysfsRoot)
	if err == nil && !fi.IsDir() {
		err = errors.New("not a directory")
	}
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is in the message already
		}
		return &FieldError{Field: "sysfs_root", Flag: "sysfs-root", Value: c.SysfsRoot, Err: err}
	}
	return nil
}

func checkListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port or :port: %w", err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	if host != "" && net.ParseIP(host) == nil && !validHostname(host) {
		return fmt.Errorf("host %q is neither an IP address nor a host name", host)
	}
	return nil
}

func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// CheckDeviceName reports whether s can name an RDMA device: 1 to 63
// printable characters (IB_DEVICE_NAME_MAX is 64 with the NUL), no '/', no
// white space, not "." or "..".
func CheckDeviceName(s string) error {
	return checkName(s, 63)
}

// CheckNetdevName reports whether s can name a network device: 1 to 15
// characters (IFNAMSIZ is 16 with the NUL), no '/', ':' or white space, not
// "." or "..".
func CheckNetdevName(s string) error {
	if strings.Contains(s, ":") {
		return errors.New("a network device name has no ':'")
	}
	return checkName(s, 15)
}

func checkName(s string, max int) error {
	switch {
	case s == "":
		return errors.New("empty name")
	case len(s) > max:
		return fmt.Errorf("longer than %d characters", max)
	case s == "." || s == "..":
		return errors.New("not a name")
	}
	for _, r := range s {
		if r == '/' || r <= ' ' || r == 0x7f {
			return errors.New("has '/', white space or a control character")
		}
	}
	return nil
}
