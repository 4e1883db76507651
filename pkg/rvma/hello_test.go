package rvma

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

func TestHelloRoundTrip(t *testing.T) {
	for _, ap := range []string{"10.77.0.2:7471", "[fd00::5]:9"} {
		h := hello{Stripe: 3, Stripes: 4, LinkID: 0x0123456789abcdef, Listen: netip.MustParseAddrPort(ap),
			Views: tableRef{Addr: 0x7f0000001000, RKey: 0x1234, Slots: 4096}}
		b, err := h.marshal()
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != helloSize {
			t.Fatalf("hello of %d bytes", len(b))
		}
		// RoCE pads private data with zeros to 56 bytes.
		got, err := parseHello(append(b, make([]byte, 56-len(b))...))
		if err != nil || got != h {
			t.Fatalf("round trip %v: %+v %v", ap, got, err)
		}
	}
	w := welcome{Views: tableRef{Addr: 1 << 40, RKey: 7, Slots: 1}, Descs: tableRef{Addr: 1 << 41, RKey: 8, Slots: 4096}}
	b, err := w.marshal()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := parseWelcome(append(b, make([]byte, 156)...)); err != nil || got != w {
		t.Fatalf("welcome round trip: %+v %v", got, err)
	}
}

func TestHelloRefused(t *testing.T) {
	good := hello{Stripe: 0, Stripes: 1, LinkID: 1, Listen: netip.MustParseAddrPort("10.0.0.1:1"),
		Views: tableRef{Addr: 4096, RKey: 1, Slots: 1}}
	for name, h := range map[string]hello{
		"no stripes":     {Stripes: 0, Listen: good.Listen, Views: good.Views},
		"stripe beyond":  {Stripe: 2, Stripes: 2, Listen: good.Listen, Views: good.Views},
		"too many":       {Stripes: MaxStripes + 1, Listen: good.Listen, Views: good.Views},
		"port 0":         {Stripes: 1, Listen: netip.MustParseAddrPort("10.0.0.1:0"), Views: good.Views},
		"no view table":  {Stripes: 1, Listen: good.Listen},
		"table wraps":    {Stripes: 1, Listen: good.Listen, Views: tableRef{Addr: ^uint64(0) - 10, Slots: 1}},
		"table too long": {Stripes: 1, Listen: good.Listen, Views: tableRef{Addr: 1, Slots: wire.MaxSlots + 1}},
	} {
		if _, err := h.marshal(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: marshal gave %v", name, err)
		}
	}
	b, _ := good.marshal()
	for name, mut := range map[string]func([]byte) []byte{
		"short":    func(b []byte) []byte { return b[:helloSize-1] },
		"magic":    func(b []byte) []byte { b[0] = 'X'; return b },
		"version":  func(b []byte) []byte { b[4] = 1; return b },
		"reserved": func(b []byte) []byte { b[7] = 1; return b },
		"stripe":   func(b []byte) []byte { b[5] = 9; return b },
		"empty":    func(b []byte) []byte { return nil },
	} {
		if _, err := parseHello(mut(bytes.Clone(b))); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: parse gave %v", name, err)
		}
	}
	if _, err := parseWelcome(b); !errors.Is(err, ErrInvalid) {
		t.Errorf("a hello parsed as a welcome: %v", err)
	}
}

func FuzzParseHello(f *testing.F) {
	h := hello{Stripe: 1, Stripes: 2, LinkID: 5, Listen: netip.MustParseAddrPort("10.0.0.1:7471"),
		Views: tableRef{Addr: 4096, RKey: 1, Slots: 16}}
	b, _ := h.marshal()
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil {
			return
		}
		out, err := h.marshal()
		if err != nil || !bytes.Equal(out, b[:helloSize]) {
			t.Fatalf("accepted %x but re-encodes as %x (%v)", b, out, err)
		}
	})
}
