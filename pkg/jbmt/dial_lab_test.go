//go:build lab

package jbmt_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// TestTwoGuestsDial (suite jbmt-2guests): guest 2 dials guest 1's JBMT
// service; the connection is made once and found by the next Dial;
// guest 1 counts it accepted. Dialling a port nothing listens on is
// refused, an address no host has fails within its context, and an
// address that is not IPv4 is refused before any of it.
func TestTwoGuestsDial(t *testing.T) {
	s := open(t)
	needTwoGuests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := stats(t)
	if labenv.Role() == "server" {
		signal(t, "jbmt-up")
		await(t, ctx, "jbmt-dialled")
		st := stats(t)
		if st.Accepts-before.Accepts != 1 || st.Peers < 1 {
			t.Errorf("counters %+v after one peer dialled (before %+v)", st, before)
		}
		if err := labenv.Signal("jbmt-checked"); err != nil { // guest 2 keeps the connection up until here
			t.Fatal(err)
		}
		return
	}
	await(t, ctx, "jbmt-up")
	a, err := labenv.AddrOf(1)
	if err != nil {
		t.Fatal(err)
	}
	server := netip.AddrPortFrom(netip.MustParseAddr(a), 0)
	p, err := s.Dial(ctx, server)
	if err != nil {
		t.Fatalf("Dial %v: %v", server, err)
	}
	again, err := s.Dial(ctx, server)
	if err != nil || again.ID() != p.ID() {
		t.Fatalf("second Dial: peer %v, %v; want the same peer %d", again, err, p.ID())
	}
	if st := stats(t); st.Connects-before.Connects != 1 || st.Peers < 1 {
		t.Errorf("counters %+v after two Dials (before %+v)", st, before)
	}

	// the host's cap on connections (every user shares them)
	const param = "/sys/module/rdmaplus/parameters/max_jbmt_peers"
	old, err := os.ReadFile(param)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(param, []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = s.Dial(ctx, netip.AddrPortFrom(server.Addr(), 7999))
	if werr := os.WriteFile(param, old, 0o644); werr != nil {
		t.Fatal(werr)
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a second connection with max_jbmt_peers 1: %v, want ENOSPC", err)
	}

	if _, err := s.Dial(ctx, netip.AddrPortFrom(server.Addr(), 7999)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Dial of a port nothing listens on: %v, want ECONNREFUSED", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	t0 := time.Now()
	_, err = s.Dial(short, netip.MustParseAddrPort("10.77.0.99:0"))
	if err == nil || time.Since(t0) > 10*time.Second {
		t.Errorf("Dial of an address no host has: %v after %v, want an error within 3 s", err, time.Since(t0))
	}
	t.Logf("Dial of an address no host has: %v after %v", err, time.Since(t0).Round(time.Millisecond))
	if _, err := s.Dial(ctx, netip.MustParseAddrPort("[::1]:0")); !errors.Is(err, jbmt.ErrInvalid) {
		t.Errorf("Dial of an IPv6 address: %v, want ErrInvalid", err)
	}
	signal(t, "jbmt-dialled")
	await(t, ctx, "jbmt-checked")
}

// TestTwoGuestsDialDeviceGone: guest 1 deletes its RDMA device under an
// up connection (rdma_cm's device removal) and adds it again. Guest 2
// sees the connection go down (a disconnect counted), a Dial meanwhile
// fails within its context and never hangs, and a Dial once the device
// is back makes a new connection. Neither guest reports anything to the
// kernel log, and the module unloads cleanly after (the lab checks both).
func TestTwoGuestsDialDeviceGone(t *testing.T) {
	s := open(t)
	dev := labenv.Device(t)
	needTwoGuests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if labenv.Role() == "server" {
		signal(t, "gone-up")
		await(t, ctx, "gone-dialled")
		rdmaLink(t, "delete", dev)
		signal(t, "gone-deleted")
		await(t, ctx, "gone-tried")
		rdmaLink(t, "add", dev, "type", "rxe", "netdev", "eth0")
		signal(t, "gone-back")
		await(t, ctx, "gone-done")
		if st := stats(t); st.Peers != 1 {
			t.Errorf("counters %+v: want the new connection up", st)
		}
		signal(t, "gone-checked")
		return
	}
	a, err := labenv.AddrOf(1)
	if err != nil {
		t.Fatal(err)
	}
	server := netip.AddrPortFrom(netip.MustParseAddr(a), 0)
	await(t, ctx, "gone-up")
	first, err := s.Dial(ctx, server)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	before := stats(t)
	signal(t, "gone-dialled")
	await(t, ctx, "gone-deleted")
	for st := stats(t); st.Disconnects == before.Disconnects; st = stats(t) {
		if ctx.Err() != nil {
			t.Fatalf("the connection never went down: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	short, cancelShort := context.WithTimeout(ctx, 5*time.Second)
	defer cancelShort()
	t0 := time.Now()
	_, err = s.Dial(short, server)
	t.Logf("Dial while the peer has no device: %v after %v", err, time.Since(t0).Round(time.Millisecond))
	if err == nil || time.Since(t0) > 15*time.Second {
		t.Errorf("Dial while the peer has no device: %v after %v", err, time.Since(t0))
	}
	signal(t, "gone-tried")
	await(t, ctx, "gone-back")
	again := redial(t, ctx, s, server)
	if again.ID() == first.ID() {
		t.Errorf("the new connection has the old one's id %d", first.ID())
	}
	signal(t, "gone-done")
	await(t, ctx, "gone-checked")
}

func rdmaLink(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("rdma", append([]string{"link"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rdma link %v: %v: %s", args, err, out)
	}
}
