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
)

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
}

func newMetrics(gauges func() (int, int)) *metrics {
	m := &metrics{attach: map[string]float64{resultAttached: 0}, demote: map[string]float64{},
		pairing: map[string]float64{}, gaugesFn: gauges}
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
}

func (m *metrics) collect(ch chan<- prometheus.Metric) {
	clients, regs := m.gaugesFn()
	ch <- prometheus.MustNewConstMetric(descClients, prometheus.GaugeValue, float64(clients))
	ch <- prometheus.MustNewConstMetric(descRegistrations, prometheus.GaugeValue, float64(regs))
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
}
