// Package sysfs reads the RDMA part of sysfs under an injectable root, so
// the same code reads /sys on a host and a fixture tree in tests.
//
// Device and port discovery and the character-device map go through
// github.com/Mellanox/rdmamap, whose paths are package variables; this
// package points them at the root for the duration of each call, under a
// lock (see rdmamap.go). Counters and attributes are read here directly,
// because rdmamap turns an unreadable counter into a silent zero and drops a
// port's counters when it has no hw_counters directory.
package sysfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ErrNoRDMA is wrapped by the errors of FS methods when the root has no
// class/infiniband directory: ib_core is not loaded, or the root is wrong.
var ErrNoRDMA = errors.New("no RDMA subsystem in sysfs (is ib_core loaded?)")

// ErrNoDevice is wrapped when a named RDMA device does not exist.
var ErrNoDevice = errors.New("no such RDMA device")

// ErrNoNetdev is wrapped when a named network device does not exist.
var ErrNoNetdev = errors.New("no such network device")

// FS is sysfs mounted at Root ("/sys" on a live system). The zero value is
// not usable; FS values are cheap to copy and safe for concurrent use.
type FS struct {
	Root string
}

// New returns the sysfs mounted at root.
func New(root string) FS { return FS{Root: filepath.Clean(root)} }

// ClassDir is <root>/class/infiniband.
func (f FS) ClassDir() string { return filepath.Join(f.Root, "class", "infiniband") }

// DeviceDir is <root>/class/infiniband/<dev>.
func (f FS) DeviceDir(dev string) string { return filepath.Join(f.ClassDir(), dev) }

// PortDir is <root>/class/infiniband/<dev>/ports/<port>.
func (f FS) PortDir(dev string, port int) string {
	return filepath.Join(f.DeviceDir(dev), "ports", strconv.Itoa(port))
}

// CheckClass fails with ErrNoRDMA when the root has no class/infiniband
// directory, and with the underlying error when it cannot be read.
func (f FS) CheckClass() error {
	st, err := os.Stat(f.ClassDir())
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", f.ClassDir(), ErrNoRDMA)
	}
	if err != nil {
		return fmt.Errorf("sysfs: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory: %w", f.ClassDir(), ErrNoRDMA)
	}
	return nil
}

// HasDevice reports whether the RDMA device dev exists. It fails only when
// sysfs cannot be read.
func (f FS) HasDevice(dev string) (bool, error) {
	if err := f.CheckClass(); err != nil {
		return false, err
	}
	_, err := os.Stat(f.DeviceDir(dev))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("sysfs: %w", err)
	}
	return true, nil
}

// Devices returns the names of the RDMA devices, sorted. It fails with
// ErrNoRDMA when there is no RDMA subsystem; no devices is not an error.
func (f FS) Devices() ([]string, error) {
	if err := f.CheckClass(); err != nil {
		return nil, err
	}
	var devs []string
	f.withRdmamap(func() { devs = rdmamapDeviceList() })
	sort.Strings(devs)
	return devs, nil
}

// Ports returns the port numbers of dev, ascending. It fails with
// ErrNoDevice when dev does not exist, and when a port directory is not a
// number.
func (f FS) Ports(dev string) ([]int, error) {
	ok, err := f.HasDevice(dev)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%s: %w", dev, ErrNoDevice)
	}
	var names []string
	f.withRdmamap(func() { names = rdmamapPorts(dev) })
	ports := make([]int, 0, len(names))
	for _, n := range names {
		p, err := strconv.Atoi(n)
		if err != nil || p < 0 {
			return nil, fmt.Errorf("%s: port directory %q is not a port number", f.DeviceDir(dev), n)
		}
		ports = append(ports, p)
	}
	sort.Ints(ports)
	return ports, nil
}

// CharDevices returns the /dev paths of dev's character devices (uverbs,
// umad, issm, ucm, and rdma_cm when it exists), as rdmamap finds them.
func (f FS) CharDevices(dev string) []string {
	var out []string
	f.withRdmamap(func() { out = rdmamapCharDevices(dev) })
	sort.Strings(out)
	return out
}

// readAttr reads a one-line sysfs attribute and trims the newline.
func readAttr(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// readOptional reads an attribute that a driver may not have: a missing file
// is "" and no error.
func readOptional(path string) (string, error) {
	s, err := readAttr(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	return s, err
}
