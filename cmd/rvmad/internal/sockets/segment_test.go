package sockets

import (
	"encoding/binary"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

var ne = binary.NativeEndian

// fakeSeg builds a segment as the shim does: the header, counters and
// slots of sockproto.h, host order.
type fakeSeg struct{ b []byte }

func newFakeSeg(nslots int) *fakeSeg {
	b := make([]byte, sockwire.StatsHdrSize+nslots*sockwire.StatsSlotSize)
	ne.PutUint32(b[sockwire.StatsMagicOff:], sockwire.StatsMagic)
	ne.PutUint16(b[sockwire.StatsVersionOff:], sockwire.StatsVersion)
	ne.PutUint16(b[sockwire.StatsHdrSizeOff:], sockwire.StatsHdrSize)
	ne.PutUint32(b[sockwire.StatsSlotSizeOff:], sockwire.StatsSlotSize)
	ne.PutUint32(b[sockwire.StatsNSlotsOff:], uint32(nslots))
	return &fakeSeg{b}
}

func (f *fakeSeg) counter(off int, v uint64) { ne.PutUint64(f.b[sockwire.StatsCountersOff+off:], v) }

// slot fills slot i for tuple t and marks slots [0, i] used.
func (f *fakeSeg) slot(i int, t sockwire.Tuple, state, path uint8, in, out, rin, rout uint64) {
	off := sockwire.StatsHdrSize + i*sockwire.StatsSlotSize
	s := f.b[off : off+sockwire.StatsSlotSize]
	ne.PutUint32(s[sockwire.SlotGenOff:], 2)
	s[sockwire.SlotStateOff], s[sockwire.SlotPathOff] = state, path
	ne.PutUint32(s[sockwire.SlotEpochOff:], 1)
	rec, _ := sockwire.Marshal(sockwire.Route{Epoch: 1, Tuple: t})
	copy(s[sockwire.SlotTupleOff:], rec[sockwire.HeaderSize:])
	ne.PutUint64(s[sockwire.SlotBytesInOff:], in)
	ne.PutUint64(s[sockwire.SlotBytesOutOff:], out)
	ne.PutUint64(s[sockwire.SlotRDMAInOff:], rin)
	ne.PutUint64(s[sockwire.SlotRDMAOutOff:], rout)
	if used := int(ne.Uint32(f.b[sockwire.StatsUsedOff:])); i >= used {
		ne.PutUint32(f.b[sockwire.StatsUsedOff:], uint32(i+1))
	}
}

// memfd returns a memfd holding b, sealed as the shim seals it unless
// seals is 0.
func memfd(t *testing.T, b []byte, seals int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("test-stats", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.Pwrite(fd, b, 0); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

const shimSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

func tupleV4(lport, rport uint16) sockwire.Tuple {
	t := sockwire.Tuple{Family: sockwire.AFInet, LocalPort: lport, RemotePort: rport}
	copy(t.Local[:], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1})
	copy(t.Remote[:], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2})
	return t
}

// Headers that do not describe the bytes they are in are refused; so are
// files that are not sealed memfds of the size announced.
func TestSegmentHostileHeaders(t *testing.T) {
	good := newFakeSeg(4).b
	for name, edit := range map[string]func(b []byte) []byte{
		"magic":          func(b []byte) []byte { b[0] ^= 1; return b },
		"version":        func(b []byte) []byte { ne.PutUint16(b[sockwire.StatsVersionOff:], 2); return b },
		"header size":    func(b []byte) []byte { ne.PutUint16(b[sockwire.StatsHdrSizeOff:], 64); return b },
		"slot size":      func(b []byte) []byte { ne.PutUint32(b[sockwire.StatsSlotSizeOff:], 8); return b },
		"no slots":       func(b []byte) []byte { ne.PutUint32(b[sockwire.StatsNSlotsOff:], 0); return b },
		"slots beyond":   func(b []byte) []byte { ne.PutUint32(b[sockwire.StatsNSlotsOff:], 5); return b },
		"slots max+1":    func(b []byte) []byte { ne.PutUint32(b[sockwire.StatsNSlotsOff:], sockwire.StatsSlotsMax+1); return b },
		"slots all ones": func(b []byte) []byte { ne.PutUint32(b[sockwire.StatsNSlotsOff:], ^uint32(0)); return b },
		"header only":    func(b []byte) []byte { return b[:sockwire.StatsHdrSize] },
		"empty":          func(b []byte) []byte { return nil },
	} {
		b := edit(append([]byte(nil), good...))
		if _, err := newSegment(b); !errors.Is(err, errSegment) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if s, err := newSegment(good); err != nil || s.nslots != 4 {
		t.Fatalf("good: %v", err)
	}

	size := uint32(len(good))
	check := func(name string, fd int, size uint32) {
		t.Helper()
		s, err := mapSegment(fd, size, 1, 1)
		if !errors.Is(err, errSegment) {
			t.Errorf("%s: %v", name, err)
		}
		if s != nil {
			s.unmap()
		}
	}
	check("not sealed", memfd(t, good, 0), size)
	check("sealed against growing only", memfd(t, good, unix.F_SEAL_GROW), size)
	check("another size", memfd(t, good, shimSeals), size+8)
	check("a size below the least", memfd(t, good[:sockwire.StatsHdrSize], shimSeals), sockwire.StatsHdrSize)
	f, err := os.Create(filepath.Join(t.TempDir(), "seg"))
	if err != nil {
		t.Fatal(err)
	}
	f.Write(good)
	defer f.Close()
	check("a plain file", int(f.Fd()), size)
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	check("a pipe", int(r.Fd()), size)

	s, err := mapSegment(memfd(t, good, shimSeals), size, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	s.unmap()
}

// What the process writes after rvmad mapped its segment is clamped:
// counters never go back nor overflow, slots beyond the checked table
// are never read, and slots holding nonsense are skipped.
func TestSegmentHostileContents(t *testing.T) {
	f := newFakeSeg(8)
	f.counter(sockwire.StatsConnsOff+8*sockwire.StatsClient, 3)
	f.counter(sockwire.StatsBytesInOff, 1000)
	f.counter(sockwire.StatsBytesOutOff, 2000)
	f.counter(sockwire.StatsRDMAInOff, 600)
	f.counter(sockwire.StatsRDMAOutOff, 2500) // more than all: tcp out is 0
	f.counter(sockwire.StatsDemotesOff+8*int(sockwire.ReasonExec), 2)
	f.counter(sockwire.StatsDemotesOff+8*31, 99) // no such reason: not exported
	f.counter(sockwire.StatsFallbacksOff+8*int(sockwire.ReasonNoDevice), 4)
	f.slot(0, tupleV4(40000, 5201), sockwire.SlotAttached, 1, 100, 200, 50, 150)
	f.slot(1, tupleV4(40001, 5201), sockwire.SlotTCP, 0, 10, 20, 0, 0)
	f.slot(2, tupleV4(40002, 5201), 9, 0, 1, 1, 0, 0)                     // state out of range
	f.slot(3, tupleV4(40003, 5201), sockwire.SlotTCP, 2, 1, 1, 0, 0)      // path out of range
	f.slot(4, tupleV4(0, 5201), sockwire.SlotTCP, 0, 1, 1, 0, 0)          // port 0
	f.slot(5, tupleV4(40005, 5201), sockwire.SlotAttached, 1, 1, 1, 0, 0) // odd gen below
	ne.PutUint32(f.b[sockwire.StatsHdrSize+5*sockwire.StatsSlotSize:], 3)
	f.slot(6, tupleV4(40006, 5201), sockwire.SlotTCP, 0, ^uint64(0), 1, ^uint64(0), 0) // huge
	off7 := sockwire.StatsHdrSize + 7*sockwire.StatsSlotSize
	f.slot(7, tupleV4(40007, 5201), sockwire.SlotTCP, 0, 1, 1, 0, 0)
	f.b[off7+sockwire.SlotTupleOff] = 3 // family 3

	s, err := newSegment(f.b)
	if err != nil {
		t.Fatal(err)
	}
	c := s.counters()
	if c.conns != 3 || c.bytes[pathTCP] != [2]uint64{400, 0} || c.bytes[pathRDMA] != [2]uint64{600, 2500} ||
		c.demotes[sockwire.ReasonExec] != 2 || c.demotes[31] != 0 || c.fallbacks[sockwire.ReasonNoDevice] != 4 {
		t.Errorf("counters %+v", c)
	}
	var got []slotEntry
	s.slots(func(e slotEntry) { got = append(got, e) })
	if len(got) != 3 || got[0].tuple.LocalPort != 40000 || got[0].bytes != [2][2]uint64{{50, 50}, {50, 150}} ||
		got[1].tuple.LocalPort != 40001 || got[2].tuple.LocalPort != 40006 || got[2].bytes[pathRDMA][dirIn] != counterMax {
		t.Errorf("slots %+v", got)
	}

	// The process lowers its counters, then sets them huge: rvmad's view
	// never goes back, and stays below counterMax.
	f.counter(sockwire.StatsBytesInOff, 10)
	f.counter(sockwire.StatsConnsOff+8*sockwire.StatsClient, 0)
	if c2 := s.counters(); c2.conns != 3 || c2.bytes[pathRDMA][dirIn] != 600 || c2.bytes[pathTCP][dirIn] != 400 {
		t.Errorf("went back: %+v", c2)
	}
	for i := sockwire.StatsCountersOff; i < sockwire.StatsHdrSize; i += 8 {
		ne.PutUint64(f.b[i:], ^uint64(0))
	}
	if c3 := s.counters(); c3.conns != 3*counterMax || c3.bytes[pathRDMA][dirIn] != counterMax {
		t.Errorf("huge: %+v", c3)
	}

	// used beyond the table, nslots rewritten: reads stay within the
	// table checked at map time.
	ne.PutUint32(f.b[sockwire.StatsUsedOff:], ^uint32(0))
	ne.PutUint32(f.b[sockwire.StatsNSlotsOff:], ^uint32(0))
	n := 0
	s.slots(func(slotEntry) { n++ })
	if n != 3 {
		t.Errorf("%d slots after scribbling the header", n)
	}
}

// Random bytes after a valid header never panic the parser.
func TestSegmentRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 2000; i++ {
		f := newFakeSeg(1 + rng.Intn(16))
		rng.Read(f.b[sockwire.StatsCountersOff:])
		if rng.Intn(4) == 0 {
			rng.Read(f.b[sockwire.StatsUsedOff : sockwire.StatsUsedOff+4])
		}
		s, err := newSegment(f.b)
		if err != nil {
			t.Fatal(err)
		}
		s.counters()
		s.slots(func(e slotEntry) {
			if e.state == sockwire.SlotFree || int(e.state) >= len(stateNames) || e.path > 1 {
				t.Fatalf("slot %+v", e)
			}
		})
	}
}

func segRefused(b *Broker, reason string) float64 {
	return b.m.get(func(m *metrics) map[string]float64 { return m.segRefused }, reason)
}

// A process hands its segment over STATS: rvmad exports its totals and
// lists its connections; once the process goes, its totals stay.
func TestSegmentThroughBroker(t *testing.T) {
	h := newHost(t, 100)
	f := newFakeSeg(4)
	f.counter(sockwire.StatsConnsOff+8*sockwire.StatsServer, 1)
	f.counter(sockwire.StatsBytesInOff, 5000)
	f.counter(sockwire.StatsRDMAInOff, 4000)
	f.counter(sockwire.StatsAttachedOff, 1)
	f.slot(0, tupleV4(5201, 40000), sockwire.SlotAttached, 1, 5000, 0, 4000, 0)
	fd := memfd(t, f.b, shimSeals)

	p := dialProc(t, h)
	stats := message{rec: sockwire.Stats{Epoch: 1, Size: uint32(len(f.b))}}
	p.send(stats) // no descriptor: refused, not disconnected
	waitFor(t, "a refusal", func() bool { return segRefused(h.b, segInvalid) == 1 })
	p.sendFDs(stats, fd)
	waitFor(t, "the segment", func() bool { return h.b.shimView().processes == 1 })
	p.sendFDs(stats, fd)
	waitFor(t, "a duplicate refused", func() bool { return segRefused(h.b, segDuplicate) == 1 })
	v := h.b.shimView()
	if v.conns != [2]int{0, 1} || v.total.bytes[pathRDMA][dirIn] != 4000 || v.total.bytes[pathTCP][dirIn] != 1000 ||
		v.total.conns != 1 || v.total.upgrades != 1 {
		t.Errorf("view %+v", v)
	}

	conns, err := List(h.sock)
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 1 || conns[0].Local != "10.0.0.1:5201" || conns[0].Remote != "10.0.0.2:40000" ||
		conns[0].Path != "rdma" || conns[0].State != "attached" || conns[0].RDMAIn != 4000 || conns[0].TCPIn != 1000 ||
		conns[0].UID != uint32(os.Getuid()) {
		t.Errorf("list %+v", conns)
	}

	// The process writes more, then goes: its last values stay.
	f2 := newFakeSeg(4)
	copy(f2.b, f.b)
	ne.PutUint64(f2.b[sockwire.StatsCountersOff+sockwire.StatsBytesInOff:], 9000)
	if _, err := unix.Pwrite(fd, f2.b[:sockwire.StatsHdrSize], 0); err != nil {
		t.Fatal(err)
	}
	p.conn.Close()
	waitFor(t, "the process to go", func() bool { return h.b.shimView().processes == 0 })
	v = h.b.shimView()
	if v.total.bytes[pathTCP][dirIn] != 5000 || v.total.bytes[pathRDMA][dirIn] != 4000 || v.conns != [2]int{} {
		t.Errorf("after the process went: %+v", v)
	}
	if conns, err := List(h.sock); err != nil || len(conns) != 0 {
		t.Errorf("list after: %+v, %v", conns, err)
	}

	// A file that is not a sealed memfd is refused; the process stays.
	p = dialProc(t, h)
	p.sendFDs(stats, memfd(t, f.b, 0))
	waitFor(t, "an invalid segment refused", func() bool { return segRefused(h.b, segInvalid) == 2 })
	cc, _ := tcpPair(t, "127.0.0.1")
	p.register(cc, 0)
}
