package rvma

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports an endpoint's counters and those of its windows as
// Prometheus metrics, read at each scrape (Endpoint.Stats, Window.Stats).
// Window metrics carry the labels endpoint (the listening address) and
// mailbox (hexadecimal, as the paper writes them); endpoint metrics carry
// endpoint. A window's counters start at zero when it is opened and its
// series disappear once its mailbox is freed. After the endpoint is closed
// a scrape reports rvma_endpoint_up 0 and nothing else. Safe for
// concurrent use; register it with prometheus.MustRegister or a registry of
// your own. (rvmad runs no endpoint: it exports the kernel module's RVMA
// counters, rdmaplus_rvma_*, which cover every process's counted windows.)
type Collector struct {
	ep *Endpoint
}

// NewCollector returns a collector for ep.
func NewCollector(ep *Endpoint) *Collector { return &Collector{ep: ep} }

var (
	epLabels  = []string{"endpoint"}
	winLabels = []string{"endpoint", "mailbox"}

	descUp           = prometheus.NewDesc("rvma_endpoint_up", "1 while the RVMA endpoint is open, 0 once it is closed.", epLabels, nil)
	descLinks        = prometheus.NewDesc("rvma_endpoint_links", "Links this endpoint dialled to peer endpoints (its puts travel on them), connected or being connected.", epLabels, nil)
	descRefused      = prometheus.NewDesc("rvma_endpoint_refused_writes_total", "Puts the NIC refused into this endpoint's windows (keys of buffers already handed over).", epLabels, nil)
	descUnknown      = prometheus.NewDesc("rvma_endpoint_unknown_arrivals_total", "Arrivals for no window, or malformed.", epLabels, nil)
	descStalePuts    = prometheus.NewDesc("rvma_endpoint_stale_puts_total", "This endpoint's puts refused because their epoch had completed.", epLabels, nil)
	descLatePuts     = prometheus.NewDesc("rvma_endpoint_late_puts_total", "This endpoint's puts that receivers reported as landing after their epoch's threshold (overshoot).", epLabels, nil)
	descLinkFailures = prometheus.NewDesc("rvma_endpoint_links_lost_total", "Links that ended other than by this endpoint's Close: the peer disconnected or died, or an error.", epLabels, nil)
	descRejected     = prometheus.NewDesc("rvma_endpoint_rejected_connections_total", "Connection requests refused (not RVMA, or a bad hello).", epLabels, nil)
	descLostNotices  = prometheus.NewDesc("rvma_endpoint_lost_notices_total", "Descriptor updates, and reports of late or refused puts, that could not be sent to their peer and will not be (its link failed, or a queue overflowed).", epLabels, nil)
	descNotices      = prometheus.NewDesc("rvma_endpoint_notices_total", "Descriptor updates pushed to senders (one post each).", epLabels, nil)
	descBufferWaits  = prometheus.NewDesc("rvma_endpoint_buffer_waits_total", "Times a put found no buffer posted for its epoch and waited for the receiver to post one.", epLabels, nil)
	descGetsServed   = prometheus.NewDesc("rvma_endpoint_gets_served_total", "Peers' Gets answered with a kept buffer.", epLabels, nil)
	descGetsRefused  = prometheus.NewDesc("rvma_endpoint_gets_refused_total", "Peers' Gets refused: the epoch had not completed or was no longer kept, or no such window.", epLabels, nil)
	descCopyRegs     = prometheus.NewDesc("rvma_endpoint_copy_registrations_total", "This endpoint's puts from and Gets into memory outside Alloc that registered a copy of their own (larger than 4 KiB, or every kept chunk lent).", epLabels, nil)
	descWindows      = prometheus.NewDesc("rvma_endpoint_windows", "Windows whose mailbox is reserved (open, or closed and lingering).", epLabels, nil)
	descPuts         = prometheus.NewDesc("rvma_window_puts_total", "Puts counted into the window's epochs.", winLabels, nil)
	descBytes        = prometheus.NewDesc("rvma_window_bytes_total", "Bytes counted into the window's epochs.", winLabels, nil)
	descEpochs       = prometheus.NewDesc("rvma_window_epochs_completed_total", "Epochs handed over to the application (threshold or IncEpoch).", winLabels, nil)
	descPosted       = prometheus.NewDesc("rvma_window_buffers_posted", "Buffers posted to the window and not yet handed over (free for puts).", winLabels, nil)
	descHeld         = prometheus.NewDesc("rvma_window_buffers_held", "Buffers handed over to the application and not yet released.", winLabels, nil)
	descLate         = prometheus.NewDesc("rvma_window_overshoot_puts_total", "Puts that arrived after their epoch's threshold, before hand-over (counted in the record).", winLabels, nil)
	descStale        = prometheus.NewDesc("rvma_window_stale_puts_total", "Puts that arrived for an epoch already handed over, or after Close.", winLabels, nil)
	descNacks        = prometheus.NewDesc("rvma_window_nacks_total", "Puts refused with a NACK after the window closed.", winLabels, nil)
	descDrops        = prometheus.NewDesc("rvma_window_drops_total", "Puts dropped silently after the window closed.", winLabels, nil)
	descModRefused   = prometheus.NewDesc("rvma_window_module_refused_packets_total", "Write packets the kernel module refused for the window (a closed buffer, or a buffer's edge); 0 when the library counts.", winLabels, nil)
	collectorDescs   = []*prometheus.Desc{descUp, descLinks, descRefused, descUnknown, descStalePuts, descLatePuts, descLinkFailures, descRejected, descLostNotices, descNotices, descBufferWaits, descGetsServed, descGetsRefused, descCopyRegs, descWindows, descPuts, descBytes, descEpochs, descPosted, descHeld, descLate, descStale, descNacks, descDrops, descModRefused}
)

// Describe sends the descriptions of every metric the collector exports.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range collectorDescs {
		ch <- d
	}
}

// Collect reads the counters and sends them.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	addr := c.ep.Addr().String()
	if c.ep.use() != nil {
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 0, addr)
		return
	}
	ws := c.ep.Windows()
	st := c.ep.Stats()
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	gauge(descUp, 1, addr)
	gauge(descLinks, float64(st.Links), addr)
	counter(descRefused, st.RefusedWrites, addr)
	counter(descUnknown, st.UnknownRecv, addr)
	counter(descStalePuts, st.StalePuts, addr)
	counter(descLatePuts, st.LatePuts, addr)
	counter(descLinkFailures, st.LinkFailures, addr)
	counter(descRejected, st.Rejected, addr)
	counter(descLostNotices, st.LostNotices, addr)
	counter(descNotices, st.Notices, addr)
	counter(descBufferWaits, st.BufferWaits, addr)
	counter(descGetsServed, st.GetsServed, addr)
	counter(descGetsRefused, st.GetsRefused, addr)
	counter(descCopyRegs, st.CopyRegistrations, addr)
	gauge(descWindows, float64(len(ws)), addr)
	for _, w := range ws {
		mb := w.Mailbox().String()
		s := w.Stats()
		counter(descPuts, s.Puts, addr, mb)
		counter(descBytes, s.Bytes, addr, mb)
		counter(descEpochs, s.EpochsCompleted, addr, mb)
		gauge(descPosted, float64(s.Posted), addr, mb)
		gauge(descHeld, float64(s.Held), addr, mb)
		counter(descLate, s.Late, addr, mb)
		counter(descStale, s.Stale, addr, mb)
		counter(descNacks, s.Nacks, addr, mb)
		counter(descDrops, s.Drops, addr, mb)
		counter(descModRefused, s.RefusedPackets, addr, mb)
	}
}
