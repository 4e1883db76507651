//go:build lab

package activeaccess_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/Mellanox/rdmamap"
	"github.com/vishvananda/netlink"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// TestLabTargetVanishes: the target's host stops answering without a
// disconnect (its link goes down) while a source waits in Flush for a
// stuck handler. Before that the keep-alive probes succeed and the Flush
// keeps waiting; after it the probe is not acknowledged, and the Flush
// fails with ErrDisconnected within the transport's retry period instead
// of waiting for its context.
func TestLabTargetVanishes(t *testing.T) { forModes(t, testTargetVanishes) }

func testTargetVanishes(t *testing.T, mode activeaccess.Mode, b func(string) string) {
	port := 7530 + uint16(mode) // the child target's
	if server(t) {
		startChild(t, mode, b("vanish-ready"))
		link := rdmaLink(t)
		await(t, b("vanish-down"))
		if err := netlink.LinkSetDown(link); err != nil {
			t.Fatalf("link %s down: %v", link.Attrs().Name, err)
		}
		defer linkUp(t, link)
		signal(t, b("vanish-isdown"))
		await(t, b("vanish-done"))
		linkUp(t, link)
		signal(t, b("vanish-up"))
		return
	}
	await(t, b("vanish-ready"))
	defer func() { signal(t, b("vanish-down")); signal(t, b("vanish-done")); await(t, b("vanish-up")) }()
	const keepAlive = 300 * time.Millisecond
	s, err := activeaccess.Dial(timeout(t, 60*time.Second), targetAddr(t, port),
		&activeaccess.SourceOptions{Name: "vanish-src", KeepAlive: keepAlive, AckTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer s.Close()
	ctx := timeout(t, 120*time.Second)
	flushed := stuckFlush(ctx, t, s, 8*keepAlive)
	if p := s.Stats().Probes; p < 2 {
		t.Fatalf("%d keep-alive probes in %v of waiting (KeepAlive %v)", p, 8*keepAlive, keepAlive)
	} else {
		t.Logf("%d probes acknowledged while the handler was stuck; Flush still waiting", p)
	}
	signal(t, b("vanish-down"))
	await(t, b("vanish-isdown"))
	flushFails(t, flushed, "the target's link went down")
	if _, err := s.Put(ctx, 0, []byte("after")); !errors.Is(err, activeaccess.ErrDisconnected) {
		t.Fatalf("Put after the target vanished: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close after the target vanished: %v", err)
	}
}

// rdmaLink is the network device the lab's rxe device runs on.
func rdmaLink(t *testing.T) netlink.Link {
	t.Helper()
	dev := labenv.Device(t)
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if d, err := rdmamap.GetRdmaDeviceForNetdevice(l.Attrs().Name); err == nil && d == dev {
			return l
		}
	}
	t.Fatalf("no network device under %s", dev)
	return nil
}

// linkUp brings link up and waits until the rxe port is active again.
func linkUp(t *testing.T, link netlink.Link) {
	t.Helper()
	if err := netlink.LinkSetUp(link); err != nil {
		t.Errorf("link %s up: %v", link.Attrs().Name, err)
		return
	}
	state := fmt.Sprintf("/sys/class/infiniband/%s/ports/1/state", labenv.Device(t))
	for i := 0; i < 200; i++ {
		if b, err := os.ReadFile(state); err == nil && strings.Contains(string(b), "ACTIVE") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("%s not ACTIVE 10 s after the link came up", state)
}
