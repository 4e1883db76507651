package sysfs

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
)

func fixture(name string) FS { return New(filepath.Join("..", "..", "testdata", name)) }

func TestDevicesAndPorts(t *testing.T) {
	fs := fixture("sysfs-hca")
	devs, err := fs.Devices()
	if err != nil || !reflect.DeepEqual(devs, []string{"hca0"}) {
		t.Fatalf("Devices = %v, %v", devs, err)
	}
	ports, err := fs.Ports("hca0")
	if err != nil || !reflect.DeepEqual(ports, []int{1, 2}) {
		t.Fatalf("Ports = %v, %v", ports, err)
	}
	if _, err := fs.Ports("nope0"); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Ports(nope0) = %v, want ErrNoDevice", err)
	}
}

func TestNoRDMA(t *testing.T) {
	fs := New(t.TempDir())
	if _, err := fs.Devices(); !errors.Is(err, ErrNoRDMA) {
		t.Fatalf("Devices on empty root = %v, want ErrNoRDMA", err)
	}
}

func TestRXEPort(t *testing.T) {
	fs := fixture("sysfs-rxe")
	p, err := fs.Port("rxe0", 1)
	if err != nil {
		t.Fatal(err)
	}
	want := PortInfo{Device: "rxe0", Port: 1, State: 4, StateName: "ACTIVE", PhysState: 5, PhysStateName: "LinkUp",
		LinkLayer: "Ethernet", Netdev: "eth0", NetdevMTU: 1500, ActiveMTU: 1024}
	if p != want {
		t.Fatalf("Port =\n%+v, want\n%+v", p, want)
	}
	if r, b, err := fs.PortRate("rxe0", 1); r != "2.5 Gb/sec (1X SDR)" || b != 312.5e6 || err != nil {
		t.Fatalf("PortRate = %q, %v, %v", r, b, err)
	}
	if !p.Active() {
		t.Fatal("ACTIVE port not Active()")
	}
	d, err := fs.Device("rxe0")
	if err != nil || d.Parent != "eth0" || d.NodeType != "1: CA" {
		t.Fatalf("Device = %+v, %v", d, err)
	}
	gids, err := fs.GIDs("rxe0", 1)
	if err != nil || len(gids) != 2 || gids[1].Type != "RoCE v2" || gids[1].Netdev != "eth0" {
		t.Fatalf("GIDs = %+v, %v", gids, err)
	}
	if cd := fs.CharDevices("rxe0"); !reflect.DeepEqual(cd, []string{"/dev/infiniband/uverbs0"}) {
		t.Fatalf("CharDevices = %v", cd)
	}
}

func TestCountersKeepGoodOnesAndReportBad(t *testing.T) {
	fs := fixture("sysfs-hca")
	cs, err := fs.PortCounters("hca0", 1, HWCountersDir)
	if err == nil {
		t.Fatal("broken_counter not reported")
	}
	names := map[string]uint64{}
	for _, c := range cs {
		names[c.Name] = c.Value
	}
	if _, ok := names["broken_counter"]; ok {
		t.Fatal("unparsable counter exported")
	}
	if names["rx-icrc.Errors"] != 8 || names["out_of_buffer"] != 5 {
		t.Fatalf("counters = %v", names)
	}
	// No directory: no counters, no error (rxe has no PMA counters).
	cs, err = fixture("sysfs-rxe").PortCounters("rxe0", 1, CountersDir)
	if err != nil || len(cs) != 0 {
		t.Fatalf("missing dir: %v, %v", cs, err)
	}
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]float64{
		"100 Gb/sec (4X EDR)": 12.5e9,
		"2.5 Gb/sec (1X SDR)": 312.5e6,
	} {
		if got, err := ParseRate(in); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "fast", "10 Mb/sec", "x Gb/sec"} {
		if _, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) accepted", in)
		}
	}
}

func TestRXEActiveMTU(t *testing.T) {
	for in, want := range map[int]int{1500: 1024, 9000: 4096, 4176: 4096, 4175: 2048, 576: 256, 68: 256} {
		if got := RXEActiveMTU(in); got != want {
			t.Errorf("RXEActiveMTU(%d) = %d, want %d", in, got, want)
		}
	}
}

// Two roots read concurrently never see each other's devices: the rdmamap
// paths are swapped under a lock.
func TestConcurrentRoots(t *testing.T) {
	a, b := fixture("sysfs-rxe"), fixture("sysfs-hca")
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				if d, _ := a.Devices(); len(d) != 1 || d[0] != "rxe0" {
					t.Errorf("root a saw %v", d)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				if d, _ := b.Devices(); len(d) != 1 || d[0] != "hca0" {
					t.Errorf("root b saw %v", d)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestNetdevSpeedKnown(t *testing.T) {
	root := t.TempDir()
	for nd, speed := range map[string]string{"virt0": "-1", "eth1": "25000"} {
		dir := filepath.Join(root, "class", "net", nd)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "speed"), []byte(speed+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs := New(root)
	if fs.NetdevSpeedKnown("virt0") || !fs.NetdevSpeedKnown("eth1") || fs.NetdevSpeedKnown("gone0") {
		t.Fatal("wrong answers")
	}
	if !fixture("sysfs-rxe").NetdevSpeedKnown("eth0") {
		t.Fatal("fixture eth0 has a speed")
	}
}
