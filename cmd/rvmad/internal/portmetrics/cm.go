package portmetrics

import "strings"

// cmGroups maps the InfiniBand CM counter directories of a port (ib_cm,
// drivers/infiniband/core/cm.c) to the verb of the metric name.
var cmGroups = map[string]struct{ verb, help string }{
	"cm_tx_msgs":       {"sent", "sent"},
	"cm_tx_retries":    {"retried", "retransmitted"},
	"cm_rx_msgs":       {"received", "received"},
	"cm_rx_duplicates": {"received_duplicate", "received as duplicates"},
}

// cmMessages are the CM message types, one counter file each.
var cmMessages = map[string]string{
	"req": "REQ", "mra": "MRA", "rej": "REJ", "rep": "REP", "rtu": "RTU", "dreq": "DREQ",
	"drep": "DREP", "sidr_req": "SIDR_REQ", "sidr_rep": "SIDR_REP", "lap": "LAP", "apr": "APR",
}

// CMCounterSpec names the file of a port's CM counter directory group
// (cm_tx_msgs/req becomes rvmad_cm_sent_req_messages_total). Unknown groups
// and files keep their kernel names: rvmad_cm_<group>_<file>_total.
func CMCounterSpec(group, file string) Spec {
	ref := " (kernel: ports/N/" + group + "/" + file + ")."
	g, okG := cmGroups[group]
	m, okM := cmMessages[file]
	if okG && okM {
		return Spec{
			Name:  Namespace + "_cm_" + g.verb + "_" + file + "_messages_total",
			Help:  "Connection manager " + m + " messages " + g.help + " on the port" + ref,
			Kind:  Counter,
			Scale: 1,
		}
	}
	return Spec{
		Name:  Namespace + "_cm_" + Sanitize(strings.TrimPrefix(group, "cm_")) + "_" + Sanitize(file) + "_total",
		Help:  "Connection manager counter without an rvmad name, exported under its kernel name" + ref,
		Kind:  Counter,
		Scale: 1,
	}
}
