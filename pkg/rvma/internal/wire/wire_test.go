package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

func TestImmRoundTrip(t *testing.T) {
	for _, i := range []Imm{
		{KindData, 0, 0}, {KindData, SlotMask, GenMask}, {KindNotice, 12345, 0}, {KindCtrl, 1, uint16(KnockDrop)},
	} {
		v, err := i.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if got := ParseImm(v); got != i {
			t.Fatalf("%+v -> %#x -> %+v", i, v, got)
		}
	}
	for _, bad := range []Imm{{4, 0, 0}, {0, SlotMask + 1, 0}, {0, 0, GenMask + 1}} {
		if _, err := bad.Encode(); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	v, _ := Imm{KindNotice, 0x5A5A5, 0x2AB}.Encode()
	if v != 2<<30|0x5A5A5<<10|0x2AB {
		t.Fatalf("layout %#x", v)
	}
}

func TestKnockGen(t *testing.T) {
	for _, r := range []KnockReason{KnockNack, KnockDrop} {
		for _, inc := range []uint32{0, 1, 255, 256, 257, 1<<32 - 1} {
			g := KnockGen(r, inc)
			if g > GenMask {
				t.Fatalf("KnockGen(%d, %d) = %#x: more than the generation bits", r, inc, g)
			}
			gr, ginc := ParseKnock(g)
			if gr != r || ginc != uint8(inc) {
				t.Fatalf("KnockGen(%d, %d) = %#x parses as %d, %d", r, inc, g, gr, ginc)
			}
		}
	}
	if KnockGen(KnockDrop, 3) != KnockGen(KnockDrop, 3+256) {
		t.Fatal("the incarnation is carried modulo 256")
	}
}

func TestExpandGen(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100000; i++ {
		head := rng.Uint64N(1 << 40)
		if i%4 == 0 {
			head = rng.Uint64N(2000)
		}
		lo := uint64(0)
		if head >= GenMod/2 {
			lo = head - GenMod/2
		}
		g := lo + rng.Uint64N(GenMod)
		if got := ExpandGen(head, GenLow(g)); got != g {
			t.Fatalf("head %d gen %d: got %d", head, g, got)
		}
	}
}

func sampleEntry() Entry {
	return Entry{Seq: 42, Mailbox: 0x11FF0011, Incarnation: 3, State: StateOpen, Kind: EpochOps, NDesc: 2, Head: 1 << 33,
		Descs: [MaxDescs]Desc{{0x7f0000001000, 0xabcd01, 4096, 4}, {0x7f0000002000, 0xabcd02, 8192, 4}}, Share: 2,
	}
}

// roundTrip marshals e and unmarshals it, which must give e back.
func roundTrip(t *testing.T, e Entry) Entry {
	t.Helper()
	b := make([]byte, EntrySize)
	if err := MarshalEntry(b, &e); err != nil {
		t.Fatal(err)
	}
	got, err := UnmarshalEntry(b)
	if err != nil || got != e {
		t.Fatalf("%+v %v", got, err)
	}
	return got
}

func TestEntryRoundTrip(t *testing.T) {
	e := sampleEntry()
	b := make([]byte, EntrySize)
	got := roundTrip(t, e)
	if d, ok := got.Desc(1<<33 + 1); !ok || d.RKey != 0xabcd02 {
		t.Fatal("Desc(head+1)")
	}
	if _, ok := got.Desc(1<<33 + 2); ok {
		t.Fatal("Desc beyond NDesc")
	}
	if _, ok := got.Desc(1<<33 - 1); ok {
		t.Fatal("Desc before head")
	}
	odd := e
	odd.Seq = 43
	if err := MarshalEntry(b, &odd); !errors.Is(err, ErrInvalid) {
		t.Fatal("odd seq marshalled")
	}
	if err := MarshalEntry(b[:10], &e); !errors.Is(err, ErrInvalid) {
		t.Fatal("short buffer")
	}
	counted := e
	counted.Flags = EntryCounted
	if err := MarshalEntry(b, &counted); err != nil {
		t.Fatal(err)
	}
	if got, err := UnmarshalEntry(b); err != nil || got != counted {
		t.Fatalf("counted entry: %+v %v", got, err)
	}
	unknown := e
	unknown.Flags = 0x80
	if err := MarshalEntry(b, &unknown); !errors.Is(err, ErrInvalid) {
		t.Fatal("unknown entry flag marshalled")
	}
	// A reserved byte set under a valid checksum (a newer or broken
	// peer) is refused, on both sides of Share.
	for _, i := range []int{entRsvd, entShare - 1, entRsvd2, entCRC - 1} {
		if err := MarshalEntry(b, &e); err != nil {
			t.Fatal(err)
		}
		b[i] = 1
		binary.LittleEndian.PutUint32(b[entCRC:], crc32.Checksum(b[:entCRC], castagnoli))
		if _, err := UnmarshalEntry(b); !errors.Is(err, ErrInvalid) || errors.Is(err, ErrTorn) {
			t.Fatalf("reserved byte %d set: %v", i, err)
		}
	}
}

// Through extends an entry's descriptors with the generations after the
// last one, derived from it (a counted window's mailbox descriptors), and
// is refused where it cannot be derived.
func TestEntryThrough(t *testing.T) {
	const head, key = 1<<24 - 2, 0xf0000100 // the mailbox address wraps at 2^24
	e := Entry{Seq: 2, Mailbox: 9, Incarnation: 1, State: StateOpen, Kind: EpochBytes, Flags: EntryCounted,
		Head: head, NDesc: 2, Through: head + 5}
	for i := range 2 {
		e.Descs[i] = Desc{Addr: MailboxAddr(head + uint64(i)), RKey: key, Len: 64, Threshold: 32}
	}
	b := make([]byte, EntrySize)
	got := roundTrip(t, e)
	if got.End() != head+6 {
		t.Fatalf("End %d", got.End())
	}
	for g := uint64(head); g <= head+5; g++ {
		d, ok := got.Desc(g)
		if want := (Desc{Addr: MailboxAddr(g), RKey: key, Len: 64, Threshold: 32}); !ok || d != want {
			t.Fatalf("Desc(%d) = %+v, %v; want %+v", g, d, ok, want)
		}
	}
	if _, ok := got.Desc(head + 6); ok {
		t.Fatal("Desc beyond Through")
	}
	plain := e
	plain.Through = 0
	if plain.End() != head+2 {
		t.Fatalf("End without Through: %d", plain.End())
	}
	bad := map[string]func(*Entry){
		"through inside the descriptors": func(e *Entry) { e.Through = head + 1 },
		"through without descriptors":    func(e *Entry) { e.NDesc = 0 },
		"through too far":                func(e *Entry) { e.Through = head + MaxThrough },
		"last descriptor not a mailbox":  func(e *Entry) { e.Descs[1].Addr = 0x1000 },
	}
	for name, f := range bad {
		x := e
		f(&x)
		if err := MarshalEntry(b, &x); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%s: marshalled (%v)", name, err)
		}
		// The same entry under a valid checksum (a broken peer).
		if err := MarshalEntry(b, &e); err != nil {
			t.Fatal(err)
		}
		raw := x
		raw.Through = 0
		_ = MarshalEntry(b, &raw)
		binary.LittleEndian.PutUint64(b[entThru:], x.Through)
		binary.LittleEndian.PutUint32(b[entCRC:], crc32.Checksum(b[:entCRC], castagnoli))
		if _, err := UnmarshalEntry(b); !errors.Is(err, ErrInvalid) || errors.Is(err, ErrTorn) {
			t.Fatalf("%s: unmarshalled (%v)", name, err)
		}
	}
}

// Any single changed byte, and any mixture of two versions, is detected.
func TestEntryTorn(t *testing.T) {
	e1, e2 := sampleEntry(), sampleEntry()
	e2.Seq, e2.Head, e2.Descs[0].RKey = 44, e1.Head+1, 0xabcd09
	b1, b2 := make([]byte, EntrySize), make([]byte, EntrySize)
	_ = MarshalEntry(b1, &e1)
	_ = MarshalEntry(b2, &e2)
	for i := 0; i < EntrySize; i++ {
		c := bytes.Clone(b1)
		c[i] ^= 0x40
		if _, err := UnmarshalEntry(c); !errors.Is(err, ErrInvalid) {
			t.Fatalf("byte %d flipped: accepted", i)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 20000; i++ {
		c := make([]byte, EntrySize)
		same1, same2 := true, true
		for j := range c {
			if rng.IntN(2) == 0 {
				c[j] = b1[j]
			} else {
				c[j] = b2[j]
			}
			same1 = same1 && c[j] == b1[j]
			same2 = same2 && c[j] == b2[j]
		}
		got, err := UnmarshalEntry(c)
		if err == nil && !same1 && !same2 {
			t.Fatalf("torn mixture accepted: %+v", got)
		}
	}
	// Being written: odd sequence at the start.
	c := bytes.Clone(b1)
	c[0] |= 1
	if _, err := UnmarshalEntry(c); !errors.Is(err, ErrTorn) {
		t.Fatalf("odd seq: %v", err)
	}
	if _, err := UnmarshalEntry(make([]byte, EntrySize)); !errors.Is(err, ErrInvalid) {
		t.Fatal("zero entry accepted")
	}
}

func TestCtrl(t *testing.T) {
	for _, m := range []Ctrl{
		{Type: CtrlResolve, Seq: 1, Mailbox: 0xFFFF_FFFF_FFFF_FFFF, ViewSlot: SlotMask},
		{Type: CtrlResolved, Seq: 2, Slot: 17, Incarnation: 9},
		{Type: CtrlNack, Seq: 3, Reason: NackStale},
		{Type: CtrlGet, Seq: GetSeqBit | 5, Slot: SlotMask, Incarnation: 3, Epoch: ^uint64(0)},
		{Type: CtrlGetReply, Seq: GetSeqBit | 6, Epoch: 41, Addr: 0x7f0000001000, RKey: 0x1234, Len: 4096},
		{Type: CtrlLate, ViewSlot: SlotMask, Slot: 5, Epoch: 1 << 40, Len: 65536, Count: 0xFFFF, Stale: true},
		{Type: CtrlLate, ViewSlot: 1, Slot: SlotMask, Epoch: 3, Len: 8, Count: 1},
		{Type: CtrlRefused, Seq: 7, Slot: SlotMask, Incarnation: 0xFFFFFFFF, Len: 1 << 31, Count: 0xFFFF},
		{Type: CtrlRefused, Slot: 2, Incarnation: 1, Len: 0, Count: 1},
	} {
		b, err := AppendCtrl(nil, m)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > MaxCtrlSize {
			t.Fatalf("%v: %d bytes", m.Type, len(b))
		}
		got, err := ParseCtrl(b)
		if err != nil || got != m {
			t.Fatalf("%+v -> %+v %v", m, got, err)
		}
		if _, err := ParseCtrl(append(b, 0)); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%v with a trailing byte accepted", m.Type)
		}
	}
	for _, m := range []Ctrl{{Type: 0}, {Type: 9}, {Type: CtrlGet, Slot: SlotMask + 1}, {Type: CtrlNack, Reason: 0}, {Type: CtrlNack, Reason: 6},
		{Type: CtrlResolve, ViewSlot: SlotMask + 1}, {Type: CtrlResolved, Slot: SlotMask + 1},
		{Type: CtrlLate, Slot: SlotMask + 1, Count: 1}, {Type: CtrlLate, ViewSlot: SlotMask + 1, Count: 1}, {Type: CtrlLate, Slot: 1},
		{Type: CtrlRefused, Slot: SlotMask + 1, Count: 1}, {Type: CtrlRefused, Slot: 1}} {
		if _, err := AppendCtrl(nil, m); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v encoded", m)
		}
	}
	reserved, _ := AppendCtrl(nil, Ctrl{Type: CtrlResolved, Slot: 1})
	reserved[1] = 1
	if _, err := ParseCtrl(reserved); !errors.Is(err, ErrInvalid) {
		t.Fatal("reserved bytes accepted")
	}
	if _, err := ParseCtrl([]byte{4, 0, 0, 0, 0, 0, 0, 0}); !errors.Is(err, ErrInvalid) {
		t.Fatal("type 4 (reserved: the eager path's EAGERACK) accepted")
	}
	for _, c := range []struct {
		typ   CtrlType
		bytes []struct{ i, v int } // a byte set to a value the parser must refuse
	}{
		{CtrlLate, []struct{ i, v int }{{28, 2}, {29, 1}, {30, 0}}},
		{CtrlRefused, []struct{ i, v int }{{20, 0}, {22, 1}, {23, 1}}},
	} {
		good, _ := AppendCtrl(nil, Ctrl{Type: c.typ, Slot: 1, Count: 1})
		for _, f := range c.bytes {
			b := append([]byte(nil), good...)
			b[f.i] = byte(f.v)
			if _, err := ParseCtrl(b); !errors.Is(err, ErrInvalid) {
				t.Fatalf("%v with byte %d = %d accepted", c.typ, f.i, f.v)
			}
		}
	}
}

func FuzzParseImm(f *testing.F) {
	f.Add(uint32(0))
	f.Add(uint32(0xFFFFFFFF))
	f.Fuzz(func(t *testing.T, v uint32) {
		i := ParseImm(v)
		w, err := i.Encode()
		if err != nil || w != v {
			t.Fatalf("%#x -> %+v -> %#x %v", v, i, w, err)
		}
	})
}

func FuzzUnmarshalEntry(f *testing.F) {
	e := sampleEntry()
	b := make([]byte, EntrySize)
	_ = MarshalEntry(b, &e)
	f.Add(b)
	f.Add(make([]byte, EntrySize))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := UnmarshalEntry(b)
		if err != nil {
			return
		}
		c := make([]byte, EntrySize)
		if err := MarshalEntry(c, &e); err != nil {
			t.Fatalf("accepted entry does not marshal: %v", err)
		}
		if !bytes.Equal(c, b[:EntrySize]) {
			t.Fatalf("round trip differs:\n%x\n%x", b[:EntrySize], c)
		}
	})
}

func FuzzParseCtrl(f *testing.F) {
	for _, m := range []Ctrl{{Type: CtrlResolve, Mailbox: 5, ViewSlot: 2}, {Type: CtrlResolved, Slot: 1}, {Type: CtrlNack, Reason: NackClosed},
		{Type: CtrlGet, Slot: 3, Epoch: 7}, {Type: CtrlGetReply, Epoch: 7, Addr: 1, RKey: 2, Len: 3}, {Type: CtrlLate, ViewSlot: 4, Slot: 3, Epoch: 7, Len: 9, Count: 2, Stale: true},
		{Type: CtrlRefused, Slot: 3, Incarnation: 2, Len: 64, Count: 1}} {
		b, _ := AppendCtrl(nil, m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseCtrl(b)
		if err != nil {
			return
		}
		c, err := AppendCtrl(nil, m)
		if err != nil || !bytes.Equal(b, c) {
			t.Fatalf("%x -> %+v -> %x %v", b, m, c, err)
		}
	})
}
