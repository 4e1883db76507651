package sockets

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// Caps on the statistics segments of one user's processes: a segment is
// memory rvmad maps and reads at every scrape, and the pages it touches
// in a memfd are charged to rvmad.
const (
	MaxSegmentsPerUID     = 256
	MaxSegmentBytesPerUID = 128 << 20
)

// counterMax clamps every value read from a segment, so that sums of
// many stay exact in a float64 and never wrap.
const counterMax = 1 << 50

// errSegment is a segment rvmad does not map: not a sealed memfd of the
// size announced, or a header that does not describe it.
var errSegment = errors.New("invalid statistics segment")

// Indices of shimCounters.bytes.
const (
	pathTCP  = 0
	pathRDMA = 1
	dirIn    = 0
	dirOut   = 1
)

var pathNames = [2]string{"tcp", "rdma"}
var dirNames = [2]string{"in", "out"}

// shimCounters are the totals of one process, or of many: what the
// Prometheus counters export.
type shimCounters struct {
	conns      uint64       // connections established (connect, accept, adopted)
	bytes      [2][2]uint64 // [path][direction]
	rdmaWrites uint64
	attachable uint64
	upgrades   uint64 // attachments made
	demotes    [sockwire.StatsReasons]uint64
	fallbacks  [sockwire.StatsReasons]uint64
}

// max keeps the larger of each value: a process may scribble on its
// segment, but never makes a counter go back.
func (c *shimCounters) max(o *shimCounters) {
	m := func(a *uint64, b uint64) {
		if b > *a {
			*a = b
		}
	}
	m(&c.conns, o.conns)
	for p := range c.bytes {
		for d := range c.bytes[p] {
			m(&c.bytes[p][d], o.bytes[p][d])
		}
	}
	m(&c.rdmaWrites, o.rdmaWrites)
	m(&c.attachable, o.attachable)
	m(&c.upgrades, o.upgrades)
	for i := range c.demotes {
		m(&c.demotes[i], o.demotes[i])
		m(&c.fallbacks[i], o.fallbacks[i])
	}
}

// add adds o to c.
func (c *shimCounters) add(o *shimCounters) {
	c.conns += o.conns
	for p := range c.bytes {
		for d := range c.bytes[p] {
			c.bytes[p][d] += o.bytes[p][d]
		}
	}
	c.rdmaWrites += o.rdmaWrites
	c.attachable += o.attachable
	c.upgrades += o.upgrades
	for i := range c.demotes {
		c.demotes[i] += o.demotes[i]
		c.fallbacks[i] += o.fallbacks[i]
	}
}

// segment is a process's statistics segment, mapped read-only. Its
// geometry is checked once, when mapped, and kept here: what the process
// writes into the header later is never trusted for bounds.
type segment struct {
	mem    []byte
	nslots int
	pid    int32
	uid    uint32
	comm   string
	last   shimCounters // the largest values seen
}

// mapSegment maps the memfd fd of size bytes (the STATS record's) that
// the process pid of user uid passed. It fails with an error wrapping
// errSegment when fd is not a memfd sealed against shrinking of exactly
// size bytes, or when the header is not one of this version describing
// that size; with another error when mmap fails. The caller still closes
// fd.
func mapSegment(fd int, size uint32, pid int32, uid uint32) (*segment, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%w: fstat: %w", errSegment, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(size) {
		return nil, fmt.Errorf("%w: not a regular file of %d bytes", errSegment, size)
	}
	// Without F_SEAL_SHRINK the process could truncate the file under
	// rvmad's mapping, and a read of it would fault (SIGBUS).
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("%w: not a memfd sealed against shrinking", errSegment)
	}
	if size < sockwire.StatsMin || size > sockwire.StatsMax {
		return nil, fmt.Errorf("%w: %d bytes", errSegment, size)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap of a statistics segment: %w", err)
	}
	s, err := newSegment(mem)
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	s.pid, s.uid, s.comm = pid, uid, procComm(pid)
	return s, nil
}

// newSegment checks the header of mem (a mapping, or a test's bytes) and
// returns its segment. It fails with an error wrapping errSegment.
func newSegment(mem []byte) (*segment, error) {
	if len(mem) < sockwire.StatsMin || len(mem) > sockwire.StatsMax {
		return nil, fmt.Errorf("%w: %d bytes", errSegment, len(mem))
	}
	s := &segment{mem: mem}
	var h [sockwire.StatsCountersOff]byte // a copy: the process may be writing
	copy(h[:], mem)
	ne := binary.NativeEndian
	if m := ne.Uint32(h[sockwire.StatsMagicOff:]); m != sockwire.StatsMagic {
		return nil, fmt.Errorf("%w: magic %#x", errSegment, m)
	}
	ver, hs := ne.Uint16(h[sockwire.StatsVersionOff:]), ne.Uint16(h[sockwire.StatsHdrSizeOff:])
	if ver != sockwire.StatsVersion || hs != sockwire.StatsHdrSize {
		return nil, fmt.Errorf("%w: version %d, header of %d bytes", errSegment, ver, hs)
	}
	if ss := ne.Uint32(h[sockwire.StatsSlotSizeOff:]); ss != sockwire.StatsSlotSize {
		return nil, fmt.Errorf("%w: slots of %d bytes", errSegment, ss)
	}
	n := ne.Uint32(h[sockwire.StatsNSlotsOff:])
	if n < 1 || n > sockwire.StatsSlotsMax || sockwire.StatsHdrSize+int(n)*sockwire.StatsSlotSize > len(mem) {
		return nil, fmt.Errorf("%w: %d slots in %d bytes", errSegment, n, len(mem))
	}
	s.nslots = int(n)
	return s, nil
}

// load32 and load64 read an aligned word the process may be writing.
func (s *segment) load32(off int) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&s.mem[off])))
}

func (s *segment) load64(off int) uint64 {
	v := atomic.LoadUint64((*uint64)(unsafe.Pointer(&s.mem[off])))
	if v > counterMax {
		v = counterMax
	}
	return v
}

// counters reads the process's counters now, and returns the largest
// values seen so far (kept in s.last): never less than before.
func (s *segment) counters() shimCounters {
	c := func(off int) uint64 { return s.load64(sockwire.StatsCountersOff + off) }
	var now shimCounters
	for _, r := range []int{sockwire.StatsClient, sockwire.StatsServer, sockwire.StatsAdopted} {
		now.conns += c(sockwire.StatsConnsOff + 8*r)
	}
	in, out := c(sockwire.StatsBytesInOff), c(sockwire.StatsBytesOutOff)
	rin, rout := c(sockwire.StatsRDMAInOff), c(sockwire.StatsRDMAOutOff)
	now.bytes[pathRDMA] = [2]uint64{rin, rout}
	now.bytes[pathTCP] = [2]uint64{sub0(in, rin), sub0(out, rout)}
	now.rdmaWrites = c(sockwire.StatsRDMAWritesOff)
	now.attachable = c(sockwire.StatsAttachableOff)
	now.upgrades = c(sockwire.StatsAttachedOff)
	for i := 1; i < sockwire.StatsReasons; i++ { // 0 holds reasons the shim did not know
		if sockwire.Reason(i).Valid() {
			now.demotes[i] = c(sockwire.StatsDemotesOff + 8*i)
			now.fallbacks[i] = c(sockwire.StatsFallbacksOff + 8*i)
		}
	}
	s.last.max(&now)
	return s.last
}

func sub0(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// slotEntry is one live connection of a segment.
type slotEntry struct {
	tuple      sockwire.Tuple
	state      uint8
	path       uint8
	reason     sockwire.Reason
	epoch      uint32
	bytes      [2][2]uint64
	rdmaWrites uint64
}

var stateNames = [...]string{"free", "tcp", "attaching", "attached", "demoting", "closing"}

// slots calls fn for each slot in use that reads consistently: a slot
// being filled, or refilled while read, is skipped, as is one holding
// values no slot can hold. It reads at most the slots the header says
// were ever used, and never beyond those checked at map time.
func (s *segment) slots(fn func(e slotEntry)) {
	used := int(s.load32(sockwire.StatsUsedOff))
	if used > s.nslots {
		used = s.nslots
	}
	var raw [sockwire.StatsSlotSize]byte
	for i := 0; i < used; i++ {
		off := sockwire.StatsHdrSize + i*sockwire.StatsSlotSize
		gen := s.load32(off + sockwire.SlotGenOff)
		if gen&1 != 0 || s.mem[off+sockwire.SlotStateOff] == sockwire.SlotFree {
			continue
		}
		copy(raw[:], s.mem[off:off+sockwire.StatsSlotSize])
		if s.load32(off+sockwire.SlotGenOff) != gen {
			continue
		}
		e, ok := parseSlot(raw[:])
		if ok {
			fn(e)
		}
	}
}

// parseSlot decodes one slot's bytes; false when they hold nothing a
// slot in use can hold.
func parseSlot(b []byte) (slotEntry, bool) {
	ne := binary.NativeEndian
	e := slotEntry{state: b[sockwire.SlotStateOff], path: b[sockwire.SlotPathOff],
		reason: sockwire.Reason(ne.Uint16(b[sockwire.SlotReasonOff:])), epoch: ne.Uint32(b[sockwire.SlotEpochOff:])}
	if e.state == sockwire.SlotFree || e.state > sockwire.SlotStateMax || e.path > 1 {
		return e, false
	}
	if !e.reason.Valid() {
		e.reason = 0
	}
	t, err := sockwire.DecodeTuple(b[sockwire.SlotTupleOff:])
	if err != nil || checkTuple(t) != nil {
		return e, false
	}
	e.tuple = t
	clamp := func(off int) uint64 { return min(ne.Uint64(b[off:]), counterMax) }
	in, out := clamp(sockwire.SlotBytesInOff), clamp(sockwire.SlotBytesOutOff)
	rin, rout := clamp(sockwire.SlotRDMAInOff), clamp(sockwire.SlotRDMAOutOff)
	e.bytes[pathRDMA] = [2]uint64{min(rin, in), min(rout, out)}
	e.bytes[pathTCP] = [2]uint64{sub0(in, rin), sub0(out, rout)}
	e.rdmaWrites = clamp(sockwire.SlotRDMAWritesOff)
	return e, true
}

// unmap lets the mapping go; the segment must not be read after.
func (s *segment) unmap() {
	if s.mem != nil {
		unix.Munmap(s.mem)
		s.mem = nil
	}
}

// procComm is the command name of pid (/proc/pid/comm), printable, or
// "?" when it cannot be read.
func procComm(pid int32) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/comm")
	if err != nil {
		return "?"
	}
	name := strings.TrimRight(string(b), "\n")
	if len(name) > 16 {
		name = name[:16]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, name)
}
