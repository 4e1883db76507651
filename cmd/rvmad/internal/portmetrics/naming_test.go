package portmetrics

import (
	"strings"
	"testing"
)

// rxe61 is what rdma_rxe in Linux 6.1 puts in ports/1/hw_counters.
var rxe61 = []string{"sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "rcvd_rnr_err",
	"send_rnr_err", "rcvd_seq_err", "ack_deferred", "retry_exceeded_err", "retry_rnr_exceeded_err",
	"completer_retry_err", "send_err", "link_downed", "rdma_sends", "rdma_recvs"}

func TestRXENamesAreMappedAndDistinct(t *testing.T) {
	seen := map[string]string{}
	for _, f := range rxe61 {
		s := HWCounterSpec(f, false)
		if strings.Contains(s.Help, "exported under its kernel name") {
			t.Errorf("%s is not mapped", f)
		}
		if !strings.HasPrefix(s.Name, "rvmad_hw_") || !strings.HasSuffix(s.Name, "_total") || s.Kind != Counter {
			t.Errorf("%s -> %s (kind %v)", f, s.Name, s.Kind)
		}
		if prev, ok := seen[s.Name]; ok {
			t.Errorf("%s and %s both -> %s", prev, f, s.Name)
		}
		seen[s.Name] = f
	}
	if got := HWCounterSpec("sent_pkts", false).Name; got != "rvmad_hw_sent_packets_total" {
		t.Errorf("sent_pkts -> %s", got)
	}
}

func TestPMAData(t *testing.T) {
	s := PortCounterSpec("port_xmit_data")
	if s.Name != "rvmad_port_transmitted_bytes_total" || s.Scale != 4 {
		t.Fatalf("port_xmit_data -> %+v", s)
	}
}

func TestUnknownCountersKeepTheirName(t *testing.T) {
	cases := map[string]string{
		"out_of_buffer":     "rvmad_hw_out_of_buffer_total",
		"rx-icrc.Errors":    "rvmad_hw_rx_icrc_errors_total",
		"np_cnp_sent":       "rvmad_hw_np_cnp_sent_total",
		"req_cqe_error":     "rvmad_hw_req_cqe_error_total",
		"weird__name__":     "rvmad_hw_weird_name_total",
		"already_total":     "rvmad_hw_already_total",
		"__":                "rvmad_hw_unnamed_total",
		"1st_counter":       "rvmad_hw_1st_counter_total",
		"Ümlaut and spaces": "rvmad_hw_mlaut_and_spaces_total",
	}
	for in, want := range cases {
		if got := HWCounterSpec(in, false).Name; got != want {
			t.Errorf("%q -> %q, want %q", in, got, want)
		}
	}
	if got := HWCounterSpec("x", true).Name; got != "rvmad_device_hw_x_total" {
		t.Errorf("device-wide x -> %s", got)
	}
	if got := PortCounterSpec("port_new_thing").Name; got != "rvmad_port_port_new_thing_total" {
		t.Errorf("unknown PMA counter -> %s", got)
	}
	if s := HWCounterSpec("lifespan", false); s.Kind != Gauge || s.Name != "rvmad_hw_counters_lifespan_seconds" {
		t.Errorf("lifespan -> %+v", s)
	}
}

func TestCMNames(t *testing.T) {
	seen := map[string]bool{}
	for g := range cmGroups {
		for m := range cmMessages {
			s := CMCounterSpec(g, m)
			if seen[s.Name] || !strings.HasSuffix(s.Name, "_messages_total") {
				t.Errorf("%s/%s -> %s", g, m, s.Name)
			}
			seen[s.Name] = true
		}
	}
	if got := CMCounterSpec("cm_rx_duplicates", "sidr_req").Name; got != "rvmad_cm_received_duplicate_sidr_req_messages_total" {
		t.Errorf("got %s", got)
	}
	if got := CMCounterSpec("cm_new_group", "x-y").Name; got != "rvmad_cm_new_group_x_y_total" {
		t.Errorf("unknown: %s", got)
	}
}
