package kmod

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Limits of the counted mailboxes (uapi/rdmaplus.h).
const (
	MaxWindows       = 4096      // window ids are 1..windows
	MaxRecords       = 65536     // completion records of one Mailboxes
	RecordSize       = 64        // bytes of a completion record
	MaxMailboxLength = 1<<32 - 1 // bytes of one posted buffer
)

var (
	// ErrBusy: the buffer overlaps a pending buffer of this Device in the
	// same memory region, its record is used by another pending buffer,
	// the region is gated by another /dev/rdmaplus file, or the Device
	// already has Mailboxes (EBUSY).
	ErrBusy = errors.New("kmod: busy")
	// ErrFull: every window slot is in use, or the Device gates the
	// module's limit of ranges (65536 per file) (ENOSPC).
	ErrFull = errors.New("kmod: no free window slot or range")
	// ErrNotFound: no such window, or (End) no pending generation
	// matches (ENOENT).
	ErrNotFound = errors.New("kmod: no such window or pending generation")
	// ErrGuard: a buffer of a window with a mailbox key posted outside a
	// guarded region, or one of another window inside one (EACCES).
	ErrGuard = errors.New("kmod: buffer and region guard disagree")
)

// CountKind is what the thresholds of a mailbox window count.
type CountKind uint32

// Window kinds.
const (
	CountBytes CountKind = 1 // bytes placed into the buffer
	CountOps   CountKind = 2 // RDMA WRITE messages whose last packet was placed
)

func (k CountKind) String() string {
	switch k {
	case CountBytes:
		return "bytes"
	case CountOps:
		return "ops"
	}
	return fmt.Sprintf("CountKind(%d)", uint32(k))
}

// RecordFlags are the flags of a completion record: the values of
// pkg/rvma's Flags.
type RecordFlags uint32

// Record flags.
const (
	RecordPartial RecordFlags = 1 << 0 // ended (End) before the threshold
	RecordClosed  RecordFlags = 1 << 1 // the window closed (End)
	RecordLate    RecordFlags = 1 << 2 // counted beyond the threshold
	RecordOneTime RecordFlags = 1 << 3 // posted with MailboxPost.OneTime
)

// Mailboxes are the counted mailboxes of one Device: window slots, and
// completion records in memory the kernel shares with the process. The
// kernel counts the RDMA WRITE packets placed into posted buffers, closes
// a buffer's gate at its threshold (later writes fail at their senders
// with a remote access error), publishes its record in generation order
// and signals Wait. See docs/kmod.md.
type Mailboxes struct {
	dev      *Device
	windows  int
	records  int
	recOff   int
	evt      *os.File
	dlMu     sync.Mutex // the eventfd's read deadline
	waitGen  atomic.Uint64
	mu       sync.RWMutex // the mapping: Close against its readers
	mem      []byte
	closed   bool
	created  map[uint32]struct{} // under mu (write)
	closedAt atomic.Bool
}

// Mailboxes sets up the Device's counted mailboxes: windows window slots
// (1..MaxWindows) and records completion records
// (1..MaxRecords), mapped into the process, and an eventfd for
// Wait. A Device has at most one Mailboxes in its life: a second call
// fails with ErrBusy, even after Close. Errors also wrap ErrInvalid,
// ErrNotSupported (the module does not know this kernel's rxe), ErrNoMemory
// (the mapping would exceed RLIMIT_MEMLOCK), ErrClosed, or the errno of
// eventfd or mmap.
func (d *Device) Mailboxes(windows, records int) (*Mailboxes, error) {
	if windows < 1 || windows > MaxWindows || records < 1 || records > MaxRecords {
		return nil, fmt.Errorf("%w: %d windows (1..%d), %d records (1..%d)", ErrInvalid,
			windows, MaxWindows, records, MaxRecords)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, &Error{Op: "eventfd", Err: err}
	}
	evt := os.NewFile(uintptr(fd), "rdmaplus-rvma-eventfd")
	s := rawRVMASetup{Size: uint32(unsafe.Sizeof(rawRVMASetup{})), Windows: uint32(windows),
		Records: uint32(records), Eventfd: int32(fd)}
	if err := d.ioctl("rvma setup", iocRVMASetup, unsafe.Pointer(&s)); err != nil {
		evt.Close()
		return nil, err
	}
	mem, err := unix.Mmap(int(d.f.Fd()), int64(s.MmapOffset), int(s.MmapSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		evt.Close()
		return nil, &Error{Op: "mmap", Err: err}
	}
	pg := os.Getpagesize()
	st := (windows*int(unsafe.Sizeof(rawWindowState{})) + pg - 1) / pg * pg
	m := &Mailboxes{dev: d, windows: windows, records: records, recOff: st, evt: evt, mem: mem,
		created: map[uint32]struct{}{}}
	d.mbox = m
	return m, nil
}

// Windows returns the number of window slots.
func (m *Mailboxes) Windows() int { return m.windows }

// Records returns the number of completion records.
func (m *Mailboxes) Records() int { return m.records }

// Record returns the address of completion record i (0..Records()-1) in
// the shared mapping: 64 bytes, eight little-endian 64-bit words (seq,
// epoch, addr, len, ops, cap, flags, seq), the layout of pkg/rvma's
// Completion. The kernel writes it with a sequence lock (LoadRecord reads
// it); the pointer stays valid until Close and must not be used after.
// It returns nil for an index out of range or after Close.
func (m *Mailboxes) Record(i int) unsafe.Pointer {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed || i < 0 || i >= m.records {
		return nil
	}
	return unsafe.Pointer(&m.mem[m.recOff+i*RecordSize])
}

// MailboxRecord is a published completion record.
type MailboxRecord struct {
	Seq   uint64 // even, grows by 2 with every publication into the slot
	Epoch uint64 // the buffer's generation
	Addr  uint64 // the buffer's first byte (MailboxPost.IOVA)
	Len   uint64 // bytes counted
	Ops   uint64 // WRITE messages counted
	Cap   uint64 // the buffer's length
	Flags RecordFlags
}

// LoadRecord returns record i and true, or false when nothing was ever
// published there (or i is out of range, or after Close). It retries while
// a publication is in progress, so the record is never torn.
func (m *Mailboxes) LoadRecord(i int) (MailboxRecord, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed || i < 0 || i >= m.records {
		return MailboxRecord{}, false
	}
	w := (*[8]uint64)(unsafe.Pointer(&m.mem[m.recOff+i*RecordSize]))
	for {
		s1 := atomic.LoadUint64(&w[0])
		if s1 == 0 {
			return MailboxRecord{}, false
		}
		if s1&1 != 0 {
			continue
		}
		r := MailboxRecord{Seq: s1, Epoch: atomic.LoadUint64(&w[1]), Addr: atomic.LoadUint64(&w[2]),
			Len: atomic.LoadUint64(&w[3]), Ops: atomic.LoadUint64(&w[4]), Cap: atomic.LoadUint64(&w[5]),
			Flags: RecordFlags(atomic.LoadUint64(&w[6]))}
		if atomic.LoadUint64(&w[7]) == s1 && atomic.LoadUint64(&w[0]) == s1 {
			return r, true
		}
	}
}

func (m *Mailboxes) state(id uint32) *rawWindowState {
	if m.closed || id < 1 || int(id) > m.windows {
		return nil
	}
	return (*rawWindowState)(unsafe.Pointer(&m.mem[(int(id)-1)*int(unsafe.Sizeof(rawWindowState{}))]))
}

// Done returns window id's done counter: the generation the kernel will
// publish next (one past the last published). Its record is visible
// before Done moves (an acquire load). It returns 0 for an id out of
// range and after Close.
func (m *Mailboxes) Done(id uint32) uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if s := m.state(id); s != nil {
		return atomic.LoadUint64(&s.Done)
	}
	return 0
}

// Refused returns how many write packets the kernel refused for window
// id (gate closed, or straddling a buffer's edge). It returns 0 for an id
// out of range and after Close.
func (m *Mailboxes) Refused(id uint32) uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if s := m.state(id); s != nil {
		return atomic.LoadUint64(&s.Refused)
	}
	return 0
}

// CreateWindow creates a window whose thresholds count kind and returns
// its id (1..Windows()); its done and refused counters start at 0. Errors
// wrap ErrInvalid (unknown kind), ErrFull (every slot in use) or ErrClosed.
func (m *Mailboxes) CreateWindow(kind CountKind) (uint32, error) {
	c, err := m.create(kind, 0)
	return c.ID, err
}

// create creates a window with flags (rvmaWinMBKey or 0).
func (m *Mailboxes) create(kind CountKind, flags uint32) (rawRVMAWin, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return rawRVMAWin{}, ErrClosed
	}
	c := rawRVMAWin{Size: uint32(unsafe.Sizeof(rawRVMAWin{})), Kind: uint32(kind), Flags: flags}
	if err := m.dev.ioctl("rvma window create", iocRVMAWinCreate, unsafe.Pointer(&c)); err != nil {
		return rawRVMAWin{}, err
	}
	m.created[c.ID] = struct{}{}
	return c, nil
}

// CreateMailboxWindow creates a window as CreateWindow does, with a
// mailbox key: senders RDMA WRITE to it with rkey key at remote address
// MailboxAddr(gen, offset), and the module places each message into the
// window's pending buffer of generation gen (modulo 2^24) at offset, if
// that buffer's gate is open and the message fits; otherwise the sender's
// write fails with a remote access error and Refused counts it. Buffers
// are posted without Keyed, in regions that Guard made accept only what
// the module translated, in the PD of the queue pairs that write to them
// (Post fails with ErrGuard outside a guarded region). Before destroying
// the window, End all of its generations and let the queue pairs that
// write to it drain: a message translated just before may still be queued
// at the responder. Errors as for CreateWindow; ErrFull also when every
// mailbox key is in use.
func (m *Mailboxes) CreateMailboxWindow(kind CountKind) (id, key uint32, err error) {
	c, err := m.create(kind, rvmaWinMBKey)
	return c.ID, c.MBKey, err
}

// Guard makes the memory region with key (an lkey or rkey of an rxe
// region this process registered, with remote write and without remote
// read) accept only the writes the module translates from a mailbox key,
// until it is deregistered or the Mailboxes closed: its own rkey, which
// the translation needs, then lets nothing in by itself. Buffers of
// windows with a mailbox key must lie in guarded regions, and others
// outside them. Guarding a region twice is not an error. Errors wrap
// ErrInvalid (the region has no remote access), ErrNotFound (no region
// of this process has the key: another process's is reported the same),
// ErrNotOwner (another file gates it), ErrBusy (this Mailboxes gates it for windows without a
// mailbox key), ErrNotSupported or ErrClosed.
func (m *Mailboxes) Guard(key uint32) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	a := rawRVMAGuard{Size: uint32(unsafe.Sizeof(rawRVMAGuard{})), Key: key}
	return m.dev.ioctl("rvma guard", iocRVMAGuard, unsafe.Pointer(&a))
}

// MailboxOffsetBits is how many low bits of a mailbox address hold the
// offset; the 24 bits above them hold the generation.
const MailboxOffsetBits = 40

// MailboxAddr is the remote address of byte offset of generation gen's
// buffer in a window with a mailbox key. Only gen's low 24 bits are sent:
// the module takes the pending buffer whose generation matches them. An
// offset of 1<<MailboxOffsetBits or more wraps ErrInvalid.
func MailboxAddr(gen, offset uint64) (uint64, error) {
	if offset>>MailboxOffsetBits != 0 {
		return 0, fmt.Errorf("%w: mailbox offset %d needs more than %d bits", ErrInvalid, offset, MailboxOffsetBits)
	}
	return (gen&(1<<24-1))<<MailboxOffsetBits | offset, nil
}

// DestroyWindow forgets every buffer of window id, pending or published,
// and frees the id. Writes to those buffers are no longer gated or
// counted: invalidate the keys that reach them first. Pending buffers get
// no record. Errors wrap ErrNotFound (no such window) or ErrClosed.
func (m *Mailboxes) DestroyWindow(id uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	return m.destroy(id)
}

func (m *Mailboxes) destroy(id uint32) error {
	a := rawRVMAWinDestroy{Size: uint32(unsafe.Sizeof(rawRVMAWinDestroy{})), ID: id}
	err := m.dev.ioctl("rvma window destroy", iocRVMAWinDestroy, unsafe.Pointer(&a))
	if err == nil || errors.Is(err, syscall.ENOENT) {
		delete(m.created, id)
	}
	return err
}

// MailboxPost is a buffer to post into a window.
type MailboxPost struct {
	Key       uint32 // lkey or rkey of an rxe memory region this process registered
	IOVA      uint64 // the buffer's first byte, in the region's address space
	Length    uint64 // bytes, 1..MaxMailboxLength, inside the region
	Threshold uint64 // bytes window: 1..Length bytes; ops window: >= 1 messages
	Gen       uint64 // greater than the window's last posted, not below Done; with a mailbox key, less than 2^24 past the oldest pending
	Record    uint32 // the record to publish into, not used by another pending buffer
	OneTime   bool   // RecordOneTime in the record
	// Keyed lets in only write messages sent with RKey (the key of the
	// memory window senders of this generation were given): a write
	// with the key of an earlier generation's window, still bound over
	// the buffer, is refused like one into a closed gate. So are packets
	// whose headers the module cannot parse. With RKey 0 no write is let
	// in (a buffer posted only to be ended).
	Keyed bool
	RKey  uint32 // with Keyed; zero otherwise
}

// Post posts a buffer into window id with an open gate. Published buffers
// it overlaps (kept to refuse late writes) are replaced. Errors wrap
// ErrInvalid (a bad length, threshold, record index or generation),
// ErrNotFound (no such window), ErrBusy (overlaps a pending buffer, its
// record is in use, or another file gates the region), ErrNotFound and
// ErrNoRegion (ENOENT: no region of this process has the key; another
// process's is reported the same), ErrRange (outside the region), ErrFull
// (range limit of the file or the window), ErrNoMemory (the buffer records
// would take the user's locked memory beyond RLIMIT_MEMLOCK),
// ErrNotSupported or ErrClosed.
func (m *Mailboxes) Post(id uint32, p MailboxPost) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	a := p.raw(id)
	return m.dev.ioctl("rvma post", iocRVMAPost, unsafe.Pointer(&a))
}

// raw is p as the module reads it, for window id.
func (p MailboxPost) raw(id uint32) rawRVMAPost {
	a := rawRVMAPost{Size: uint32(unsafe.Sizeof(rawRVMAPost{})), Win: id, Key: p.Key, IOVA: p.IOVA,
		Length: p.Length, Threshold: p.Threshold, Gen: p.Gen, Record: p.Record}
	if p.OneTime {
		a.Flags = uint32(RecordOneTime)
	}
	if p.Keyed {
		a.Flags |= rvmaPostKeyed
		a.RKey = p.RKey
	}
	return a
}

// MaxPostMany is the most buffers one PostMany call registers.
const MaxPostMany = 64

// PostMany posts the buffers into window id in order, as Post would each,
// with one system call per MaxPostMany of them. It returns how many were
// posted: on an error (Post's) the ones before it stay posted and the
// rest are not.
func (m *Mailboxes) PostMany(id uint32, ps []MailboxPost) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return 0, ErrClosed
	}
	raw := make([]rawRVMAPost, min(len(ps), MaxPostMany))
	done := 0
	for done < len(ps) {
		chunk := ps[done:min(len(ps), done+MaxPostMany)]
		for i, p := range chunk {
			raw[i] = p.raw(id)
		}
		v := rawRVMAPostV{Size: uint32(unsafe.Sizeof(rawRVMAPostV{})), Count: uint32(len(chunk)),
			Posts: uint64(uintptr(unsafe.Pointer(&raw[0])))}
		err := m.dev.ioctl("rvma post", iocRVMAPostV, unsafe.Pointer(&v))
		runtime.KeepAlive(raw)
		done += min(int(v.Done), len(chunk))
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// MaxNamedQPs is the most queue pairs one Device may have named.
const MaxNamedQPs = 65536

// NameQP tells the module that the local queue pair qpn may receive writes
// into keyed buffers (MailboxPost.Keyed) of this Device. The module keeps
// the key of each queue pair's message in progress, and for a queue pair
// it has not seen it allocates that entry as the first packet comes in;
// when that allocation fails, the packet is refused and the sender sees a
// remote access error, as for a stale write. A named queue pair's entry
// is allocated here, so its writes never need memory. Naming a named
// queue pair does nothing. Errors wrap ErrInvalid (qpn above 0xffffff),
// ErrFull (MaxNamedQPs named), ErrNoMemory or ErrClosed.
func (m *Mailboxes) NameQP(qpn uint32) error {
	return m.qp("rvma name qp", qpn, 0)
}

// ForgetQP undoes NameQP; call it before destroying the queue pair, whose
// number the device reuses. A message still in progress on it is let in
// to its end. Forgetting a queue pair that is not named does nothing.
// Errors wrap ErrInvalid (qpn above 0xffffff) or ErrClosed.
func (m *Mailboxes) ForgetQP(qpn uint32) error {
	return m.qp("rvma forget qp", qpn, rvmaQPForget)
}

func (m *Mailboxes) qp(op string, qpn, flags uint32) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	a := rawRVMAQP{Size: uint32(unsafe.Sizeof(rawRVMAQP{})), QPN: qpn, Flags: flags}
	return m.dev.ioctl(op, iocRVMAQP, unsafe.Pointer(&a))
}

// End ends pending generation gen of window id now (with all, every
// pending generation from gen on): its gate closes and it is published,
// with the true counts and flags (RecordPartial and/or RecordClosed),
// once every earlier generation is. Errors wrap ErrNotFound (no such
// window, or no such generation pending: unknown, already ended or
// published), ErrInvalid (other flags) or ErrClosed.
func (m *Mailboxes) End(id uint32, gen uint64, flags RecordFlags, all bool) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	a := rawRVMAEnd{Size: uint32(unsafe.Sizeof(rawRVMAEnd{})), Win: id, Flags: uint32(flags), Gen: gen}
	if all {
		a.Flags |= rvmaEndAll
	}
	return m.dev.ioctl("rvma end", iocRVMAEnd, unsafe.Pointer(&a))
}

// Arm makes the kernel signal the next publication (once) to Wait. The
// kernel signals nothing unarmed, so a process that polls its records
// takes no wake-ups. A waiter arms, then reads Done, then waits: a
// publication before Arm shows in Done, one after it ends the Wait.
// Errors wrap ErrClosed.
func (m *Mailboxes) Arm() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	return m.dev.ioctl("rvma arm", iocRVMAArm, nil)
}

// Wait blocks (parking the goroutine in the netpoller) until the kernel
// has published a record after an Arm, or ctx ends; it consumes the
// signal. It returns ctx's error when ctx ends, ErrClosed when the
// Mailboxes are closed before or meanwhile, or the eventfd's read error.
// Without an Arm since the last signal it waits for ctx or Close.
func (m *Mailboxes) Wait(ctx context.Context) error {
	if m.closedAt.Load() {
		return ErrClosed
	}
	m.dlMu.Lock()
	gen := m.waitGen.Add(1)
	m.evt.SetReadDeadline(time.Time{})
	m.dlMu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		m.dlMu.Lock()
		if m.waitGen.Load() == gen {
			m.evt.SetReadDeadline(time.Unix(1, 0))
		}
		m.dlMu.Unlock()
	})
	defer stop()
	var b [8]byte
	if _, err := m.evt.Read(b[:]); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, os.ErrClosed) {
			return ErrClosed
		}
		return &Error{Op: "read eventfd", Err: err}
	}
	return nil
}

// Close destroys the windows created through these Mailboxes (their
// buffers are no longer gated), unmaps the records and closes the
// eventfd, waking a pending Wait with ErrClosed. Pointers from Record are
// invalid afterwards. It is idempotent; the Device stays open but cannot
// set up Mailboxes again.
func (m *Mailboxes) Close() error { return m.close(true) }

func (m *Mailboxes) close(unlink bool) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.closedAt.Store(true)
	var first error
	for id := range m.created {
		if err := m.destroy(id); err != nil && !errors.Is(err, ErrClosed) && first == nil {
			first = err
		}
	}
	if err := unix.Munmap(m.mem); err != nil && first == nil {
		first = &Error{Op: "munmap", Err: err}
	}
	m.mem = nil
	m.mu.Unlock()
	m.evt.Close()
	if unlink {
		m.dev.mu.Lock()
		if m.dev.mbox == m {
			m.dev.mbox = nil
		}
		m.dev.mu.Unlock()
	}
	return first
}
