package portmetrics

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sysfs"
)

func fixture(name string) sysfs.FS {
	return sysfs.New(filepath.Join("..", "..", "testdata", name))
}

func TestCollectorRXE(t *testing.T) {
	c := New(fixture("sysfs-rxe"))
	want := `
# HELP rvmad_hw_sent_packets_total Packets the driver sent, loopback included (kernel: ports/N/hw_counters/sent_pkts).
# TYPE rvmad_hw_sent_packets_total counter
rvmad_hw_sent_packets_total{device="rxe0",port="1"} 1000
# HELP rvmad_hw_received_packets_total Packets the driver received and accepted, loopback included (kernel: ports/N/hw_counters/rcvd_pkts).
# TYPE rvmad_hw_received_packets_total counter
rvmad_hw_received_packets_total{device="rxe0",port="1"} 990
# HELP rvmad_port_state Logical port state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.
# TYPE rvmad_port_state gauge
rvmad_port_state{device="rxe0",port="1"} 4
# HELP rvmad_port_active_mtu_bytes RDMA path MTU of a SoftRoCE (rxe) port, derived from its netdev MTU.
# TYPE rvmad_port_active_mtu_bytes gauge
rvmad_port_active_mtu_bytes{device="rxe0",port="1"} 1024
# HELP rvmad_devices RDMA devices present in sysfs.
# TYPE rvmad_devices gauge
rvmad_devices 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"rvmad_hw_sent_packets_total", "rvmad_hw_received_packets_total", "rvmad_port_state",
		"rvmad_port_active_mtu_bytes", "rvmad_devices"); err != nil {
		t.Fatal(err)
	}
	// Every counter is there: 15 hw counters + lifespan + 4x11 CM counters
	// + 6 port gauges + rvmad_devices.
	if n, want := testutil.CollectAndCount(c), 15+1+44+6+1; n != want {
		t.Fatalf("%d metrics, want %d", n, want)
	}
	cm := `
# HELP rvmad_cm_sent_req_messages_total Connection manager REQ messages sent on the port (kernel: ports/N/cm_tx_msgs/req).
# TYPE rvmad_cm_sent_req_messages_total counter
rvmad_cm_sent_req_messages_total{device="rxe0",port="1"} 3
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(cm), "rvmad_cm_sent_req_messages_total"); err != nil {
		t.Fatal(err)
	}
	if err := c.CollectErr(make(chan prometheus.Metric, 100)); err != nil {
		t.Fatalf("errors on a clean fixture: %v", err)
	}
	lintClean(t, c)
}

func TestCollectorHCA(t *testing.T) {
	c := New(fixture("sysfs-hca"))
	want := `
# HELP rvmad_port_transmitted_bytes_total Bytes transmitted on the port, all VLs (PMA PortXmitData, kernel value x4) (kernel: ports/N/counters/port_xmit_data).
# TYPE rvmad_port_transmitted_bytes_total counter
rvmad_port_transmitted_bytes_total{device="hca0",port="1"} 1000
rvmad_port_transmitted_bytes_total{device="hca0",port="2"} 0
# HELP rvmad_hw_rx_icrc_errors_total Driver counter without an rvmad name, exported under its kernel name (kernel: ports/N/hw_counters/rx-icrc.Errors).
# TYPE rvmad_hw_rx_icrc_errors_total counter
rvmad_hw_rx_icrc_errors_total{device="hca0",port="1"} 8
# HELP rvmad_device_hw_dev_internal_queue_oos_total Driver counter without an rvmad name, exported under its kernel name (device-wide; kernel: hw_counters/dev_internal_queue_oos).
# TYPE rvmad_device_hw_dev_internal_queue_oos_total counter
rvmad_device_hw_dev_internal_queue_oos_total{device="hca0"} 3
# HELP rvmad_port_active 1 when the port is ACTIVE (or ACTIVE_DEFER), else 0.
# TYPE rvmad_port_active gauge
rvmad_port_active{device="hca0",port="1"} 1
rvmad_port_active{device="hca0",port="2"} 0
# HELP rvmad_port_link_downed_total Times the link error recovery failed and the link went down (PMA LinkDownedCounter) (kernel: ports/N/counters/link_downed).
# TYPE rvmad_port_link_downed_total counter
rvmad_port_link_downed_total{device="hca0",port="1"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"rvmad_port_transmitted_bytes_total", "rvmad_hw_rx_icrc_errors_total",
		"rvmad_device_hw_dev_internal_queue_oos_total", "rvmad_port_active", "rvmad_port_link_downed_total"); err != nil {
		t.Fatal(err)
	}
	err := c.CollectErr(make(chan prometheus.Metric, 1000))
	if err == nil || !strings.Contains(err.Error(), "broken_counter") {
		t.Fatalf("want the broken counter reported, got %v", err)
	}
	lintClean(t, c)
}

func TestCollectorNoRDMA(t *testing.T) {
	c := New(sysfs.New(t.TempDir()))
	ch := make(chan prometheus.Metric, 10)
	if err := c.CollectErr(ch); err == nil {
		t.Fatal("no error without an RDMA subsystem")
	}
	if len(ch) != 1 {
		t.Fatalf("want only rvmad_devices, got %d metrics", len(ch))
	}
}

func lintClean(t *testing.T, c prometheus.Collector) {
	t.Helper()
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestRateIsCached(t *testing.T) {
	r := newRateCache(time.Minute)
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	reads := 0
	read := func(string, int) (string, float64, error) { reads++; return "", 42, nil }
	for i := 0; i < 3; i++ {
		if v, err := r.get("d", 1, read); v != 42 || err != nil {
			t.Fatal(v, err)
		}
	}
	if reads != 1 {
		t.Fatalf("%d reads within the TTL", reads)
	}
	now = now.Add(2 * time.Minute)
	_, _ = r.get("d", 1, read)
	if reads != 2 {
		t.Fatalf("not re-read after the TTL")
	}
	bad := func(string, int) (string, float64, error) { return "", 0, errors.New("x") }
	if _, err := r.get("e", 1, bad); err == nil {
		t.Fatal("error lost")
	}
}
