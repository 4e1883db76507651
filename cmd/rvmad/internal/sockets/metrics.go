package sockets

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

var (
	descClients = prometheus.NewDesc("rdmaplus_sockets_clients",
		"Processes connected to rvmad's sockets Unix socket now.", nil, nil)
	descRegistrations = prometheus.NewDesc("rdmaplus_sockets_registrations",
		"Connections registered with rvmad's sockets broker now, all users.", nil, nil)
	descAttach = prometheus.NewDesc("rdmaplus_sockets_attach_total",
		"Attachments concluded on this host, counted once where the answer passed rvmad: result attached, or the reason of the refusal.", []string{"result"}, nil)
	descDemote = prometheus.NewDesc("rdmaplus_sockets_demote_total",
		"DEMOTE records this host's processes sent through rvmad, by reason (peer: answering the other side's).", []string{"reason"}, nil)
	descPairingErrors = prometheus.NewDesc("rdmaplus_sockets_pairing_errors_total",
		"Failures between this rvmad and peer rvmads on the pairing port, by reason.", []string{"reason"}, nil)

	// From the processes' statistics segments: live processes' values
	// plus the final values of those gone.
	descShimProcesses = prometheus.NewDesc("rdmaplus_sockets_shim_processes",
		"Processes under the shim whose statistics segment rvmad reads now.", nil, nil)
	descShimConns = prometheus.NewDesc("rdmaplus_sockets_shim_connections",
		"Attachable connections of those processes now, by the path their bytes take (rdma: a direction is on RDMA).", []string{"path"}, nil)
	descShimConnsTotal = prometheus.NewDesc("rdmaplus_sockets_shim_connections_total",
		"TCP connections established (connect, accept, adopted) in processes under the shim that handed rvmad their statistics.", nil, nil)
	descShimAttachable = prometheus.NewDesc("rdmaplus_sockets_shim_attachable_total",
		"Connections processes under the shim registered with rvmad (lived the attach delay or moved 64 KiB).", nil, nil)
	descShimUpgrades = prometheus.NewDesc("rdmaplus_sockets_shim_upgrades_total",
		"Attachments of RDMA made in processes under the shim (both ends count theirs).", nil, nil)
	descShimBytes = prometheus.NewDesc("rdmaplus_sockets_shim_bytes_total",
		"Bytes programs under the shim read (in) and wrote (out), by the path that carried them.", []string{"path", "direction"}, nil)
	descShimWrites = prometheus.NewDesc("rdmaplus_sockets_shim_rdma_writes_total",
		"RDMA WRITEs of data posted by processes under the shim.", nil, nil)
	descShimDemotes = prometheus.NewDesc("rdmaplus_sockets_shim_demotes_total",
		"Demotes in processes under the shim, by reason (peer: answering the other side's).", []string{"reason"}, nil)
	descShimFallbacks = prometheus.NewDesc("rdmaplus_sockets_shim_fallbacks_total",
		"Attachable connections that stayed on TCP in processes under the shim, by the reason their attachment was refused or failed.", []string{"reason"}, nil)
	descSegRefused = prometheus.NewDesc("rdmaplus_sockets_shim_segments_refused_total",
		"Statistics segments rvmad did not map, by reason (invalid, limit: the user's cap, duplicate: a second one of a process).", []string{"reason"}, nil)
)

// Reasons of rdmaplus_sockets_shim_segments_refused_total.
const (
	segInvalid   = "invalid"
	segLimit     = "limit"
	segDuplicate = "duplicate"
)

// shimView is what the segments say now: the totals (folded ones
// included), the processes read and their live connections by path.
type shimView struct {
	total     shimCounters
	processes int
	conns     [2]int
}

// resultAttached is the attach_total result of an attachment accepted.
const resultAttached = "attached"

// Reasons of rdmaplus_sockets_pairing_errors_total.
const (
	pairDial      = "dial"       // the peer's pairing port could not be reached
	pairBroken    = "broken"     // a pairing connection failed while records waited
	pairQueueFull = "queue_full" // too many records waited for a peer
	pairMalformed = "malformed"  // a peer sent what is not a message
	pairAddress   = "address"    // a peer sent a record about a connection that is not with it
	pairNoOwner   = "no_owner"   // a peer's record (not an ATTACH_REQ) for a connection no process here registered
)

var pairingReasons = []string{pairDial, pairBroken, pairQueueFull, pairMalformed, pairAddress, pairNoOwner}

// metrics are the broker's counters: aggregates, labelled by fixed sets
// (the protocol's reasons, the pairing errors), never by connection. Every
// label value is exported from the start, at 0.
type metrics struct {
	mu       sync.Mutex
	attach   map[string]float64
	demote   map[string]float64
	pairing  map[string]float64
	gaugesFn func() (clients, registrations int)

	// shimFn reads the segments (nil: none); folded holds the final
	// values of the processes gone, which shimFn adds under the
	// broker's lock, so that no scrape counts a process twice or not at
	// all as it goes.
	shimFn     func() shimView
	folded     shimCounters
	segRefused map[string]float64
}

func newMetrics(gauges func() (int, int)) *metrics {
	m := &metrics{attach: map[string]float64{resultAttached: 0}, demote: map[string]float64{},
		pairing: map[string]float64{}, gaugesFn: gauges,
		segRefused: map[string]float64{segInvalid: 0, segLimit: 0, segDuplicate: 0}}
	for r := sockwire.Reason(1); r <= sockwire.ReasonMax; r++ {
		m.attach[r.String()] = 0
		m.demote[r.String()] = 0
	}
	for _, r := range pairingReasons {
		m.pairing[r] = 0
	}
	return m
}

func (m *metrics) attached() { m.inc(m.attach, resultAttached) }

func (m *metrics) refused(r sockwire.Reason) { m.inc(m.attach, r.String()) }

func (m *metrics) demoted(r sockwire.Reason) { m.inc(m.demote, r.String()) }

func (m *metrics) pairingError(reason string) { m.inc(m.pairing, reason) }

func (m *metrics) segmentRefused(reason string) { m.inc(m.segRefused, reason) }

// fold adds the final values of a process gone (under the broker's lock).
func (m *metrics) fold(c *shimCounters) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.folded.add(c)
}

// foldedTotals returns the values of the processes gone.
func (m *metrics) foldedTotals() shimCounters {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.folded
}

// inc counts one for label, which must be one of the map's fixed keys
// (a decoded reason always is).
func (m *metrics) inc(set map[string]float64, label string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := set[label]; ok {
		set[label]++
	}
}

// get returns a counter's value (tests).
func (m *metrics) get(set func(*metrics) map[string]float64, label string) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return set(m)[label]
}

func (m *metrics) describe(ch chan<- *prometheus.Desc) {
	ch <- descClients
	ch <- descRegistrations
	ch <- descAttach
	ch <- descDemote
	ch <- descPairingErrors
	for _, d := range []*prometheus.Desc{descShimProcesses, descShimConns, descShimConnsTotal, descShimAttachable,
		descShimUpgrades, descShimBytes, descShimWrites, descShimDemotes, descShimFallbacks, descSegRefused} {
		ch <- d
	}
}

func (m *metrics) collect(ch chan<- prometheus.Metric) {
	clients, regs := m.gaugesFn()
	ch <- prometheus.MustNewConstMetric(descClients, prometheus.GaugeValue, float64(clients))
	ch <- prometheus.MustNewConstMetric(descRegistrations, prometheus.GaugeValue, float64(regs))
	v := shimView{total: m.foldedTotals()}
	if m.shimFn != nil {
		v = m.shimFn()
	}
	m.collectShim(ch, &v)
	m.mu.Lock()
	defer m.mu.Unlock()
	for l, v := range m.attach {
		ch <- prometheus.MustNewConstMetric(descAttach, prometheus.CounterValue, v, l)
	}
	for l, v := range m.demote {
		ch <- prometheus.MustNewConstMetric(descDemote, prometheus.CounterValue, v, l)
	}
	for l, v := range m.pairing {
		ch <- prometheus.MustNewConstMetric(descPairingErrors, prometheus.CounterValue, v, l)
	}
	for l, v := range m.segRefused {
		ch <- prometheus.MustNewConstMetric(descSegRefused, prometheus.CounterValue, v, l)
	}
}

func (m *metrics) collectShim(ch chan<- prometheus.Metric, v *shimView) {
	gauge := func(d *prometheus.Desc, x int, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(x), l...)
	}
	counter := func(d *prometheus.Desc, x uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(x), l...)
	}
	t := &v.total
	gauge(descShimProcesses, v.processes)
	for p, name := range pathNames {
		gauge(descShimConns, v.conns[p], name)
		for d, dir := range dirNames {
			counter(descShimBytes, t.bytes[p][d], name, dir)
		}
	}
	counter(descShimConnsTotal, t.conns)
	counter(descShimAttachable, t.attachable)
	counter(descShimUpgrades, t.upgrades)
	counter(descShimWrites, t.rdmaWrites)
	for r := sockwire.Reason(1); r <= sockwire.ReasonMax; r++ {
		counter(descShimDemotes, t.demotes[r], r.String())
		counter(descShimFallbacks, t.fallbacks[r], r.String())
	}
}
