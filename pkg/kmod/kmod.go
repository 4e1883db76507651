package kmod

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DevicePath is the module's character device.
const DevicePath = "/dev/rdmaplus"

// ABIVersion is the RDMAPLUS_ABI_VERSION this package speaks.
const ABIVersion = 10

// Limits of the interface (uapi/rdmaplus.h).
const (
	MaxDomains  = 1024     // domain ids are 1..MaxDomains
	PageSize    = 4096     // granularity of the control bits
	EntryAlign  = 64       // every log entry is a multiple of this
	MinLogSize  = 4096     // smallest entry area
	MaxLogSize  = 64 << 20 // largest entry area
	EntryHeader = 64       // bytes of an entry's header
)

var (
	// ErrNotLoaded: /dev/rdmaplus does not exist.
	ErrNotLoaded = errors.New("kmod: " + DevicePath + " missing: the rdmaplus module is not loaded")
	// ErrABI: the running module speaks another ABI version, or it is
	// older than this package and refused a structure it does not know
	// (E2BIG).
	ErrABI = errors.New("kmod: module ABI mismatch")
	// ErrNotSupported: the module does not recognise this kernel's rxe
	// (or rdma_rxe is not loaded), so what needs its hooks, arming pages
	// and counted mailboxes, is refused (EOPNOTSUPP); or the module has no
	// JBMT. Version says so too.
	ErrNotSupported = errors.New("kmod: the running module does not recognise this kernel's rxe (RVMA and Active Access off)")
	// ErrNotOwner: the memory region belongs to another /dev/rdmaplus
	// file (EBUSY). Another process's region is reported as ErrNoRegion,
	// the same as no region at all, so that keys cannot be probed.
	ErrNotOwner = errors.New("kmod: memory region not owned by this process")
	// ErrNoRegion: no rxe memory region of the calling process has that
	// key (none at all, or another process's: the module does not tell
	// them apart), or no armed region has it on Disarm (ENOENT).
	ErrNoRegion = errors.New("kmod: no such memory region")
	// ErrRange: the pages are outside the memory region (ERANGE).
	ErrRange = errors.New("kmod: pages outside the memory region")
	// ErrTooManyDomains: this Device holds the module's per-file limit of
	// domains (EMFILE; the module parameter max_domains_per_file, 256 by
	// default), the user holds the per-user limit (EDQUOT, also ErrQuota),
	// or all MaxDomains domain ids of the host are in use (ENFILE).
	ErrTooManyDomains = errors.New("kmod: no free domain id")
	// ErrNoMemory: the log would take the user's locked memory beyond
	// RLIMIT_MEMLOCK (ulimit -l; the logs of every domain count, unless
	// the process has CAP_IPC_LOCK), or the kernel is out of memory (ENOMEM).
	ErrNoMemory = errors.New("kmod: log memory beyond RLIMIT_MEMLOCK, or out of memory")
	// ErrQuota: the calling user holds the module's per-user limit of a
	// resource the whole host shares: Active Access domains (module
	// parameter max_domains_per_user, 256 by default) or mailbox keys
	// (max_mbkeys_per_user, 4096) (EDQUOT).
	ErrQuota = errors.New("kmod: per-user limit reached")
	// ErrInvalid: an argument the kernel or this package refuses (EINVAL).
	ErrInvalid = errors.New("kmod: invalid argument")
	// ErrClosed: the Device or Domain was closed.
	ErrClosed = errors.New("kmod: closed")
)

// Error is a failed call into the module.
type Error struct {
	Op  string // the ioctl or system call
	Err error  // a syscall.Errno
}

func (e *Error) Error() string { return "kmod: " + e.Op + ": " + e.Err.Error() }

// Unwrap returns the errno.
func (e *Error) Unwrap() error { return e.Err }

// Is maps errnos onto this package's sentinel errors.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrNotSupported:
		return e.Err == syscall.EOPNOTSUPP
	case ErrNotOwner:
		return e.Err == syscall.EBUSY
	case ErrABI:
		return e.Err == syscall.E2BIG
	case ErrQuota:
		return e.Err == syscall.EDQUOT
	case ErrBusy:
		return e.Err == syscall.EBUSY
	case ErrFull:
		return e.Err == syscall.ENOSPC
	case ErrNotFound:
		return e.Err == syscall.ENOENT
	case ErrNoRegion:
		return e.Err == syscall.ENOENT
	case ErrRange:
		return e.Err == syscall.ERANGE
	case ErrTooManyDomains:
		return e.Err == syscall.EMFILE || e.Err == syscall.ENFILE || e.Err == syscall.EDQUOT
	case ErrNoMemory:
		return e.Err == syscall.ENOMEM
	case ErrInvalid:
		return e.Err == syscall.EINVAL
	case ErrGuard:
		return e.Err == syscall.EACCES
	}
	return false
}

// ABIError reports a version mismatch; errors.Is(err, ErrABI) holds.
type ABIError struct{ Module, Package uint32 }

func (e *ABIError) Error() string {
	return fmt.Sprintf("kmod: module ABI %d, this package speaks %d", e.Module, e.Package)
}

// Is makes errors.Is(err, ErrABI) true.
func (e *ABIError) Is(target error) bool { return target == ErrABI }

// Version is the module's answer to the version ioctl.
type Version struct {
	ABI          uint32
	ActiveAccess bool // the module recognised rxe and can arm pages
	Mailboxes    bool // ... and can gate and count mailboxes
	JBMT         bool // the module registers unpinned memory (any device)
	Release      string
}

// Device is an open /dev/rdmaplus.
type Device struct {
	f       *os.File
	mu      sync.Mutex
	domains map[*Domain]struct{}
	mbox    *Mailboxes
	closed  bool
	ver     Version
}

// Open opens /dev/rdmaplus and checks the module's ABI version. It returns
// an error wrapping ErrNotLoaded when the device is missing, an *ABIError
// on a version mismatch, or the open(2) error.
func Open() (*Device, error) {
	f, err := os.OpenFile(DevicePath, os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %v", ErrNotLoaded, err)
		}
		return nil, err
	}
	d := &Device{f: f, domains: map[*Domain]struct{}{}}
	var v rawVersion
	if err := d.ioctl("version", iocVersion, unsafe.Pointer(&v)); err != nil {
		f.Close()
		return nil, err
	}
	d.ver = Version{ABI: v.ABI, ActiveAccess: v.Flags&versionFlagAA != 0,
		Mailboxes: v.Flags&versionFlagRVMA != 0, JBMT: v.Flags&versionFlagJBMT != 0,
		Release: cstr(v.Release[:])}
	if v.ABI != ABIVersion {
		f.Close()
		return nil, &ABIError{Module: v.ABI, Package: ABIVersion}
	}
	return d, nil
}

// Version returns what the module reported when the Device was opened.
func (d *Device) Version() Version { return d.ver }

// Fd returns the device's descriptor (for poll(2): readable while some
// domain of this Device has unconsumed entries). It is valid until Close.
func (d *Device) Fd() uintptr { return d.f.Fd() }

func (d *Device) ioctl(op string, req uintptr, arg unsafe.Pointer) error {
	sc, err := d.f.SyscallConn()
	if err != nil {
		return &Error{Op: op, Err: syscall.EBADF}
	}
	var errno syscall.Errno
	if err := sc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(arg))
	}); err != nil {
		return fmt.Errorf("%w: %v", ErrClosed, err)
	}
	if errno != 0 {
		return &Error{Op: op, Err: errno}
	}
	return nil
}

// Stats are the module-wide Active Access counters.
type Stats struct {
	HooksArmed     bool   // the data-path probes are registered
	Domains        uint64 // live domains, all processes
	MRs            uint64 // memory regions with an active page
	Pages          uint64 // active pages
	Entries        uint64 // log entries written since load
	Bytes          uint64 // log bytes written (headers and data)
	DataBytes      uint64 // access data copied into logs
	Writes         uint64 // WRITE packets that touched an active page
	Reads          uint64 // READ response packets that touched one
	Atomics        uint64 // atomics that touched one
	HiddenWrites   uint64 // write packets W=0 kept out of memory
	ZeroedReads    uint64 // read packets R=0 served as zeros
	RefusedWrites  uint64 // write packets refused: log full
	RefusedAtomics uint64 // atomics refused: W=0, R=0 or log full
	LostReads      uint64 // read packets served as zeros: log full
	Missed         uint64 // probe hits the kernel skipped: must stay 0
}

// Stats reads the module's counters. It fails only if the Device is closed
// or the module misbehaves.
func (d *Device) Stats() (Stats, error) {
	r := rawStats{Size: uint32(unsafe.Sizeof(rawStats{}))}
	if err := d.ioctl("stats", iocStats, unsafe.Pointer(&r)); err != nil {
		return Stats{}, err
	}
	return Stats{HooksArmed: r.HooksArmed != 0, Domains: r.Domains, MRs: r.MRs, Pages: r.Pages,
		Entries: r.Entries, Bytes: r.Bytes, DataBytes: r.DataBytes, Writes: r.Writes, Reads: r.Reads,
		Atomics: r.Atomics, HiddenWrites: r.HiddenWrites, ZeroedReads: r.ZeroedReads,
		RefusedWrites: r.RefusedWrites, RefusedAtomics: r.RefusedAtomics, LostReads: r.LostReads,
		Missed: r.Missed}, nil
}

// Close closes the Device's domains and Mailboxes, and the device. It is
// idempotent.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	doms := make([]*Domain, 0, len(d.domains))
	for dm := range d.domains {
		doms = append(doms, dm)
	}
	mbox := d.mbox
	d.mu.Unlock()
	var first error
	if mbox != nil {
		first = mbox.close(false)
	}
	for _, dm := range doms {
		if err := dm.close(false); err != nil && first == nil {
			first = err
		}
	}
	if err := d.f.Close(); err != nil && first == nil {
		first = err
	}
	return first
}

// Bits are the control bits of an active page.
type Bits uint32

// Control bits (the paper's extended IOMMU PTE).
const (
	W   Bits = 1 << 0 // incoming writes change memory
	R   Bits = 1 << 1 // reads are served from memory (else zeros)
	WL  Bits = 1 << 2 // log a metadata entry per write packet
	WLD Bits = 1 << 3 // ... with the written data
	RL  Bits = 1 << 4 // log a metadata entry per read packet
	RLD Bits = 1 << 5 // ... with the data served
)

func (b Bits) String() string {
	s := ""
	for i, n := range []string{"W", "R", "WL", "WLD", "RL", "RLD"} {
		if b&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	if b&^0x3f != 0 || s == "" {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("%#x", uint32(b&^0x3f))
	}
	return s
}

// Domain is an Active Access domain with its mapped access log.
type Domain struct {
	dev  *Device
	id   uint32
	mem  []byte // ring page + entry area
	area []byte
	size uint64

	mu      sync.Mutex // Read, Notify, Close
	evt     *os.File
	dlMu    sync.Mutex // the eventfd's read deadline
	waitGen atomic.Uint64
	closed  atomic.Bool
}

// NewDomain creates a domain whose log has logSize bytes of entries (a
// power of two between MinLogSize and MaxLogSize) and maps the log.
// Errors wrap ErrInvalid, ErrTooManyDomains, ErrNoMemory, ErrClosed, or
// the errno of the ioctl or mmap.
func (d *Device) NewDomain(logSize int) (*Domain, error) {
	if logSize < MinLogSize || logSize > MaxLogSize || logSize&(logSize-1) != 0 {
		return nil, fmt.Errorf("%w: log size %d (a power of two in [%d, %d])", ErrInvalid, logSize, MinLogSize, MaxLogSize)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	c := rawCreate{Size: uint32(unsafe.Sizeof(rawCreate{})), LogSize: uint64(logSize)}
	if err := d.ioctl("domain create", iocDomainCreate, unsafe.Pointer(&c)); err != nil {
		return nil, err
	}
	dm := &Domain{dev: d, id: c.Domain, size: uint64(logSize)}
	mem, err := unix.Mmap(int(d.f.Fd()), int64(c.MmapOffset), int(c.MmapSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		dm.destroy()
		return nil, &Error{Op: "mmap", Err: err}
	}
	dm.mem = mem
	dm.area = mem[os.Getpagesize():]
	d.domains[dm] = struct{}{}
	return dm, nil
}

// ID returns the domain id (1..MaxDomains) written in its log entries.
func (dm *Domain) ID() uint32 { return dm.id }

// LogSize returns the bytes of the entry area.
func (dm *Domain) LogSize() int { return int(dm.size) }

func (dm *Domain) destroy() error {
	a := rawDomain{Size: uint32(unsafe.Sizeof(rawDomain{})), Domain: dm.id}
	return dm.dev.ioctl("domain destroy", iocDomainDestroy, unsafe.Pointer(&a))
}

// Arm associates the pages [iova, iova+length) of the memory region with
// the given key (its lkey or rkey) with this domain and the control bits,
// replacing what the pages had. iova and length must be multiples of
// PageSize. Errors wrap ErrNoRegion (no region of this process has the
// key; another process's is reported the same), ErrNotOwner (another
// Device armed it), ErrRange, ErrInvalid, ErrNotSupported, ErrClosed.
func (dm *Domain) Arm(key uint32, iova, length uint64, bits Bits) error {
	if dm.closed.Load() {
		return ErrClosed
	}
	if bits&^0x3f != 0 {
		return fmt.Errorf("%w: control bits %v", ErrInvalid, bits)
	}
	a := rawArm{Size: uint32(unsafe.Sizeof(rawArm{})), Domain: dm.id, Key: key, Bits: uint32(bits), IOVA: iova, Length: length}
	return dm.dev.ioctl("arm", iocArm, unsafe.Pointer(&a))
}

// Disarm makes the pages [iova, iova+length) of the region with this key
// inactive again, if they belong to this domain. Errors wrap ErrNoRegion
// (no armed region of this process has the key), ErrInvalid, ErrClosed.
func (dm *Domain) Disarm(key uint32, iova, length uint64) error {
	if dm.closed.Load() {
		return ErrClosed
	}
	a := rawArm{Size: uint32(unsafe.Sizeof(rawArm{})), Domain: dm.id, Key: key, IOVA: iova, Length: length}
	return dm.dev.ioctl("disarm", iocDisarm, unsafe.Pointer(&a))
}

// NotifyOptions says when the kernel wakes Wait.
type NotifyOptions struct {
	// Threshold wakes after this many entries since the last wake-up;
	// 0 disables count-based wake-ups.
	Threshold int
	// Interval wakes at most this long after the first entry logged
	// since the last wake-up (microsecond resolution, at most an hour);
	// 0 disables the timer.
	Interval time.Duration
	// Adaptive (needs Interval) moderates wake-ups: an entry logged
	// Interval or longer after the last wake-up wakes at once, and
	// entries that follow sooner wait until Interval after that wake-up
	// (or Threshold). An idle domain wakes without delay, a busy one at
	// most once per Interval.
	Adaptive bool
}

// Notify sets the notification policy and, on first use, creates the
// eventfd that Wait reads. Errors wrap ErrInvalid (a negative value, an
// Interval over an hour, Adaptive without Interval) or ErrClosed.
func (dm *Domain) Notify(o NotifyOptions) error {
	if o.Threshold < 0 || o.Threshold > math.MaxUint32 || o.Interval < 0 || o.Interval > time.Hour ||
		o.Adaptive && o.Interval == 0 {
		return fmt.Errorf("%w: notify %+v", ErrInvalid, o)
	}
	dm.mu.Lock()
	defer dm.mu.Unlock()
	if dm.closed.Load() {
		return ErrClosed
	}
	if dm.evt == nil {
		fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			return &Error{Op: "eventfd", Err: err}
		}
		dm.evt = os.NewFile(uintptr(fd), "rdmaplus-aa-eventfd")
	}
	us := uint32((o.Interval + time.Microsecond - 1) / time.Microsecond) // rounded up
	a := rawNotify{Size: uint32(unsafe.Sizeof(rawNotify{})), Domain: dm.id, Eventfd: int32(dm.evt.Fd()),
		Threshold: uint32(o.Threshold), IntervalUS: us}
	if o.Adaptive {
		a.Flags = notifyAdaptive
	}
	return dm.dev.ioctl("notify", iocNotify, unsafe.Pointer(&a))
}

// Wait blocks (parking the goroutine in the netpoller) until the kernel
// signals this domain or ctx ends; it returns how many notifications were
// pending. It needs Notify first (ErrInvalid otherwise); ctx's error when
// it ends; ErrClosed when the domain is closed meanwhile.
func (dm *Domain) Wait(ctx context.Context) (uint64, error) {
	dm.mu.Lock()
	evt := dm.evt
	dm.mu.Unlock()
	if evt == nil {
		return 0, fmt.Errorf("%w: Wait before Notify", ErrInvalid)
	}
	// A stale cancellation of an earlier Wait must not cut this one short:
	// each Wait has a generation and clears the deadline first.
	dm.dlMu.Lock()
	gen := dm.waitGen.Add(1)
	evt.SetReadDeadline(time.Time{})
	dm.dlMu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		dm.dlMu.Lock()
		if dm.waitGen.Load() == gen {
			evt.SetReadDeadline(time.Unix(1, 0))
		}
		dm.dlMu.Unlock()
	})
	defer stop()
	var b [8]byte
	_, err := evt.Read(b[:])
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if errors.Is(err, os.ErrClosed) {
			return 0, ErrClosed
		}
		return 0, &Error{Op: "read eventfd", Err: err}
	}
	return *(*uint64)(unsafe.Pointer(&b[0])), nil
}

// Wake makes a pending or the next Wait return, as if the kernel had
// signalled: for a consumer that must look at the log before the
// threshold is reached. It needs Notify first (ErrInvalid otherwise);
// ErrClosed when the domain is closed.
func (dm *Domain) Wake() error {
	dm.mu.Lock()
	evt := dm.evt
	dm.mu.Unlock()
	if evt == nil {
		return fmt.Errorf("%w: Wake before Notify", ErrInvalid)
	}
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	if _, err := evt.Write(one[:]); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return ErrClosed
		}
		return &Error{Op: "write eventfd", Err: err}
	}
	return nil
}

// Ring positions in the mapped header page.
func (dm *Domain) word(off uintptr) *uint64 { return (*uint64)(unsafe.Pointer(&dm.mem[off])) }

// Head returns the kernel's produced byte position and the sequence
// number of the last entry it committed.
func (dm *Domain) Head() (pos, seq uint64) {
	return atomic.LoadUint64(dm.word(offHead)), atomic.LoadUint64(dm.word(offHeadSeq))
}

// Tail returns the consumed byte position.
func (dm *Domain) Tail() uint64 { return atomic.LoadUint64(dm.word(offTail)) }

// Refused returns how many accesses the kernel refused because this log
// was full, and how many reads it served as zeros for the same reason.
func (dm *Domain) Refused() (refused, lost uint64) {
	return atomic.LoadUint64(dm.word(offRefused)), atomic.LoadUint64(dm.word(offLost))
}

// Op is a logged operation.
type Op uint16

// Logged operations.
const (
	OpWrite  Op = 2 // an incoming RDMA WRITE packet
	OpRead   Op = 3 // an RDMA READ response packet
	OpAtomic Op = 4 // an incoming compare-and-swap or fetch-and-add
)

func (o Op) String() string {
	switch o {
	case OpWrite:
		return "WRITE"
	case OpRead:
		return "READ"
	case OpAtomic:
		return "ATOMIC"
	}
	return fmt.Sprintf("Op(%d)", uint16(o))
}

// Entry flags.
const (
	FlagData       = 1 << 0 // Data holds the access's data
	FlagSuppressed = 1 << 1 // W=0: memory unchanged; R=0: the reader got zeros
)

// Entry is one logged access, the part of it within one page.
type Entry struct {
	Op         Op
	Flags      uint16
	Seq        uint64 // from 1, without gaps, per domain
	IOVA       uint64 // target address
	Length     uint32 // bytes of the access in this page
	Domain     uint32
	Key        uint32 // rkey of the region
	QPN        uint32 // local QP that served it (0: unknown)
	SrcQPN     uint32 // remote QP (0: unknown)
	TimeNS     uint64 // kernel monotonic clock
	Value      uint64 // atomics: the target's value before the operation
	Data       []byte // with FlagData: a copy of the data written or served
	Suppressed bool   // FlagSuppressed
}

// Read appends up to max entries (all available if max <= 0) to dst and
// releases their space to the kernel. It never returns part of an entry:
// the kernel publishes head only after an entry is complete. It returns
// ErrClosed after Close, or an error if the log's contents are corrupt.
func (dm *Domain) Read(dst []Entry, max int) ([]Entry, error) {
	dm.mu.Lock()
	defer dm.mu.Unlock()
	if dm.closed.Load() {
		return dst, ErrClosed
	}
	head := atomic.LoadUint64(dm.word(offHead))
	tail := atomic.LoadUint64(dm.word(offTail))
	n := 0
	for tail != head && (max <= 0 || n < max) {
		if head-tail > dm.size {
			return dst, fmt.Errorf("kmod: domain %d: head %d tail %d beyond a %d-byte log", dm.id, head, tail, dm.size)
		}
		off := tail & (dm.size - 1)
		h := (*rawEntry)(unsafe.Pointer(&dm.area[off]))
		if h.Len < EntryHeader || h.Len%EntryAlign != 0 || uint64(h.Len) > dm.size-off {
			return dst, fmt.Errorf("kmod: domain %d: corrupt entry of %d bytes at %d", dm.id, h.Len, tail)
		}
		tail += uint64(h.Len)
		if h.Op == opPad {
			continue
		}
		e := Entry{Op: Op(h.Op), Flags: h.Flags, Seq: h.Seq, IOVA: h.IOVA, Length: h.Length, Domain: h.Domain,
			Key: h.Key, QPN: h.QPN, SrcQPN: h.SrcQPN, TimeNS: h.TimeNS, Value: h.Value,
			Suppressed: h.Flags&FlagSuppressed != 0}
		if h.Flags&FlagData != 0 && h.DataLen > 0 && uint64(h.DataLen) <= uint64(h.Len)-EntryHeader {
			d := dm.area[off+EntryHeader : off+EntryHeader+uint64(h.DataLen)]
			e.Data = append([]byte(nil), d...)
		}
		dst = append(dst, e)
		n++
	}
	atomic.StoreUint64(dm.word(offTail), tail)
	return dst, nil
}

// Close disarms the domain's pages, destroys it and unmaps its log. It is
// idempotent.
func (dm *Domain) Close() error { return dm.close(true) }

func (dm *Domain) close(unlink bool) error {
	dm.mu.Lock()
	defer dm.mu.Unlock()
	if dm.closed.Swap(true) {
		return nil
	}
	err := dm.destroy()
	if errors.Is(err, ErrClosed) {
		err = nil // the device went first: the kernel tore it down
	}
	if dm.mem != nil {
		if e := unix.Munmap(dm.mem); e != nil && err == nil {
			err = &Error{Op: "munmap", Err: e}
		}
		dm.mem, dm.area = nil, nil
	}
	if dm.evt != nil {
		dm.evt.Close()
	}
	if unlink {
		dm.dev.mu.Lock()
		delete(dm.dev.domains, dm)
		dm.dev.mu.Unlock()
	}
	return err
}

func cstr(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
