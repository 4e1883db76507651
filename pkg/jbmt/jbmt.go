package jbmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
)

var (
	// ErrNotSupported: the rdmaplus module is not loaded, or it has no
	// JBMT (an older module).
	ErrNotSupported = errors.New("jbmt: the rdmaplus module with JBMT is not loaded")
	// ErrInvalid: an argument the service refuses (no rights, an empty
	// buffer, a malformed token).
	ErrInvalid = errors.New("jbmt: invalid argument")
	// ErrQuota: the user holds as many regions as the module allows
	// (its max_jbmt_regions_per_user parameter).
	ErrQuota = errors.New("jbmt: region quota of this user reached")
	// ErrClosed: the Service or Region was closed.
	ErrClosed = errors.New("jbmt: closed")
	// ErrBadToken: the peer never issued that token (a wrong or forged
	// token, or one issued before its module was loaded again). The
	// connection is still up.
	ErrBadToken = errors.New("jbmt: no such region on the peer")
	// ErrStale: the peer issued that token and has since revoked it (its
	// owner closed the Region or the Service, or exited). The connection
	// is still up; ask the owner for a new token.
	ErrStale = errors.New("jbmt: the region was revoked by its owner")
	// ErrPermission: the region does not grant the right (Read for a
	// Get, Write for a Put).
	ErrPermission = errors.New("jbmt: the region does not grant that right")
	// ErrRange: the transfer reaches outside the region.
	ErrRange = errors.New("jbmt: outside the region")
	// ErrFault: pages of the buffer, or of the peer's region, are not
	// mapped (or the region's process is gone).
	ErrFault = errors.New("jbmt: pages not mapped")
	// ErrPeerGone: the connection is down (Dial again to make it anew).
	ErrPeerGone = errors.New("jbmt: connection to the peer is down")
	// ErrBusy: the completion ring holds as many transfers in flight and
	// completions not yet polled as it has entries (Options.RingEntries);
	// Poll, then start again.
	ErrBusy = errors.New("jbmt: too many transfers in flight: poll completions first")
)

// Rights are what peers may do with a region.
type Rights uint32

const (
	Read  Rights = Rights(kmod.JBMTRead)  // peers may get from the region
	Write Rights = Rights(kmod.JBMTWrite) // peers may put into it
)

// Token names a registered region to any host: the region's id on its
// host, the registration's generation (an id is reused once its region is
// gone; a generation is not), 64 random bits, and the rights granted.
// A token cannot be derived from another. Peers get it from the region's
// owner by any channel (TokenSize bytes: MarshalBinary).
type Token struct {
	ID     uint32
	Gen    uint32
	Key    uint64
	Rights Rights
}

// TokenSize is the length of a marshalled Token.
const TokenSize = 20

// MarshalBinary encodes the token in TokenSize bytes (little-endian id,
// generation, key, rights). It never fails.
func (t Token) MarshalBinary() ([]byte, error) {
	b := make([]byte, TokenSize)
	binary.LittleEndian.PutUint32(b[0:], t.ID)
	binary.LittleEndian.PutUint32(b[4:], t.Gen)
	binary.LittleEndian.PutUint64(b[8:], t.Key)
	binary.LittleEndian.PutUint32(b[16:], uint32(t.Rights))
	return b, nil
}

// UnmarshalBinary decodes what MarshalBinary encoded. Errors wrap
// ErrInvalid: a length other than TokenSize, an id of 0 or beyond the
// module's, or unknown rights.
func (t *Token) UnmarshalBinary(b []byte) error {
	if len(b) != TokenSize {
		return fmt.Errorf("%w: a token is %d bytes, not %d", ErrInvalid, TokenSize, len(b))
	}
	n := Token{ID: binary.LittleEndian.Uint32(b[0:]), Gen: binary.LittleEndian.Uint32(b[4:]),
		Key: binary.LittleEndian.Uint64(b[8:]), Rights: Rights(binary.LittleEndian.Uint32(b[16:]))}
	if n.ID == 0 || n.ID > kmod.JBMTMaxID || n.Rights == 0 || n.Rights&^(Read|Write) != 0 {
		return fmt.Errorf("%w: malformed token (id %d, rights %#x)", ErrInvalid, n.ID, uint32(n.Rights))
	}
	*t = n
	return nil
}

// Options configure a Service; nil means the defaults (there are no
// other settings yet).
type Options struct {
	// RingEntries sizes the completion ring of asynchronous transfers
	// (StartGet, StartPut): a power of two, at most 65536; 0 means
	// DefaultRingEntries. It bounds the transfers in flight plus the
	// completions not yet polled, and its pages count against
	// RLIMIT_MEMLOCK (64 bytes an entry). The ring is made by the first
	// Start.
	RingEntries int
}

// Service is this process's use of the JBMT service: an open
// /dev/rdmaplus. It is safe for concurrent use.
type Service struct {
	mu      sync.Mutex
	dev     *kmod.Device
	regions map[*Region]struct{}
	closed  bool

	ringEntries int
	ring        *kmod.JBMTRing     // asynchronous transfers, from the first Start
	pending     map[uint64]pending // by the id the module echoes
	nextID      uint64
	cqes        []kmod.JBMTCQE // Poll's scratch
}

// Open opens the service (nil Options: the defaults). Errors wrap
// ErrInvalid (Options.RingEntries not a power of two up to 65536),
// ErrNotSupported (no module, or one without JBMT) or the device's open
// error.
func Open(o *Options) (*Service, error) {
	entries := DefaultRingEntries
	if o != nil && o.RingEntries != 0 {
		entries = o.RingEntries
	}
	if entries < 1 || entries > kmod.JBMTMaxRing || entries&(entries-1) != 0 {
		return nil, fmt.Errorf("%w: %d ring entries (a power of two up to %d)", ErrInvalid, entries, kmod.JBMTMaxRing)
	}
	d, err := kmod.Open()
	if err != nil {
		if errors.Is(err, kmod.ErrNotLoaded) || errors.Is(err, kmod.ErrABI) {
			return nil, fmt.Errorf("%w: %w", ErrNotSupported, err)
		}
		return nil, fmt.Errorf("jbmt: %w", err)
	}
	if !d.Version().JBMT {
		d.Close()
		return nil, fmt.Errorf("%w (module %s)", ErrNotSupported, d.Version().Release)
	}
	return &Service{dev: d, regions: map[*Region]struct{}{}, ringEntries: entries}, nil
}

// Close revokes every region of the Service and closes it; asynchronous
// transfers still in flight are cancelled (their completions are not
// delivered) and have ended when it returns. A second Close returns nil.
func (s *Service) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for r := range s.regions {
		r.closed = true
	}
	s.regions = nil
	if s.ring != nil {
		s.ring.Close()
	}
	// the module cancels the transfers in flight and waits for them, then
	// revokes the file's regions; their buffers may go after this
	err := s.dev.Close()
	s.pending = nil
	return err
}

// Region is a registered range of memory.
type Region struct {
	s      *Service
	buf    []byte
	token  Token
	closed bool // under s.mu
}

// Register registers b with rights r (Read, Write or both) and returns the
// region; nothing is pinned, and the cost does not depend on len(b). b
// must stay mapped until the region is closed (Alloc's memory, or any
// mapping the caller keeps; never memory of the Go heap). Errors wrap
// ErrInvalid (no or unknown rights, an empty b), ErrQuota, ErrClosed, or
// the module's error.
func (s *Service) Register(b []byte, r Rights) (*Region, error) {
	if r == 0 || r&^(Read|Write) != 0 {
		return nil, fmt.Errorf("%w: rights %#x", ErrInvalid, uint32(r))
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: an empty buffer", ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("jbmt: register: %w", ErrClosed)
	}
	t, err := s.dev.JBMTRegister(uintptr(unsafe.Pointer(&b[0])), uint64(len(b)), uint32(r))
	if err != nil {
		return nil, wrap("register", err)
	}
	reg := &Region{s: s, buf: b, token: Token{ID: t.ID, Gen: t.Gen, Key: t.Key, Rights: r}}
	s.regions[reg] = struct{}{}
	return reg, nil
}

// Token returns the region's token (valid until the region is closed).
func (r *Region) Token() Token { return r.token }

// Bytes returns the registered memory.
func (r *Region) Bytes() []byte { return r.buf }

// Close revokes the region's token. A second Close, or one after the
// Service's, returns nil.
func (r *Region) Close() error {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	delete(s.regions, r)
	t := r.token
	return wrap("deregister", s.dev.JBMTDeregister(kmod.JBMTToken{ID: t.ID, Gen: t.Gen, Key: t.Key}))
}

// Alloc maps n bytes of zeroed anonymous memory outside the Go heap, with
// no swap reserved (MAP_NORESERVE: memory larger than RAM can be
// registered; pages are found as they are touched). Release it with Free
// once no region uses it. Errors wrap ErrInvalid (n < 1) or mmap's error.
func Alloc(n int) ([]byte, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: alloc of %d bytes", ErrInvalid, n)
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("jbmt: alloc of %d bytes: %w", n, err)
	}
	return b, nil
}

// Free unmaps memory from Alloc. A region still registered over it stays
// registered: a transfer then finds no pages and fails.
func Free(b []byte) error {
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("jbmt: free: %w", err)
	}
	return nil
}

// Stats are the host's JBMT counters.
type Stats = kmod.JBMTStats

// ReadStats reads the host's counters (from sysfs; no Service needed).
// Errors wrap ErrNotSupported when the module (with JBMT) is not loaded.
func ReadStats() (Stats, error) {
	st, err := kmod.JBMTStatsFromSysfs("")
	if err != nil {
		return Stats{}, fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	return st, nil
}

// wrap maps the module's errors onto this package's sentinels.
func wrap(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kmod.ErrClosed):
		return fmt.Errorf("jbmt: %s: %w", op, ErrClosed)
	case errors.Is(err, kmod.ErrQuota):
		return fmt.Errorf("jbmt: %s: %w: %w", op, ErrQuota, err)
	case errors.Is(err, kmod.ErrInvalid):
		return fmt.Errorf("jbmt: %s: %w: %w", op, ErrInvalid, err)
	case errors.Is(err, kmod.ErrNotSupported):
		return fmt.Errorf("jbmt: %s: %w: %w", op, ErrNotSupported, err)
	}
	return fmt.Errorf("jbmt: %s: %w", op, err)
}
