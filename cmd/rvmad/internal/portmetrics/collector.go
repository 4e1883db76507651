package portmetrics

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sysfs"
)

// Collector exports every RDMA device's ports from sysfs at each scrape. It
// is an unchecked prometheus.Collector (Describe sends nothing) because the
// counters a driver offers are known only when read. Safe for concurrent
// use.
type Collector struct {
	fs    sysfs.FS
	rates *rateCache
}

// RateTTL is how long the collector reuses a port's rate. Reading the rate
// makes the kernel query the netdev, and virtio-net NICs then log a warning
// ("speed is unknown") in the kernel log each time.
const RateTTL = 5 * time.Minute

// New returns a collector reading the sysfs at fs.
func New(fs sysfs.FS) *Collector { return &Collector{fs: fs, rates: newRateCache(RateTTL)} }

var (
	labels = []string{"device", "port"}

	descDevices = prometheus.NewDesc(Namespace+"_devices",
		"RDMA devices present in sysfs.", nil, nil)
	descState = prometheus.NewDesc(Namespace+"_port_state",
		"Logical port state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.", labels, nil)
	descPhysState = prometheus.NewDesc(Namespace+"_port_physical_state",
		"Physical port state: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, 5 LinkUp, 6 LinkErrorRecovery, 7 PhyTest.", labels, nil)
	descActive = prometheus.NewDesc(Namespace+"_port_active",
		"1 when the port is ACTIVE (or ACTIVE_DEFER), else 0.", labels, nil)
	descRate = prometheus.NewDesc(Namespace+"_port_rate_bytes_per_second",
		"Port data rate the kernel reports (ports/N/rate), in bytes per second.", labels, nil)
	descNetdevMTU = prometheus.NewDesc(Namespace+"_port_netdev_mtu_bytes",
		"MTU of the network device under a RoCE port.", labels, nil)
	descActiveMTU = prometheus.NewDesc(Namespace+"_port_active_mtu_bytes",
		"RDMA path MTU of a SoftRoCE (rxe) port, derived from its netdev MTU.", labels, nil)
)

// Describe sends nothing: the collector is unchecked.
func (c *Collector) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector; errors are dropped (use
// CollectErr to see them).
func (c *Collector) Collect(ch chan<- prometheus.Metric) { _ = c.CollectErr(ch) }

// CollectErr sends the metrics of every device and port it can read and
// returns what it could not read, joined (one error per unreadable device,
// port or counter file). With no RDMA subsystem at all it sends only
// rvmad_devices 0 and returns an error wrapping sysfs.ErrNoRDMA.
func (c *Collector) CollectErr(ch chan<- prometheus.Metric) error {
	devs, err := c.fs.Devices()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(descDevices, prometheus.GaugeValue, 0)
		return err
	}
	ch <- prometheus.MustNewConstMetric(descDevices, prometheus.GaugeValue, float64(len(devs)))
	e := &emitter{ch: ch, owner: map[string]string{}, descs: map[string]*prometheus.Desc{}}
	for _, dev := range devs {
		c.collectDevice(e, dev)
	}
	return errors.Join(e.errs...)
}

func (c *Collector) collectDevice(e *emitter, dev string) {
	ports, err := c.fs.Ports(dev)
	if err != nil {
		e.fail(fmt.Errorf("device %s: %w", dev, err))
		return
	}
	for _, port := range ports {
		c.collectPort(e, dev, port)
	}
	hw, err := c.fs.DeviceHWCounters(dev)
	if err != nil {
		e.fail(fmt.Errorf("device %s: %w", dev, err))
	}
	for _, ctr := range hw {
		e.counter(HWCounterSpec(ctr.Name, true), "<device>/hw_counters/"+ctr.Name, ctr.Value, dev)
	}
}

func (c *Collector) collectPort(e *emitter, dev string, port int) {
	p := strconv.Itoa(port)
	info, err := c.fs.Port(dev, port)
	if err != nil {
		e.fail(fmt.Errorf("device %s port %d: %w", dev, port, err))
	} else {
		active := 0.0
		if info.Active() {
			active = 1
		}
		e.send(prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, float64(info.State), dev, p))
		e.send(prometheus.MustNewConstMetric(descPhysState, prometheus.GaugeValue, float64(info.PhysState), dev, p))
		e.send(prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, active, dev, p))
		if rate, err := c.rates.get(dev, port, c.fs.PortRate); err == nil {
			e.send(prometheus.MustNewConstMetric(descRate, prometheus.GaugeValue, rate, dev, p))
		} else {
			e.fail(fmt.Errorf("device %s port %d: %w", dev, port, err))
		}
		if info.NetdevMTU > 0 {
			e.send(prometheus.MustNewConstMetric(descNetdevMTU, prometheus.GaugeValue, float64(info.NetdevMTU), dev, p))
		}
		if info.ActiveMTU > 0 {
			e.send(prometheus.MustNewConstMetric(descActiveMTU, prometheus.GaugeValue, float64(info.ActiveMTU), dev, p))
		}
	}
	pma, err := c.fs.PortCounters(dev, port, sysfs.CountersDir)
	if err != nil {
		e.fail(fmt.Errorf("device %s port %d: %w", dev, port, err))
	}
	for _, ctr := range pma {
		e.counter(PortCounterSpec(ctr.Name), "counters/"+ctr.Name, ctr.Value, dev, p)
	}
	hw, err := c.fs.PortCounters(dev, port, sysfs.HWCountersDir)
	if err != nil {
		e.fail(fmt.Errorf("device %s port %d: %w", dev, port, err))
	}
	for _, ctr := range hw {
		e.counter(HWCounterSpec(ctr.Name, false), "hw_counters/"+ctr.Name, ctr.Value, dev, p)
	}
	groups, err := c.fs.CMGroups(dev, port)
	if err != nil {
		e.fail(fmt.Errorf("device %s port %d: %w", dev, port, err))
	}
	for _, g := range groups {
		cm, err := c.fs.PortCounters(dev, port, g)
		if err != nil {
			e.fail(fmt.Errorf("device %s port %d: %w", dev, port, err))
		}
		for _, ctr := range cm {
			e.counter(CMCounterSpec(g, ctr.Name), g+"/"+ctr.Name, ctr.Value, dev, p)
		}
	}
}

// emitter sends the metrics of one scrape and guards against two different
// kernel files landing on one metric name (which would make the whole
// scrape fail): the second is reported as an error instead.
type emitter struct {
	ch    chan<- prometheus.Metric
	errs  []error
	owner map[string]string // metric name -> kernel file that owns it
	descs map[string]*prometheus.Desc
}

func (e *emitter) send(m prometheus.Metric) { e.ch <- m }

func (e *emitter) fail(err error) { e.errs = append(e.errs, err) }

func (e *emitter) counter(s Spec, file string, v uint64, labelValues ...string) {
	if prev, ok := e.owner[s.Name]; ok && prev != file {
		e.fail(fmt.Errorf("%s and %s both map to metric %s; %s not exported", prev, file, s.Name, file))
		return
	}
	e.owner[s.Name] = file
	d, ok := e.descs[s.Name]
	if !ok {
		l := labels
		if len(labelValues) == 1 {
			l = labels[:1]
		}
		d = prometheus.NewDesc(s.Name, s.Help, l, nil)
		e.descs[s.Name] = d
	}
	t := prometheus.CounterValue
	if s.Kind == Gauge {
		t = prometheus.GaugeValue
	}
	m, err := prometheus.NewConstMetric(d, t, float64(v)*s.Scale, labelValues...)
	if err != nil {
		e.fail(fmt.Errorf("%s: %w", file, err))
		return
	}
	e.send(m)
}

// rateCache remembers port rates for a while; safe for concurrent use.
type rateCache struct {
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex
	m  map[string]rateEntry
}

type rateEntry struct {
	bytes float64
	at    time.Time
}

func newRateCache(ttl time.Duration) *rateCache {
	return &rateCache{ttl: ttl, now: time.Now, m: map[string]rateEntry{}}
}

// get returns the cached rate of dev's port, reading it with read when it is
// missing or older than the TTL. Errors are not cached.
func (r *rateCache) get(dev string, port int, read func(string, int) (string, float64, error)) (float64, error) {
	key := dev + "/" + strconv.Itoa(port)
	r.mu.Lock()
	e, ok := r.m[key]
	r.mu.Unlock()
	if ok && r.now().Sub(e.at) < r.ttl {
		return e.bytes, nil
	}
	_, b, err := read(dev, port)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	r.m[key] = rateEntry{bytes: b, at: r.now()}
	r.mu.Unlock()
	return b, nil
}
