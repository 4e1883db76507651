package portmetrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestDescsCoverCollected checks Descs against what the collector really
// sends from the fixture trees: every metric with an rvmad name has its
// name and labels in Descs, and only the counters exported under their
// kernel names are missing from it. (The help texts may differ: they name
// the kernel file, and two files can share a metric.)
func TestDescsCoverCollected(t *testing.T) {
	names := map[string]string{} // name -> labels
	for _, d := range Descs() {
		name, labels := nameLabels(t, d)
		if _, ok := names[name]; ok {
			t.Errorf("name described twice: %s", name)
		}
		names[name] = labels
	}
	for _, fx := range []string{"sysfs-rxe", "sysfs-hca"} {
		ch := make(chan prometheus.Metric, 1000)
		_ = New(fixture(fx)).CollectErr(ch)
		close(ch)
		n := 0
		for m := range ch {
			d := m.Desc()
			if strings.Contains(d.String(), "without an rvmad name") {
				continue
			}
			n++
			name, labels := nameLabels(t, d)
			if got, ok := names[name]; !ok || got != labels {
				t.Errorf("%s: collected %s{%s}, Descs has it %v with {%s}", fx, name, labels, ok, got)
			}
		}
		if n == 0 {
			t.Errorf("%s: nothing collected", fx)
		}
	}
	for _, want := range []string{"rvmad_hw_completer_retries_total", "rvmad_device_hw_sent_packets_total",
		"rvmad_cm_received_duplicate_sidr_rep_messages_total", "rvmad_port_vl15_dropped_packets_total",
		"rvmad_hw_counters_lifespan_seconds", "rvmad_port_state"} {
		if _, ok := names[want]; !ok {
			t.Errorf("Descs lacks %s", want)
		}
	}
}

// nameLabels returns the name and the variable labels (comma-separated) of
// d, from its String form.
func nameLabels(t *testing.T, d *prometheus.Desc) (string, string) {
	t.Helper()
	s := d.String()
	const pre, vl = `Desc{fqName: "`, `variableLabels: {`
	i := strings.LastIndex(s, vl)
	if !strings.HasPrefix(s, pre) || i < 0 || !strings.HasSuffix(s, "}}") {
		t.Fatalf("unexpected Desc form %s", s)
	}
	name := s[len(pre):]
	return name[:strings.IndexByte(name, '"')], s[i+len(vl) : len(s)-2]
}
