package rvma

import (
	"encoding/binary"
	"net/netip"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

// The connection handshake (docs/rvma.md, section 3) rides in rdma_cm's
// private data: a hello in the connect request of every stripe, a welcome
// in the accept. Nothing else is exchanged before the first control
// message. Both are little endian, like every other format of the
// package; RoCE pads private data with zeros to its maximum, so parsers
// accept trailing bytes.

const (
	helloMagic   = "RVM1"
	helloVersion = 5 // 2: knocks carry the window's incarnation; 3: 256-byte entries with 7 descriptors; 4: entries carry Share; 5: entries carry Through
	// helloSize is the encoded length of a hello (rdma_cm allows 56 bytes
	// in a RoCE connect request).
	helloSize = 52
	// welcomeSize is the encoded length of a welcome (196 allowed).
	welcomeSize = 40
)

// hello is what the dialing endpoint says in each stripe's connect
// request.
type hello struct {
	Stripe  uint8          // this connection's index in the link
	Stripes uint8          // the link's number of stripes
	LinkID  uint64         // random, chosen by the dialer; groups the stripes
	Listen  netip.AddrPort // the dialer's own listening address: where the passive side's puts go
	Views   tableRef       // the dialer's view table, for pushed entries
}

// welcome is what the passive endpoint answers in each accept.
type welcome struct {
	Views tableRef // the passive side's view table
	Descs tableRef // its descriptor table, for RDMA READ refreshes
}

// tableRef locates a table of EntrySize entries in a peer's memory.
type tableRef struct {
	Addr  uint64
	RKey  uint32
	Slots uint32
}

func (t tableRef) valid() bool {
	return t.Slots > 0 && t.Slots <= wire.MaxSlots && t.Addr+uint64(t.Slots)*wire.EntrySize > t.Addr
}

// marshal encodes h; it fails with ErrInvalid for fields out of range.
func (h hello) marshal() ([]byte, error) {
	if h.Stripes == 0 || h.Stripes > MaxStripes || h.Stripe >= h.Stripes {
		return nil, invalidf("hello: stripe %d of %d", h.Stripe, h.Stripes)
	}
	if !h.Listen.IsValid() || h.Listen.Port() == 0 {
		return nil, invalidf("hello: listening address %v", h.Listen)
	}
	if !h.Views.valid() {
		return nil, invalidf("hello: view table %+v", h.Views)
	}
	b := make([]byte, helloSize)
	le := binary.LittleEndian
	copy(b, helloMagic)
	b[4] = helloVersion
	b[5] = h.Stripe
	b[6] = h.Stripes
	le.PutUint64(b[8:], h.LinkID)
	le.PutUint16(b[16:], h.Listen.Port())
	ip := h.Listen.Addr().As16()
	copy(b[20:36], ip[:])
	putRef(b[36:], h.Views)
	return b, nil
}

// parseHello decodes a hello. It fails with ErrInvalid for anything that
// is not a hello of this version with fields in range.
func parseHello(b []byte) (hello, error) {
	if len(b) < helloSize || string(b[:4]) != helloMagic {
		return hello{}, invalidf("not an RVMA hello (%d bytes)", len(b))
	}
	if b[4] != helloVersion {
		return hello{}, invalidf("hello version %d, want %d", b[4], helloVersion)
	}
	le := binary.LittleEndian
	h := hello{Stripe: b[5], Stripes: b[6], LinkID: le.Uint64(b[8:]), Views: getRef(b[36:])}
	if b[7] != 0 || b[18]|b[19] != 0 {
		return hello{}, invalidf("hello with reserved bytes set")
	}
	var ip [16]byte
	copy(ip[:], b[20:36])
	h.Listen = netip.AddrPortFrom(netip.AddrFrom16(ip).Unmap(), le.Uint16(b[16:]))
	if _, err := h.marshal(); err != nil {
		return hello{}, err
	}
	return h, nil
}

func (w welcome) marshal() ([]byte, error) {
	if !w.Views.valid() || !w.Descs.valid() {
		return nil, invalidf("welcome: tables %+v %+v", w.Views, w.Descs)
	}
	b := make([]byte, welcomeSize)
	copy(b, helloMagic)
	b[4] = helloVersion
	putRef(b[8:], w.Views)
	putRef(b[24:], w.Descs)
	return b, nil
}

func parseWelcome(b []byte) (welcome, error) {
	if len(b) < welcomeSize || string(b[:4]) != helloMagic {
		return welcome{}, invalidf("not an RVMA welcome (%d bytes)", len(b))
	}
	if b[4] != helloVersion {
		return welcome{}, invalidf("welcome version %d, want %d", b[4], helloVersion)
	}
	if b[5]|b[6]|b[7] != 0 {
		return welcome{}, invalidf("welcome with reserved bytes set")
	}
	w := welcome{Views: getRef(b[8:]), Descs: getRef(b[24:])}
	if _, err := w.marshal(); err != nil {
		return welcome{}, err
	}
	return w, nil
}

func putRef(b []byte, t tableRef) {
	le := binary.LittleEndian
	le.PutUint64(b, t.Addr)
	le.PutUint32(b[8:], t.RKey)
	le.PutUint32(b[12:], t.Slots)
}

func getRef(b []byte) tableRef {
	le := binary.LittleEndian
	return tableRef{Addr: le.Uint64(b), RKey: le.Uint32(b[8:]), Slots: le.Uint32(b[12:])}
}
