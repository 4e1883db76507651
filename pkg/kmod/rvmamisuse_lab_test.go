//go:build lab

package kmod

// The module's answers to misuse of the counted-mailbox requests, sent
// raw: every validation error of SETUP, WIN_CREATE, WIN_DESTROY, POST,
// POSTV and END, wrong structure sizes, requests before SETUP, bad mmaps, another
// file gating the same region, and the per-file range limit.
//
// Run: go run ./test/softroce gotest ./pkg/kmod -test.run TestLabMailboxRawMisuse -test.v

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// DropFileForTest unmaps m's area and closes d's descriptor without
// destroying any window, so that the kernel's release tears the file's
// mailboxes down with their ranges pending. d and m count as closed.
func DropFileForTest(d *Device, m *Mailboxes) {
	m.mu.Lock()
	m.closed = true
	m.closedAt.Store(true)
	unix.Munmap(m.mem)
	m.mem = nil
	m.mu.Unlock()
	m.evt.Close()
	d.mu.Lock()
	d.closed = true
	d.mbox = nil
	d.mu.Unlock()
	d.f.Close()
}

func TestLabMailboxRawMisuse(t *testing.T) {
	name := labenv.Device(t)
	open := func() *Device {
		d, err := Open()
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	errno := func(what string, err error, want syscall.Errno) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	vctx, err := verbs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer vctx.Close()
	pd, err := vctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	const mrSize = 1 << 16
	mr, err := pd.AllocMR(mrSize, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	base := mr.Addr()

	d := open()
	setupSize := uint32(unsafe.Sizeof(rawRVMASetup{}))
	winSize := uint32(unsafe.Sizeof(rawRVMAWin{}))
	postSize := uint32(unsafe.Sizeof(rawRVMAPost{}))
	endSize := uint32(unsafe.Sizeof(rawRVMAEnd{}))
	destroySize := uint32(unsafe.Sizeof(rawRVMAWinDestroy{}))
	create := func(d *Device, kind uint32) (uint32, error) {
		c := rawRVMAWin{Size: winSize, Kind: kind}
		err := d.ioctl("create", iocRVMAWinCreate, unsafe.Pointer(&c))
		return c.ID, err
	}
	post := func(d *Device, p rawRVMAPost) error {
		if p.Size == 0 {
			p.Size = postSize
		}
		return d.ioctl("post", iocRVMAPost, unsafe.Pointer(&p))
	}
	end := func(d *Device, e rawRVMAEnd) error {
		if e.Size == 0 {
			e.Size = endSize
		}
		return d.ioctl("end", iocRVMAEnd, unsafe.Pointer(&e))
	}
	destroy := func(d *Device, id, size uint32) error {
		a := rawRVMAWinDestroy{Size: size, ID: id}
		return d.ioctl("destroy", iocRVMAWinDestroy, unsafe.Pointer(&a))
	}
	rvmaOff := int64(0x100000) * int64(os.Getpagesize())

	// Before SETUP every other request is refused with ENXIO.
	_, err = create(d, uint32(CountBytes))
	errno("CREATE before SETUP", err, syscall.ENXIO)
	errno("DESTROY before SETUP", destroy(d, 1, destroySize), syscall.ENXIO)
	errno("POST before SETUP", post(d, rawRVMAPost{Win: 1, Key: mr.LKey(), IOVA: base, Length: 1, Threshold: 1}), syscall.ENXIO)
	errno("END before SETUP", end(d, rawRVMAEnd{Win: 1}), syscall.ENXIO)
	errno("ARM before SETUP", d.ioctl("arm", iocRVMAArm, nil), syscall.ENXIO)
	mmapRefused(t, d, rvmaOff, os.Getpagesize()*2, syscall.ENXIO, "before SETUP")

	// SETUP's checks.
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	good := rawRVMASetup{Size: setupSize, Windows: 2, Records: 4, Eventfd: -1}
	for _, c := range []struct {
		name string
		mod  func(*rawRVMASetup)
		want syscall.Errno
	}{
		{"a short size", func(s *rawRVMASetup) { s.Size -= 8 }, syscall.EINVAL},
		{"flags", func(s *rawRVMASetup) { s.Flags = 1 }, syscall.EINVAL},
		{"reserved", func(s *rawRVMASetup) { s.Reserved = 1 }, syscall.EINVAL},
		{"0 windows", func(s *rawRVMASetup) { s.Windows = 0 }, syscall.EINVAL},
		{"too many windows", func(s *rawRVMASetup) { s.Windows = MaxWindows + 1 }, syscall.EINVAL},
		{"0 records", func(s *rawRVMASetup) { s.Records = 0 }, syscall.EINVAL},
		{"too many records", func(s *rawRVMASetup) { s.Records = MaxRecords + 1 }, syscall.EINVAL},
		{"eventfd -2", func(s *rawRVMASetup) { s.Eventfd = -2 }, syscall.EINVAL},
		{"/dev/null as eventfd", func(s *rawRVMASetup) { s.Eventfd = int32(null.Fd()) }, syscall.EINVAL},
		{"a descriptor not open", func(s *rawRVMASetup) { s.Eventfd = 1 << 20 }, syscall.EBADF},
	} {
		s := good
		c.mod(&s)
		errno("SETUP with "+c.name, d.ioctl("setup", iocRVMASetup, unsafe.Pointer(&s)), c.want)
	}
	long := struct {
		rawRVMASetup
		Tail uint64
	}{good, 7}
	long.Size += 8
	errno("SETUP with a long size and a non-zero tail", d.ioctl("setup", iocRVMASetup, unsafe.Pointer(&long)), syscall.E2BIG)
	s := good
	if err := d.ioctl("setup", iocRVMASetup, unsafe.Pointer(&s)); err != nil {
		t.Fatalf("SETUP: %v", err)
	}
	if s.MmapOffset != uint64(rvmaOff) || s.MmapSize != uint64(2*os.Getpagesize()) {
		t.Errorf("SETUP answered offset %#x size %d", s.MmapOffset, s.MmapSize)
	}
	s2 := good
	errno("a second SETUP", d.ioctl("setup", iocRVMASetup, unsafe.Pointer(&s2)), syscall.EBUSY)
	// ARM wants an eventfd to signal, and no argument.
	errno("ARM without an eventfd", d.ioctl("arm", iocRVMAArm, nil), syscall.EINVAL)
	errno("ARM with an argument", d.ioctl("arm", iocRVMAArm, unsafe.Pointer(&s2)), syscall.EINVAL)
	for _, n := range []int{os.Getpagesize(), 3 * os.Getpagesize()} {
		mmapRefused(t, d, rvmaOff, n, syscall.EINVAL, fmt.Sprintf("of %d bytes", n))
	}
	mem, err := unix.Mmap(int(d.Fd()), rvmaOff, int(s.MmapSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	defer unix.Munmap(mem)
	done := func(id uint32) uint64 {
		return *(*uint64)(unsafe.Pointer(&mem[(id-1)*16]))
	}

	// WIN_CREATE and WIN_DESTROY.
	for _, k := range []uint32{0, 3} {
		_, err := create(d, k)
		errno("CREATE of kind "+string(rune('0'+k)), err, syscall.EINVAL)
	}
	bad := rawRVMAWin{Size: winSize - 8, Kind: uint32(CountBytes)}
	errno("CREATE with a short size", d.ioctl("create", iocRVMAWinCreate, unsafe.Pointer(&bad)), syscall.EINVAL)
	bad = rawRVMAWin{Size: winSize, Kind: uint32(CountBytes), Reserved: 1}
	errno("CREATE with reserved", d.ioctl("create", iocRVMAWinCreate, unsafe.Pointer(&bad)), syscall.EINVAL)
	bad = rawRVMAWin{Size: winSize, Kind: uint32(CountBytes), Flags: 2}
	errno("CREATE with an unknown flag", d.ioctl("create", iocRVMAWinCreate, unsafe.Pointer(&bad)), syscall.EINVAL)
	bad = rawRVMAWin{Size: winSize, Kind: uint32(CountBytes), Flags: rvmaWinMBKey, MBKey: 0xf0000100}
	errno("CREATE with a mailbox key given in", d.ioctl("create", iocRVMAWinCreate, unsafe.Pointer(&bad)), syscall.EINVAL)
	w1, err := create(d, uint32(CountBytes))
	if err != nil || w1 != 1 {
		t.Fatalf("CREATE: %d, %v", w1, err)
	}
	w2, err := create(d, uint32(CountOps))
	if err != nil || w2 != 2 {
		t.Fatalf("CREATE: %d, %v", w2, err)
	}
	_, err = create(d, uint32(CountBytes))
	errno("CREATE with every slot in use", err, syscall.ENOSPC)
	errno("DESTROY with a short size", destroy(d, w2, destroySize-4), syscall.EINVAL)
	for _, id := range []uint32{0, 3, 1 << 31} {
		errno("DESTROY of an unknown id", destroy(d, id, destroySize), syscall.ENOENT)
	}
	if err := destroy(d, w2, destroySize); err != nil {
		t.Fatalf("DESTROY: %v", err)
	}
	errno("DESTROY twice", destroy(d, w2, destroySize), syscall.ENOENT)
	if w2, err = create(d, uint32(CountOps)); err != nil || w2 != 2 {
		t.Fatalf("CREATE again: %d, %v", w2, err)
	}

	// POST's checks.
	ok := rawRVMAPost{Win: w1, Key: mr.RKey(), IOVA: base, Length: 4096, Threshold: 4096, Gen: 5, Record: 0}
	for _, c := range []struct {
		name string
		mod  func(*rawRVMAPost)
		want syscall.Errno
	}{
		{"a short size", func(p *rawRVMAPost) { p.Size = postSize - 8 }, syscall.EINVAL},
		{"the partial flag", func(p *rawRVMAPost) { p.Flags = uint32(RecordPartial) }, syscall.EINVAL},
		{"an unknown flag", func(p *rawRVMAPost) { p.Flags = 1 << 16 }, syscall.EINVAL},
		{"an rkey without the keyed flag", func(p *rawRVMAPost) { p.RKey = 1 }, syscall.EINVAL},
		{"length 0", func(p *rawRVMAPost) { p.Length = 0 }, syscall.EINVAL},
		{"length 4 GiB", func(p *rawRVMAPost) { p.Length = 1 << 32; p.Threshold = 1 }, syscall.EINVAL},
		{"threshold 0", func(p *rawRVMAPost) { p.Threshold = 0 }, syscall.EINVAL},
		{"a byte threshold beyond the length", func(p *rawRVMAPost) { p.Threshold = 4097 }, syscall.EINVAL},
		{"a record out of range", func(p *rawRVMAPost) { p.Record = 4 }, syscall.EINVAL},
		{"an address that wraps", func(p *rawRVMAPost) { p.IOVA = ^uint64(0) - 10 }, syscall.EINVAL},
		{"window 0", func(p *rawRVMAPost) { p.Win = 0 }, syscall.ENOENT},
		{"a free window slot", func(p *rawRVMAPost) { p.Win = 3 }, syscall.ENOENT},
		{"a key no region has", func(p *rawRVMAPost) { p.Key = 0x7ffffff0 }, syscall.ENOENT},
		{"a range before the region", func(p *rawRVMAPost) { p.IOVA = base - 4096 }, syscall.ERANGE},
		{"a range beyond the region", func(p *rawRVMAPost) { p.IOVA = base + mrSize - 4095 }, syscall.ERANGE},
	} {
		p := ok
		c.mod(&p)
		errno("POST with "+c.name, post(d, p), c.want)
	}
	if err := post(d, ok); err != nil {
		t.Fatalf("POST: %v", err)
	}
	p := ok
	p.IOVA, p.Record = base+8192, 1
	errno("POST of the same generation", post(d, p), syscall.EINVAL)
	p.Gen = 4
	errno("POST of an older generation", post(d, p), syscall.EINVAL)
	p.Gen, p.Record = 6, 0
	errno("POST into a pending buffer's record", post(d, p), syscall.EBUSY)
	p = rawRVMAPost{Win: w2, Key: mr.LKey(), IOVA: base + 4095, Length: 2, Threshold: 9, Gen: 0, Record: 1}
	errno("POST overlapping another window's pending buffer", post(d, p), syscall.EBUSY)
	p.IOVA = base + 4096 // adjacent: fine, and an ops threshold may exceed the length
	if err := post(d, p); err != nil {
		t.Fatalf("POST of an adjacent ops buffer: %v", err)
	}

	// POSTV's checks: the header's, then each post's as POST's, stopping
	// at the first that fails with the ones before it registered.
	postv := func(v rawRVMAPostV, ps []rawRVMAPost) (uint32, error) {
		if v.Size == 0 {
			v.Size = uint32(unsafe.Sizeof(rawRVMAPostV{}))
		}
		if len(ps) > 0 && v.Posts == 0 {
			for i := range ps {
				ps[i].Size = postSize
			}
			v.Posts = uint64(uintptr(unsafe.Pointer(&ps[0])))
		}
		err := d.ioctl("postv", iocRVMAPostV, unsafe.Pointer(&v))
		runtime.KeepAlive(ps)
		return v.Done, err
	}
	two := func() []rawRVMAPost {
		return []rawRVMAPost{{Win: w2, Key: mr.LKey(), IOVA: base + 16384, Length: 64, Threshold: 1, Gen: 1, Record: 2},
			{Win: w2, Key: mr.LKey(), IOVA: base + 16448, Length: 64, Threshold: 1, Gen: 2, Record: 3}}
	}
	for _, c := range []struct {
		name string
		v    rawRVMAPostV
	}{
		{"a short size", rawRVMAPostV{Size: uint32(unsafe.Sizeof(rawRVMAPostV{})) - 8, Count: 2}},
		{"count 0", rawRVMAPostV{Count: 0}},
		{"a count beyond the limit", rawRVMAPostV{Count: MaxPostMany + 1}},
		{"reserved", rawRVMAPostV{Count: 2, Reserved: 1}},
		{"done set", rawRVMAPostV{Count: 2, Done: 1}},
	} {
		_, err := postv(c.v, two())
		errno("POSTV with "+c.name, err, syscall.EINVAL)
	}
	n, err := postv(rawRVMAPostV{Count: 2, Posts: 8}, nil)
	errno("POSTV from an address not mapped", err, syscall.EFAULT)
	if n != 0 {
		t.Errorf("POSTV from an address not mapped: done %d", n)
	}
	bad2 := two()
	bad2[1].Gen = 1 // not above the first's
	if n, err = postv(rawRVMAPostV{Count: 2}, bad2); !errors.Is(err, syscall.EINVAL) || n != 1 {
		t.Errorf("POSTV whose second generation does not grow: done %d, %v; want 1, EINVAL", n, err)
	}
	again := two()[1:]
	if n, err = postv(rawRVMAPostV{Count: 1}, again); err != nil || n != 1 {
		t.Errorf("POSTV after a partial one: done %d, %v", n, err)
	}

	// Another file cannot gate the same region.
	other := open()
	so := good
	if err := other.ioctl("setup", iocRVMASetup, unsafe.Pointer(&so)); err != nil {
		t.Fatal(err)
	}
	ow, err := create(other, uint32(CountBytes))
	if err != nil {
		t.Fatal(err)
	}
	errno("POST into a region another file gates", post(other, rawRVMAPost{Win: ow, Key: mr.RKey(),
		IOVA: base + 32768, Length: 16, Threshold: 16, Record: 0}), syscall.EBUSY)

	// END's checks.
	errno("END with a short size", end(d, rawRVMAEnd{Size: endSize - 8, Win: w1, Gen: 5}), syscall.EINVAL)
	errno("END with the late flag", end(d, rawRVMAEnd{Win: w1, Gen: 5, Flags: uint32(RecordLate)}), syscall.EINVAL)
	errno("END with reserved", end(d, rawRVMAEnd{Win: w1, Gen: 5, Reserved: 1}), syscall.EINVAL)
	errno("END of an unknown window", end(d, rawRVMAEnd{Win: 3, Gen: 5}), syscall.ENOENT)
	errno("END of an unknown generation", end(d, rawRVMAEnd{Win: w1, Gen: 4}), syscall.ENOENT)
	errno("END of all from a later generation", end(d, rawRVMAEnd{Win: w1, Gen: 6, Flags: rvmaEndAll}), syscall.ENOENT)
	if err := end(d, rawRVMAEnd{Win: w1, Gen: 5, Flags: uint32(RecordPartial)}); err != nil {
		t.Fatalf("END: %v", err)
	}
	if done(w1) != 6 {
		t.Fatalf("done %d after END of generation 5", done(w1))
	}
	errno("END twice", end(d, rawRVMAEnd{Win: w1, Gen: 5}), syscall.ENOENT)
	p = ok
	p.Gen = 5
	errno("POST below done", post(d, p), syscall.EINVAL)
	p.Gen = 9 // generations may skip; the published range is replaced
	if err := post(d, p); err != nil {
		t.Fatalf("POST over a published buffer: %v", err)
	}

	// The per-file range limit: 65536 ranges, one byte each.
	lim := open()
	sl := rawRVMASetup{Size: setupSize, Windows: 1, Records: MaxRecords, Eventfd: -1}
	if err := lim.ioctl("setup", iocRVMASetup, unsafe.Pointer(&sl)); err != nil {
		t.Fatal(err)
	}
	lw, err := create(lim, uint32(CountBytes))
	if err != nil {
		t.Fatal(err)
	}
	mr2, err := pd.AllocMR(MaxRecords+1, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < MaxRecords; i++ {
		if err := post(lim, rawRVMAPost{Win: lw, Key: mr2.RKey(), IOVA: mr2.Addr() + uint64(i), Length: 1,
			Threshold: 1, Gen: uint64(i), Record: uint32(i)}); err != nil {
			t.Fatalf("POST %d: %v", i, err)
		}
	}
	// publish them all: the records are free, the closed ranges stay
	if err := end(lim, rawRVMAEnd{Win: lw, Gen: 0, Flags: rvmaEndAll}); err != nil {
		t.Fatalf("END of all: %v", err)
	}
	err = post(lim, rawRVMAPost{Win: lw, Key: mr2.RKey(), IOVA: mr2.Addr() + MaxRecords, Length: 1,
		Threshold: 1, Gen: MaxRecords, Record: 0})
	errno("POST beyond the range limit", err, syscall.ENOSPC)
	st, err := MailboxStatsFromSysfs("")
	if err != nil || st.Ranges < MaxRecords {
		t.Fatalf("stats %+v, %v", st, err)
	}
	if err := destroy(lim, lw, destroySize); err != nil {
		t.Fatal(err)
	}
	// a deregistered region's ranges are forgotten
	if err := mr.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err = MailboxStatsFromSysfs(""); err != nil || st.Ranges != 0 || st.MRs != 0 {
		t.Fatalf("after the region's deregistration: %+v, %v", st, err)
	}

	// Naming QPs: checks, and the per-file limit (no SETUP needed).
	qpSize := uint32(unsafe.Sizeof(rawRVMAQP{}))
	qp := func(d *Device, a rawRVMAQP) error {
		if a.Size == 0 {
			a.Size = qpSize
		}
		return d.ioctl("qp", iocRVMAQP, unsafe.Pointer(&a))
	}
	errno("QP with a short size", qp(d, rawRVMAQP{Size: qpSize - 4, QPN: 17}), syscall.EINVAL)
	errno("QP with reserved", qp(d, rawRVMAQP{QPN: 17, Reserved: 1}), syscall.EINVAL)
	errno("QP with unknown flags", qp(d, rawRVMAQP{QPN: 17, Flags: 2}), syscall.EINVAL)
	errno("QP number beyond 24 bits", qp(d, rawRVMAQP{QPN: 1 << 24}), syscall.EINVAL)
	errno("QP forget beyond 24 bits", qp(d, rawRVMAQP{QPN: 1 << 24, Flags: rvmaQPForget}), syscall.EINVAL)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), iocRVMAQP, 8); e != syscall.EFAULT {
		t.Errorf("QP from an unmapped address: %v, want EFAULT", e)
	}
	names := open()
	for i := uint32(0); i < MaxNamedQPs; i++ {
		if err := qp(names, rawRVMAQP{QPN: 0xffffff - i}); err != nil {
			t.Fatalf("naming QP %#x: %v", 0xffffff-i, err)
		}
	}
	errno("naming beyond the limit", qp(names, rawRVMAQP{QPN: 1}), syscall.ENOSPC)
	if err := qp(names, rawRVMAQP{QPN: 0xffffff}); err != nil {
		t.Errorf("naming a named QP at the limit: %v", err)
	}
	if err := qp(names, rawRVMAQP{QPN: 1, Flags: rvmaQPForget}); err != nil {
		t.Errorf("forgetting a QP never named: %v", err)
	}
	for _, a := range []rawRVMAQP{{QPN: 0xffffff, Flags: rvmaQPForget}, {QPN: 0xffffff, Flags: rvmaQPForget}, {QPN: 1}} {
		if err := qp(names, a); err != nil {
			t.Fatalf("%+v after the limit: %v", a, err)
		}
	}
	errno("naming beyond the limit again", qp(names, rawRVMAQP{QPN: 2}), syscall.ENOSPC)
}
