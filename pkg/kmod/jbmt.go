package kmod

import (
	"encoding/binary"
	"net/netip"
	"path/filepath"
	"syscall"
	"time"
	"unsafe"
)

// JBMT registration: the module keeps a range of the process's address
// space and the rights peers have on it, and answers a token; nothing is
// pinned (docs/jbmt.md). pkg/jbmt is the application's interface.

// JBMT rights on a registered region.
const (
	JBMTRead  uint32 = 1 << 0 // peers may get from the region
	JBMTWrite uint32 = 1 << 1 // peers may put into it
	// JBMTMaxID is the largest region id.
	JBMTMaxID uint32 = 1<<24 - 1
)

// JBMTToken names a registered region to any host: its id there, the
// registration's generation and 64 random bits.
type JBMTToken struct {
	ID  uint32
	Gen uint32
	Key uint64
}

// JBMTRegister registers length bytes at addr of this process's address
// space with rights (JBMTRead, JBMTWrite), pinning nothing. The range
// need not be mapped now. Errors wrap ErrInvalid (rights, an empty range
// or one outside user space), ErrQuota (the user's
// max_jbmt_regions_per_user), ErrFull (no free id on the host),
// ErrNoMemory, ErrClosed, or ErrNotSupported (a module without JBMT).
func (d *Device) JBMTRegister(addr uintptr, length uint64, rights uint32) (JBMTToken, error) {
	if !d.ver.JBMT {
		return JBMTToken{}, &Error{Op: "jbmt register", Err: syscall.EOPNOTSUPP}
	}
	a := rawJBMTReg{Size: uint32(unsafe.Sizeof(rawJBMTReg{})), Rights: rights, Addr: uint64(addr), Length: length}
	if err := d.ioctl("jbmt register", iocJBMTReg, unsafe.Pointer(&a)); err != nil {
		return JBMTToken{}, err
	}
	return a.Token, nil
}

// JBMTDeregister revokes a token this Device registered: no transfer
// starts on it afterwards. Errors wrap ErrNoRegion (no such region, or
// another Device's: the same answer), ErrClosed.
func (d *Device) JBMTDeregister(t JBMTToken) error {
	a := rawJBMTDereg{Size: uint32(unsafe.Sizeof(rawJBMTDereg{})), Token: t}
	return d.ioctl("jbmt deregister", iocJBMTDereg, unsafe.Pointer(&a))
}

// JBMTConnectMax is the longest JBMTConnect waits.
const JBMTConnectMax = 60 * time.Second

// JBMTConnect returns the id of this host's connection to the JBMT
// service at addr (an IPv4 address; port 0 means the module's jbmt_port),
// making it if it is not up, waiting at most timeout (0 or more than
// JBMTConnectMax: JBMTConnectMax). One connection per peer host serves
// every process. Errors wrap ErrInvalid (not IPv4), ErrClosed,
// ErrNotSupported (a module without JBMT, or one that could not listen),
// or the errno: ETIMEDOUT, EHOSTUNREACH, ECONNREFUSED (nothing listens
// there), ECONNRESET, EINTR, ENOSPC (the host keeps max_jbmt_peers
// connections).
func (d *Device) JBMTConnect(addr netip.AddrPort, timeout time.Duration) (uint32, error) {
	if !d.ver.JBMT {
		return 0, &Error{Op: "jbmt connect", Err: syscall.EOPNOTSUPP}
	}
	if !addr.Addr().Unmap().Is4() {
		return 0, &Error{Op: "jbmt connect", Err: syscall.EINVAL}
	}
	if timeout <= 0 || timeout > JBMTConnectMax {
		timeout = JBMTConnectMax
	}
	a := rawJBMTConnect{Size: uint32(unsafe.Sizeof(rawJBMTConnect{})), Addr: addr.Addr().Unmap().As4(),
		TimeoutMS: uint32(max(timeout/time.Millisecond, 1))}
	binary.BigEndian.PutUint16(a.Port[:], addr.Port())
	if err := d.ioctl("jbmt connect", iocJBMTConnect, unsafe.Pointer(&a)); err != nil {
		return 0, err
	}
	return a.Peer, nil
}

// JBMTAdviseBuffer pins length bytes at addr in this process ahead of use
// into the module's pin cache, for this file's operations: cut as an
// operation from addr cuts its sections, writable when rights has
// JBMTWrite (gets will write it), readable with JBMTRead (puts will read
// it). It is a hint: it returns the bytes from addr now cached, stopping
// without an error where the pin budget (or this file's share) is taken
// or the cache is off. Errors wrap ErrInvalid, ErrClosed,
// ErrNotSupported, or the errno: EFAULT (pages not mapped; the count
// stops before them), EINTR, ENOMEM.
func (d *Device) JBMTAdviseBuffer(addr uintptr, length uint64, rights uint32) (uint64, error) {
	return d.jbmtAdvise(rawJBMTAdvise{Rights: rights, Addr: uint64(addr), Length: length})
}

// JBMTAdviseRegion pins length bytes at offset in this file's region t
// ahead of use into the module's pin cache, for serving peers; as
// JBMTAdviseBuffer, and ENOENT (no such region of this file), ERANGE
// (outside it).
func (d *Device) JBMTAdviseRegion(t JBMTToken, offset, length uint64) (uint64, error) {
	return d.jbmtAdvise(rawJBMTAdvise{Flags: jbmtAdviseRegion, Addr: offset, Length: length, Token: t})
}

func (d *Device) jbmtAdvise(a rawJBMTAdvise) (uint64, error) {
	if !d.ver.JBMT {
		return 0, &Error{Op: "jbmt advise", Err: syscall.EOPNOTSUPP}
	}
	a.Size = uint32(unsafe.Sizeof(a))
	err := d.ioctl("jbmt advise", iocJBMTAdvise, unsafe.Pointer(&a))
	return a.Done, err
}

// JBMT operations (JBMTOp).
const (
	JBMTGet uint32 = 1 // from the peer's region to this process
	JBMTPut uint32 = 2 // from this process to the peer's region
)

// JBMTOpMax is the longest JBMTOp waits for a peer's answers.
const JBMTOpMax = 600 * time.Second

// JBMTOp moves length bytes between addr in this process (any mapped
// memory; the module pins it a section at a time while the call runs) and
// offset in the peer's region named by t, over the connection peer
// (JBMTConnect): JBMTGet brings them here, JBMTPut sends them there. It
// waits at most timeout for the peer's answers (0 or more than JBMTOpMax:
// JBMTOpMax). It returns the bytes moved from the start, on errors too.
// Errors wrap ErrInvalid, ErrClosed, ErrNotSupported, or the errno:
// ENOENT (no such region on the peer: a wrong or revoked token), EACCES
// (the region lacks the right), ERANGE (outside it), EFAULT (unmapped
// pages here or there), ENOTCONN (no such connection or it is down),
// ECONNRESET (it went down meanwhile), ETIMEDOUT, EINTR (a signal: the
// call may be made again for the rest), ENOMEM.
func (d *Device) JBMTOp(op, peer uint32, addr uintptr, length uint64, t JBMTToken, offset uint64, timeout time.Duration) (uint64, error) {
	if !d.ver.JBMT {
		return 0, &Error{Op: "jbmt op", Err: syscall.EOPNOTSUPP}
	}
	if timeout <= 0 || timeout > JBMTOpMax {
		timeout = JBMTOpMax
	}
	a := rawJBMTOp{Size: uint32(unsafe.Sizeof(rawJBMTOp{})), Op: op, Peer: peer,
		TimeoutMS: uint32(max(timeout/time.Millisecond, 1)), Addr: uint64(addr), Length: length,
		Token: t, Offset: offset}
	name := "jbmt get"
	if op == JBMTPut {
		name = "jbmt put"
	}
	err := d.ioctl(name, iocJBMTOp, unsafe.Pointer(&a))
	return a.Done, err
}

// JBMTSysfsDir is where the module publishes its JBMT counters.
const JBMTSysfsDir = "/sys/kernel/rdmaplus/jbmt"

// JBMTStats are the module's JBMT counters.
type JBMTStats struct {
	Regions         uint64 // registered now, all processes
	RegisteredBytes uint64 // their bytes
	Registrations   uint64 // since the module was loaded
	Deregistrations uint64 // explicit, since load
	Revoked         uint64 // revoked when their file was closed, since load
	Peers           uint64 // connections to peer hosts up now
	Connects        uint64 // connections this host made, since load
	Accepts         uint64 // connections peers made to this host, since load
	ConnectErrors   uint64 // attempts to connect that failed, since load
	Disconnects     uint64 // connections that went down, since load
	Gets            uint64 // get operations this host made, since load
	Puts            uint64 // put operations this host made, since load
	GetBytes        uint64 // bytes they brought here
	PutBytes        uint64 // bytes they sent
	OpErrors        uint64 // operations that failed
	Sections        uint64 // sections this host started, since load
	SectionsServed  uint64 // peers' sections this host served, since load
	SectionsRefused uint64 // peers' sections refused (bad token, rights, range, unmapped pages); by why:
	RefusedNoEnt    uint64 // a token this host never issued
	RefusedStale    uint64 // a token of a region since revoked
	RefusedPerm     uint64 // the region lacks the right
	RefusedRange    uint64 // outside the region
	RefusedFault    uint64 // the region's pages not mapped, or its process gone
	RefusedNoMem    uint64 // no memory or sink on this host
	RefusedInval    uint64 // a malformed request
	LeasesExpired   uint64 // sinks granted to a peer and taken back unfinished
	PinnedPages     uint64 // pages JBMT holds pinned now, both sides
	NACKsSent       uint64 // peers' sections answered NOPIN: the serving budget was full
	NACKsReceived   uint64 // this host's sections answered NOPIN by a peer
	BudgetWaits     uint64 // operations that waited for the pin budget
	PinBudgetPages  uint64 // the pin budget of each side, pages
	OpPinnedPages   uint64 // pages this host's operations hold pinned now
	ServedPinned    uint64 // pages pinned now to serve peers
	OpPinnedHWM     uint64 // high-water mark of OpPinnedPages (reset by writing 0)
	ServedPinnedHWM uint64 // high-water mark of ServedPinned (reset by writing 0)
	SectionsInline  uint64 // peers' sections served in the completion handler (pages resident)
	SectionsDefer   uint64 // peers' sections served from a work item (a fault or a lock to wait for)
	AsyncSubmitted  uint64 // asynchronous operations submitted, since load
	AsyncCompleted  uint64 // asynchronous operations whose completion was posted
	PinCacheHits    uint64 // sections whose pages a cached range already held pinned
	PinCacheMisses  uint64 // sections that found no cached range and pinned theirs as a new one (the cache on)
	PinCacheStale   uint64 // cached ranges dropped because their process's mapping changed
	PinCacheEvicted uint64 // cached ranges given back for budget or under memory pressure
	PinCachePages   uint64 // pages cached ranges hold pinned now (counted in PinnedPages)
	PinCacheIdle    uint64 // of PinCachePages, those no section uses now
}

// JBMTStatsFromSysfs reads the counters from JBMTSysfsDir under root (""
// for the running system). Errors wrap os.ErrNotExist when the module (or
// one with JBMT) is not loaded, or name the file that could not be parsed.
func JBMTStatsFromSysfs(root string) (JBMTStats, error) {
	return JBMTStatsFromDir(filepath.Join(root, JBMTSysfsDir))
}

// JBMTStatsFromDir reads the counters from dir, the module's JBMT counter
// directory (JBMTSysfsDir, or its place under another sysfs mount).
// Errors as for JBMTStatsFromSysfs.
func JBMTStatsFromDir(dir string) (JBMTStats, error) {
	var st JBMTStats
	err := readCounters(dir, "jbmt", []counterFile{
		{"regions", &st.Regions}, {"registered_bytes", &st.RegisteredBytes},
		{"registrations", &st.Registrations}, {"deregistrations", &st.Deregistrations},
		{"revoked", &st.Revoked}, {"peers", &st.Peers}, {"connects", &st.Connects},
		{"accepts", &st.Accepts}, {"connect_errors", &st.ConnectErrors}, {"disconnects", &st.Disconnects},
		{"gets", &st.Gets}, {"puts", &st.Puts}, {"get_bytes", &st.GetBytes}, {"put_bytes", &st.PutBytes},
		{"op_errors", &st.OpErrors}, {"sections", &st.Sections}, {"sections_served", &st.SectionsServed},
		{"sections_refused", &st.SectionsRefused}, {"refused_noent", &st.RefusedNoEnt},
		{"refused_stale", &st.RefusedStale}, {"refused_perm", &st.RefusedPerm},
		{"refused_range", &st.RefusedRange}, {"refused_fault", &st.RefusedFault},
		{"refused_nomem", &st.RefusedNoMem}, {"refused_inval", &st.RefusedInval},
		{"leases_expired", &st.LeasesExpired},
		{"pinned_pages", &st.PinnedPages}, {"nacks_sent", &st.NACKsSent}, {"nacks_received", &st.NACKsReceived},
		{"budget_waits", &st.BudgetWaits}, {"pin_budget_pages", &st.PinBudgetPages},
		{"op_pinned_pages", &st.OpPinnedPages}, {"served_pinned_pages", &st.ServedPinned},
		{"op_pinned_hwm", &st.OpPinnedHWM}, {"served_pinned_hwm", &st.ServedPinnedHWM},
		{"sections_inline", &st.SectionsInline}, {"sections_deferred", &st.SectionsDefer},
		{"async_submitted", &st.AsyncSubmitted}, {"async_completed", &st.AsyncCompleted},
		{"pin_cache_hits", &st.PinCacheHits}, {"pin_cache_misses", &st.PinCacheMisses},
		{"pin_cache_stale", &st.PinCacheStale}, {"pin_cache_evicted", &st.PinCacheEvicted},
		{"pin_cache_pages", &st.PinCachePages}, {"pin_cache_idle_pages", &st.PinCacheIdle},
	})
	if err != nil {
		return JBMTStats{}, err
	}
	return st, nil
}
