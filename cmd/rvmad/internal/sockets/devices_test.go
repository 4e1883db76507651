package sockets

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

func TestParseUevent(t *testing.T) {
	for _, c := range []struct {
		name, in                string
		action, subsystem, path string
	}{
		{"uverbs removed", "remove@/devices/virtual/infiniband_verbs/uverbs0\x00ACTION=remove\x00DEVPATH=/devices/virtual/infiniband_verbs/uverbs0\x00SUBSYSTEM=infiniband_verbs\x00MAJOR=231\x00MINOR=192\x00DEVNAME=infiniband/uverbs0\x00SEQNUM=2040\x00",
			"remove", "infiniband_verbs", "/devices/virtual/infiniband_verbs/uverbs0"},
		{"no trailing NUL", "add@/x\x00ACTION=add\x00SUBSYSTEM=net\x00DEVPATH=/x", "add", "net", "/x"},
		{"udev's re-broadcast", "libudev\x00\xfe\xed\xca\xfe", "", "", ""},
		{"empty", "", "", "", ""},
		{"garbage", "\x00\x00==\x00@", "", "", ""},
	} {
		a, s, p := parseUevent([]byte(c.in))
		if a != c.action || s != c.subsystem || p != c.path {
			t.Errorf("%s: %q %q %q", c.name, a, s, p)
		}
	}
}

func TestDevWatchNames(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "uverbs0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "uverbs0", "ibdev"), []byte("rxe0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := &devWatch{root: root, names: map[string]string{}}
	w.note("uverbs0")
	w.note("uverbs1") // no such node: nothing
	if len(w.names) != 1 || w.names["uverbs0"] != "rxe0" {
		t.Errorf("names %v", w.names)
	}
}

// Every process hears of a device being removed; a listing does not.
func TestDeviceGone(t *testing.T) {
	a := newHost(t, 100)
	p1, p2 := dialProc(t, a), dialProc(t, a)
	waitFor(t, "two clients", func() bool { c, _ := a.b.counts(); return c == 2 })
	a.b.deviceGone("rxe0")
	a.b.deviceGone("rxe_eth1")
	for _, p := range []*proc{p1, p2} {
		for i, name := range []string{"rxe0", "rxe_eth1"} {
			m := p.recv()
			if d, ok := m.rec.(sockwire.Device); !ok || m.route != nil || d.Name != name || d.Epoch != uint32(i+1) {
				t.Errorf("got %+v, want DEVICE %d %s", m, i+1, name)
			}
		}
	}
	a.b.deviceGone(string(make([]byte, 80))) // not a name the protocol carries: nothing sent
	if m, err := p1.tryRecv(200 * time.Millisecond); err == nil {
		t.Errorf("got %+v for a bad name", m)
	}
}
