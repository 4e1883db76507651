package kmod

import (
	"path/filepath"
	"syscall"
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

// JBMTSysfsDir is where the module publishes its JBMT counters.
const JBMTSysfsDir = "/sys/kernel/rdmaplus/jbmt"

// JBMTStats are the module's JBMT counters.
type JBMTStats struct {
	Regions         uint64 // registered now, all processes
	RegisteredBytes uint64 // their bytes
	Registrations   uint64 // since the module was loaded
	Deregistrations uint64 // explicit, since load
	Revoked         uint64 // revoked when their file was closed, since load
}

// JBMTStatsFromSysfs reads the counters from JBMTSysfsDir under root (""
// for the running system). Errors wrap os.ErrNotExist when the module (or
// one without JBMT) is loaded, or name the file that could not be parsed.
func JBMTStatsFromSysfs(root string) (JBMTStats, error) {
	var st JBMTStats
	err := readCounters(filepath.Join(root, JBMTSysfsDir), "jbmt", []counterFile{
		{"regions", &st.Regions}, {"registered_bytes", &st.RegisteredBytes},
		{"registrations", &st.Registrations}, {"deregistrations", &st.Deregistrations},
		{"revoked", &st.Revoked},
	})
	if err != nil {
		return JBMTStats{}, err
	}
	return st, nil
}
