// Package portmetrics exports the state and every counter of every RDMA
// port as Prometheus metrics, read from sysfs at each scrape.
//
// Names follow <namespace>_<subsystem>_<name>_<unit>, with _total on
// counters and only the labels device and port:
//
//	rvmad_port_*        port state and the InfiniBand PMA counters (ports/N/counters)
//	rvmad_hw_*          the driver's own counters (ports/N/hw_counters), e.g. rxe's
//	rvmad_device_hw_*   device-wide driver counters (<dev>/hw_counters), label device only
//	rvmad_cm_*          the InfiniBand connection manager's counters (ports/N/cm_*)
//
// Counters rvmad knows get a clear name (rxe's sent_pkts becomes
// rvmad_hw_sent_packets_total); every other counter is still exported, under
// its kernel name made metric-safe (rvmad_hw_<name>_total).
package portmetrics

import (
	"strings"
)

// Namespace is the first word of every rvmad metric.
const Namespace = "rvmad"

// Kind tells a counter from a gauge.
type Kind int

// Metric kinds.
const (
	Counter Kind = iota
	Gauge
)

// Spec says how one kernel counter file becomes a metric.
type Spec struct {
	Name  string  // full metric name
	Help  string  // HELP text; constant for a Name
	Kind  Kind    // Counter or Gauge
	Scale float64 // multiply the kernel value by this
}

type known struct {
	name, help string
	scale      float64
}

// pmaCounters maps the files of ports/N/counters (the InfiniBand PortCounters
// and PortCountersExtended attributes) to metric names under rvmad_port_.
var pmaCounters = map[string]known{
	"port_xmit_data":                  {"transmitted_bytes", "Bytes transmitted on the port, all VLs (PMA PortXmitData, kernel value x4)", 4},
	"port_rcv_data":                   {"received_bytes", "Bytes received on the port, all VLs (PMA PortRcvData, kernel value x4)", 4},
	"port_xmit_packets":               {"transmitted_packets", "Packets transmitted on the port (PMA PortXmitPkts)", 1},
	"port_rcv_packets":                {"received_packets", "Packets received on the port (PMA PortRcvPkts)", 1},
	"port_unicast_xmit_packets":       {"unicast_transmitted_packets", "Unicast packets transmitted (PMA PortUnicastXmitPkts)", 1},
	"port_unicast_rcv_packets":        {"unicast_received_packets", "Unicast packets received (PMA PortUnicastRcvPkts)", 1},
	"port_multicast_xmit_packets":     {"multicast_transmitted_packets", "Multicast packets transmitted (PMA PortMulticastXmitPkts)", 1},
	"port_multicast_rcv_packets":      {"multicast_received_packets", "Multicast packets received (PMA PortMulticastRcvPkts)", 1},
	"unicast_xmit_packets":            {"unicast_transmitted_packets", "Unicast packets transmitted (PMA PortUnicastXmitPkts)", 1},
	"unicast_rcv_packets":             {"unicast_received_packets", "Unicast packets received (PMA PortUnicastRcvPkts)", 1},
	"multicast_xmit_packets":          {"multicast_transmitted_packets", "Multicast packets transmitted (PMA PortMulticastXmitPkts)", 1},
	"multicast_rcv_packets":           {"multicast_received_packets", "Multicast packets received (PMA PortMulticastRcvPkts)", 1},
	"symbol_error":                    {"symbol_errors", "Minor link errors detected on one or more physical lanes (PMA SymbolErrorCounter)", 1},
	"link_error_recovery":             {"link_error_recoveries", "Successful link error recovery processes (PMA LinkErrorRecoveryCounter)", 1},
	"link_downed":                     {"link_downed", "Times the link error recovery failed and the link went down (PMA LinkDownedCounter)", 1},
	"port_rcv_errors":                 {"receive_errors", "Received packets containing an error (PMA PortRcvErrors)", 1},
	"port_rcv_remote_physical_errors": {"receive_remote_physical_errors", "Received packets marked with the EBP delimiter (PMA PortRcvRemotePhysicalErrors)", 1},
	"port_rcv_switch_relay_errors":    {"receive_switch_relay_errors", "Received packets discarded because they could not be forwarded (PMA PortRcvSwitchRelayErrors)", 1},
	"port_xmit_discards":              {"transmit_discards", "Outbound packets discarded because the port was down or congested (PMA PortXmitDiscards)", 1},
	"port_xmit_constraint_errors":     {"transmit_constraint_errors", "Packets not transmitted because of outbound raw filtering (PMA PortXmitConstraintErrors)", 1},
	"port_rcv_constraint_errors":      {"receive_constraint_errors", "Packets discarded because of inbound raw filtering (PMA PortRcvConstraintErrors)", 1},
	"local_link_integrity_errors":     {"local_link_integrity_errors", "Times local physical errors exceeded the threshold (PMA LocalLinkIntegrityErrors)", 1},
	"excessive_buffer_overrun_errors": {"excessive_buffer_overrun_errors", "Times consecutive flow control update periods had buffer overruns (PMA ExcessiveBufferOverrunErrors)", 1},
	"VL15_dropped":                    {"vl15_dropped_packets", "Incoming VL15 packets dropped for lack of buffers (PMA VL15Dropped)", 1},
	"port_xmit_wait":                  {"transmit_wait_ticks", "Ticks during which the port had data to send but no flow-control credits (PMA PortXmitWait)", 1},
}

// hwCounters maps the counter files of rxe's hw_counters (6.1:
// rxe_hw_counters.c, plus the byte counters newer kernels add) to metric
// names under rvmad_hw_.
var hwCounters = map[string]known{
	"sent_pkts":              {"sent_packets", "Packets the driver sent, loopback included", 1},
	"rcvd_pkts":              {"received_packets", "Packets the driver received and accepted, loopback included", 1},
	"duplicate_request":      {"duplicate_requests", "Duplicate request packets received by the responder", 1},
	"out_of_seq_request":     {"out_of_sequence_requests", "Out-of-sequence request packets received by the responder", 1},
	"rcvd_rnr_err":           {"received_rnr_naks", "RNR NAKs received by the requester", 1},
	"send_rnr_err":           {"sent_rnr_naks", "RNR NAKs sent by the responder: no receive WQE posted", 1},
	"rcvd_seq_err":           {"received_sequence_naks", "PSN sequence error NAKs received by the completer", 1},
	"ack_deferred":           {"deferred_acks", "Acknowledgements whose processing the completer deferred", 1},
	"retry_exceeded_err":     {"retry_exceeded_errors", "Work requests failed because the transport retry count was exhausted", 1},
	"retry_rnr_exceeded_err": {"rnr_retry_exceeded_errors", "Work requests failed because the RNR retry count was exhausted", 1},
	"completer_retry_err":    {"completer_retries", "Retransmissions started by the completer, e.g. after a timeout or a sequence NAK", 1},
	"send_err":               {"send_errors", "Packets the driver failed to hand to the network stack", 1},
	"link_downed":            {"link_downed", "Times the driver saw its network device go down", 1},
	"rdma_sends":             {"completed_sends", "SEND work requests (with or without immediate or invalidate) the requester completed", 1},
	"rdma_recvs":             {"completed_receives", "Receive work requests the responder completed", 1},
	// Newer kernels (after 6.1) add byte counters.
	"sent_bytes": {"sent_bytes", "Bytes the driver sent, loopback included (newer kernels)", 1},
	"rcvd_bytes": {"received_bytes", "Bytes the driver received (newer kernels)", 1},
}

// lifespanFile is the hw_counters setting (milliseconds the driver caches
// its counters), not a counter.
const lifespanFile = "lifespan"

// PortCounterSpec names a file of ports/N/counters.
//
// Every HELP text ends with "(kernel: <path of the file>)" so an operator,
// or a test, can find the metric of a kernel counter.
func PortCounterSpec(file string) Spec {
	ref := " (kernel: ports/N/counters/" + file + ")."
	if k, ok := pmaCounters[file]; ok {
		return Spec{Name: Namespace + "_port_" + k.name + "_total", Help: k.help + ref, Kind: Counter, Scale: k.scale}
	}
	return Spec{
		Name:  Namespace + "_port_" + Sanitize(file) + "_total",
		Help:  "Port counter without an rvmad name, exported under its kernel name" + ref,
		Kind:  Counter,
		Scale: 1,
	}
}

// HWCounterSpec names a file of ports/N/hw_counters, or, with device set, of
// the device-wide <dev>/hw_counters.
func HWCounterSpec(file string, device bool) Spec {
	prefix, ref := Namespace+"_hw_", " (kernel: ports/N/hw_counters/"+file+")."
	if device {
		prefix, ref = Namespace+"_device_hw_", " (device-wide; kernel: hw_counters/"+file+")."
	}
	if file == lifespanFile {
		return Spec{Name: prefix + "counters_lifespan_seconds", Help: "How long the driver caches its hw_counters" + ref, Kind: Gauge, Scale: 0.001}
	}
	if k, ok := hwCounters[file]; ok {
		return Spec{Name: prefix + k.name + "_total", Help: k.help + ref, Kind: Counter, Scale: k.scale}
	}
	return Spec{
		Name:  prefix + Sanitize(file) + "_total",
		Help:  "Driver counter without an rvmad name, exported under its kernel name" + ref,
		Kind:  Counter,
		Scale: 1,
	}
}

// Sanitize turns a kernel file name into a metric-name word: lower case,
// runs of characters other than [a-z0-9] become one '_', no '_' at either
// end, and no "_total" at the end (the caller adds it). "" becomes
// "unnamed".
func Sanitize(s string) string {
	var b strings.Builder
	under := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			under = false
			continue
		}
		if !under && b.Len() > 0 {
			b.WriteByte('_')
			under = true
		}
	}
	out := strings.TrimSuffix(strings.TrimRight(b.String(), "_"), "_total")
	if out == "" || out == "total" {
		return "unnamed"
	}
	return out
}
