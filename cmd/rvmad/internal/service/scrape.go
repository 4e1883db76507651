package service

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descScrapeDuration = prometheus.NewDesc("rvmad_scrape_duration_seconds",
		"How long collecting the service's metrics took in this scrape.", []string{"service"}, nil)
	descScrapeSuccess = prometheus.NewDesc("rvmad_scrape_success",
		"1 when collecting the service's metrics had no error in this scrape, else 0.", []string{"service"}, nil)
	descScrapeErrors = prometheus.NewDesc("rvmad_scrape_errors_total",
		"Errors met while collecting the service's metrics (an unreadable counter, a vanished device), since start.", []string{"service"}, nil)
)

// Collector gathers the metrics of services and accounts for each
// collection: rvmad_scrape_duration_seconds, rvmad_scrape_success and
// rvmad_scrape_errors_total, labelled by service. Register it once, instead
// of the services themselves. Safe for concurrent use.
type Collector struct {
	log      *slog.Logger
	services []Service

	mu      sync.Mutex
	errors  map[string]float64
	lastErr map[string]string
}

// NewCollector returns the collector of services.
func NewCollector(log *slog.Logger, services []Service) *Collector {
	c := &Collector{log: log, services: services, errors: map[string]float64{}, lastErr: map[string]string{}}
	for _, s := range services {
		c.errors[s.Name()] = 0
	}
	return c
}

// Describe sends the services' descriptors and the scrape ones.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, s := range c.services {
		s.Describe(ch)
	}
	ch <- descScrapeDuration
	ch <- descScrapeSuccess
	ch <- descScrapeErrors
}

// Collect collects every service, then the scrape metrics of this scrape.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.services {
		name := s.Name()
		start := time.Now()
		var err error
		if fc, ok := s.(FallibleCollector); ok {
			err = fc.CollectErr(ch)
		} else {
			s.Collect(ch)
		}
		took := time.Since(start).Seconds()
		n := countErrors(err)
		success := 1.0
		if n > 0 {
			success = 0
		}
		c.mu.Lock()
		c.errors[name] += float64(n)
		total := c.errors[name]
		c.mu.Unlock()
		c.logChange(name, err)
		ch <- prometheus.MustNewConstMetric(descScrapeDuration, prometheus.GaugeValue, took, name)
		ch <- prometheus.MustNewConstMetric(descScrapeSuccess, prometheus.GaugeValue, success, name)
		ch <- prometheus.MustNewConstMetric(descScrapeErrors, prometheus.CounterValue, total, name)
	}
}

// logChange logs a collection error when it differs from the previous one,
// and the recovery, so a steady failure does not flood the log.
func (c *Collector) logChange(name string, err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	c.mu.Lock()
	prev := c.lastErr[name]
	c.lastErr[name] = msg
	c.mu.Unlock()
	switch {
	case msg != "" && msg != prev:
		c.log.Warn("metrics collection failed in part", "service", name, "err", err)
	case msg == "" && prev != "":
		c.log.Info("metrics collection recovered", "service", name)
	}
}

// countErrors counts the leaves of an errors.Join tree (at least 1 for a
// non-nil error).
func countErrors(err error) int {
	if err == nil {
		return 0
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return 1
	}
	n := 0
	for _, e := range j.Unwrap() {
		n += countErrors(e)
	}
	return max(n, 1)
}
