// Package aametrics is the "activeaccess" service: it exports the rdmaplus
// kernel module's Active Access statistics (the files of
// /sys/kernel/rdmaplus/aa, read at each scrape) as Prometheus metrics:
//
//	rdmaplus_aa_module_loaded      1 when the module's counters are there, else 0 (and nothing else)
//	rdmaplus_aa_<state>            gauges: hooks armed, domains, memory regions, pages
//	rdmaplus_aa_<event>_total      counters since the module was loaded
//
// A host without the module is not an error: the scrape has
// rdmaplus_aa_module_loaded 0 and no other rdmaplus_aa_ metric. A counter
// file that cannot be read or parsed while the module is loaded is a
// scrape error (rvmad_scrape_errors_total{service="activeaccess"}).
package aametrics

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
)

// Dir is the module's counter directory under a sysfs mount.
const Dir = "kernel/rdmaplus/aa"

// Collector reads the counters from one sysfs mount at each scrape. It is
// safe for concurrent use.
type Collector struct {
	dir string
}

// New returns a collector reading under the sysfs mounted at sysfsRoot
// ("/sys", or a fixture tree in tests).
func New(sysfsRoot string) *Collector { return &Collector{dir: filepath.Join(sysfsRoot, Dir)} }

type metric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(kmod.Stats) float64
}

func counter(name, help string, v func(kmod.Stats) uint64) metric {
	return metric{prometheus.NewDesc("rdmaplus_aa_"+name+"_total", help, nil, nil), prometheus.CounterValue,
		func(s kmod.Stats) float64 { return float64(v(s)) }}
}

func gauge(name, help string, v func(kmod.Stats) float64) metric {
	return metric{prometheus.NewDesc("rdmaplus_aa_"+name, help, nil, nil), prometheus.GaugeValue, v}
}

var (
	descLoaded = prometheus.NewDesc("rdmaplus_aa_module_loaded",
		"1 when the rdmaplus module's Active Access counters can be read (/sys/kernel/rdmaplus/aa), 0 when the module is not loaded.", nil, nil)

	metrics = []metric{
		gauge("hooks_armed", "1 while the module's data-path probes on rdma_rxe are registered (some page is active), else 0 (kernel: hooks_armed).",
			func(s kmod.Stats) float64 {
				if s.HooksArmed {
					return 1
				}
				return 0
			}),
		gauge("domains", "Active Access domains (access logs) alive, all processes (kernel: domains).", func(s kmod.Stats) float64 { return float64(s.Domains) }),
		gauge("memory_regions", "Memory regions with at least one active page (kernel: mrs).", func(s kmod.Stats) float64 { return float64(s.MRs) }),
		gauge("pages", "Active 4 KiB pages (kernel: pages).", func(s kmod.Stats) float64 { return float64(s.Pages) }),
		counter("log_entries", "Access log entries written (kernel: entries).", func(s kmod.Stats) uint64 { return s.Entries }),
		counter("log_bytes", "Access log bytes written, entry headers and data (kernel: bytes).", func(s kmod.Stats) uint64 { return s.Bytes }),
		counter("log_data_bytes", "Access data copied into logs (WLD, RLD) (kernel: data_bytes).", func(s kmod.Stats) uint64 { return s.DataBytes }),
		counter("write_packets", "Incoming RDMA WRITE packets that touched an active page (kernel: writes).", func(s kmod.Stats) uint64 { return s.Writes }),
		counter("read_packets", "RDMA READ response packets that touched an active page (kernel: reads).", func(s kmod.Stats) uint64 { return s.Reads }),
		counter("atomics", "Remote atomics that touched an active page (kernel: atomics).", func(s kmod.Stats) uint64 { return s.Atomics }),
		counter("hidden_write_packets", "Write packets kept out of memory by W=0 (kernel: hidden_writes).", func(s kmod.Stats) uint64 { return s.HiddenWrites }),
		counter("zeroed_read_packets", "Read packets served as zeros by R=0 (kernel: zeroed_reads).", func(s kmod.Stats) uint64 { return s.ZeroedReads }),
		counter("refused_write_packets", "Write packets refused because a log was full; the writer got an error (kernel: refused_writes).", func(s kmod.Stats) uint64 { return s.RefusedWrites }),
		counter("refused_atomics", "Atomics refused (W=0, R=0 or a full log); the requester got an error (kernel: refused_atomics).", func(s kmod.Stats) uint64 { return s.RefusedAtomics }),
		counter("lost_read_packets", "Read packets served as zeros because a log was full (kernel: lost_reads).", func(s kmod.Stats) uint64 { return s.LostReads }),
		counter("missed_probes", "Probe hits the kernel skipped, each an access the module did not see; must stay 0 (kernel: missed).", func(s kmod.Stats) uint64 { return s.Missed }),
	}
)

// Describe sends every metric's descriptor.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLoaded
	for _, m := range metrics {
		ch <- m.desc
	}
}

// Collect implements prometheus.Collector; errors are dropped (use
// CollectErr to see them).
func (c *Collector) Collect(ch chan<- prometheus.Metric) { _ = c.CollectErr(ch) }

// CollectErr sends rdmaplus_aa_module_loaded and, when the module is
// loaded, every counter. It returns an error only when the module's
// directory exists but its counters cannot be read (a file missing or not
// a number: another module version); the module's absence is not one.
func (c *Collector) CollectErr(ch chan<- prometheus.Metric) error {
	st, err := kmod.StatsFromDir(c.dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !dirExists(c.dir) {
			ch <- prometheus.MustNewConstMetric(descLoaded, prometheus.GaugeValue, 0)
			return nil
		}
		ch <- prometheus.MustNewConstMetric(descLoaded, prometheus.GaugeValue, 1)
		return fmt.Errorf("active access counters: %w", err)
	}
	ch <- prometheus.MustNewConstMetric(descLoaded, prometheus.GaugeValue, 1)
	for _, m := range metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(st))
	}
	return nil
}
