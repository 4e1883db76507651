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

// Counter directories of a port.
const (
	// CountersDir holds the InfiniBand PMA counters (port_xmit_data ...).
	// Drivers without a PMA, rxe among them, have none.
	CountersDir = "counters"
	// HWCountersDir holds the driver's own counters (rxe: sent_pkts ...),
	// plus the "lifespan" setting in milliseconds.
	HWCountersDir = "hw_counters"
)

// Counter is one file of a counter directory.
type Counter struct {
	Name  string
	Value uint64
}

// PortCounters reads every file of dev's port directory dir (CountersDir or
// HWCountersDir). A missing directory is no counters and no error. A file
// that cannot be read or parsed is left out and reported in the returned
// error (errors.Join of one error per file), next to the counters that were
// read: one bad counter never hides the others, and never reads as 0.
func (f FS) PortCounters(dev string, port int, dir string) ([]Counter, error) {
	return readCounterDir(filepath.Join(f.PortDir(dev, port), dir))
}

// DeviceHWCounters reads the device-wide hw_counters directory that some
// drivers have beside the per-port ones; see PortCounters.
func (f FS) DeviceHWCounters(dev string) ([]Counter, error) {
	return readCounterDir(filepath.Join(f.DeviceDir(dev), HWCountersDir))
}

func readCounterDir(dir string) ([]Counter, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sysfs: %w", err)
	}
	var out []Counter
	var errs []error
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		s, err := readAttr(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("sysfs: %w", err))
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("sysfs: %s: %q is not a counter value", p, s))
			continue
		}
		out = append(out, Counter{Name: e.Name(), Value: v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, errors.Join(errs...)
}

// CMGroups returns the InfiniBand CM counter directories of dev's port
// (cm_tx_msgs, cm_tx_retries, cm_rx_msgs, cm_rx_duplicates, and any other
// cm_* directory a kernel adds), sorted; none when ib_cm is not loaded.
func (f FS) CMGroups(dev string, port int) ([]string, error) {
	ents, err := os.ReadDir(f.PortDir(dev, port))
	if err != nil {
		return nil, fmt.Errorf("sysfs: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), "cm_") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
