// Package kmodmetrics exports the rdmaplus kernel module's counters (the
// files of one directory under /sys/kernel/rdmaplus, read at each scrape)
// as Prometheus metrics, one rvmad service per directory:
//
//	service       directory                  metrics
//	activeaccess  /sys/kernel/rdmaplus/aa    rdmaplus_aa_*    (Active Access)
//	mailboxes     /sys/kernel/rdmaplus/rvma  rdmaplus_rvma_*  (RVMA's counted mailboxes)
//
// Each service exports
//
//	rdmaplus_<x>_module_loaded  1 when its counters are there, else 0 (and nothing else)
//	rdmaplus_<x>_<state>        gauges
//	rdmaplus_<x>_<event>_total  counters since the module was loaded
//
// A host without the module is not an error: the scrape has
// rdmaplus_<x>_module_loaded 0 and no other rdmaplus_<x>_ metric. A counter
// file that cannot be read or parsed while the directory is there (another
// module version) is a scrape error (rvmad_scrape_errors_total{service=...}).
package kmodmetrics

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
)

// Service is one directory's service; it is its own collector and safe
// for concurrent use. Create it with NewActiveAccess or NewMailboxes.
type Service[S any] struct {
	name    string // the service's name
	what    string // what the counters are of, for logs and errors
	dir     string // the counter directory
	prefix  string // of every metric's name
	read    func(dir string) (S, error)
	loaded  *prometheus.Desc
	metrics []metric[S]
	log     *slog.Logger
}

type metric[S any] struct {
	desc   *prometheus.Desc
	kind   prometheus.ValueType
	value  func(S) float64
	labels []string // the values of desc's variable labels
}

// series is one series of a counter family with a label: the label's
// value, and the counter.
type series[S any] struct {
	value string
	v     func(S) uint64
}

func newService[S any](name, what, sysfsRoot, dir, prefix string, read func(string) (S, error), log *slog.Logger) *Service[S] {
	s := &Service[S]{name: name, what: what, dir: filepath.Join(sysfsRoot, dir), prefix: prefix, read: read, log: log}
	s.loaded = prometheus.NewDesc(prefix+"module_loaded", fmt.Sprintf(
		"1 when the rdmaplus module's %s counters can be read (/sys/%s), 0 when the module is not loaded.", what, dir), nil, nil)
	return s
}

func (s *Service[S]) counter(name, help string, v func(S) uint64) {
	s.metrics = append(s.metrics, metric[S]{prometheus.NewDesc(s.prefix+name+"_total", help, nil, nil),
		prometheus.CounterValue, func(st S) float64 { return float64(v(st)) }, nil})
}

// counterBy adds the counter family name with the variable label label,
// one series per element of all (each its own counter file).
func (s *Service[S]) counterBy(name, help, label string, all ...series[S]) {
	d := prometheus.NewDesc(s.prefix+name+"_total", help, []string{label}, nil)
	for _, x := range all {
		s.metrics = append(s.metrics, metric[S]{d, prometheus.CounterValue,
			func(st S) float64 { return float64(x.v(st)) }, []string{x.value}})
	}
}

func (s *Service[S]) gauge(name, help string, v func(S) uint64) {
	s.metrics = append(s.metrics, metric[S]{prometheus.NewDesc(s.prefix+name, help, nil, nil),
		prometheus.GaugeValue, func(st S) float64 { return float64(v(st)) }, nil})
}

// Name returns the service's name ("activeaccess", "mailboxes").
func (s *Service[S]) Name() string { return s.name }

// Start only logs whether the module is there; it never fails (the module
// may be loaded later, and its metrics then appear).
func (s *Service[S]) Start(context.Context) error {
	if dirExists(s.dir) {
		s.log.Info("rdmaplus module found: exporting its "+s.what+" counters", "dir", s.dir)
	} else {
		s.log.Info("rdmaplus module not loaded: "+s.prefix+"module_loaded is 0 until it is", "dir", s.dir)
	}
	return nil
}

// Stop does nothing: the service owns no resources.
func (s *Service[S]) Stop(context.Context) error { return nil }

// Describe sends every metric's descriptor.
func (s *Service[S]) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.loaded
	for i, m := range s.metrics {
		if i == 0 || s.metrics[i-1].desc != m.desc { // a family's series are adjacent
			ch <- m.desc
		}
	}
}

// Collect implements prometheus.Collector; errors are dropped (use
// CollectErr to see them).
func (s *Service[S]) Collect(ch chan<- prometheus.Metric) { _ = s.CollectErr(ch) }

// CollectErr sends the module_loaded gauge and, when the module is loaded,
// every counter. It returns an error only when the counter directory
// exists but its counters cannot be read (a file missing or not a number:
// another module version); the module's absence is not one.
func (s *Service[S]) CollectErr(ch chan<- prometheus.Metric) error {
	st, err := s.read(s.dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !dirExists(s.dir) {
			ch <- prometheus.MustNewConstMetric(s.loaded, prometheus.GaugeValue, 0)
			return nil
		}
		ch <- prometheus.MustNewConstMetric(s.loaded, prometheus.GaugeValue, 1)
		return fmt.Errorf("%s counters: %w", s.what, err)
	}
	ch <- prometheus.MustNewConstMetric(s.loaded, prometheus.GaugeValue, 1)
	for _, m := range s.metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(st), m.labels...)
	}
	return nil
}

func dirExists(dir string) bool {
	st, err := os.Stat(dir)
	return err == nil && st.IsDir()
}
