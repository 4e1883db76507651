//go:build lab

package kmod

// The module's answers to raw misuse that this package's API never sends:
// another file's domain id, bad eventfds, bad mmap offsets and lengths,
// wrong structure sizes, unknown requests and bad pointers. Each is
// refused with its errno, and the domains involved keep working.
//
// Run: go run ./test/softroce gotest ./pkg/kmod -test.run TestLabRawMisuse -test.v

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// mmapRefused checks that mapping n bytes of d at off fails with want
// (and unmaps what a wrong success mapped).
func mmapRefused(t *testing.T, d *Device, off int64, n int, want syscall.Errno, what string) {
	t.Helper()
	m, err := unix.Mmap(int(d.Fd()), off, n, unix.PROT_READ, unix.MAP_SHARED)
	if !errors.Is(err, want) {
		t.Errorf("mmap %s: %v, want %v", what, err, want)
	}
	if err == nil {
		unix.Munmap(m)
	}
}

func TestLabRawMisuse(t *testing.T) {
	labenv.Device(t)
	open := func() *Device {
		d, err := Open()
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	d1, d2 := open(), open()
	dm, err := d1.NewDomain(MinLogSize)
	if err != nil {
		t.Fatal(err)
	}
	defer dm.Close()
	other, err := d2.NewDomain(MinLogSize)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	errno := func(name string, err error, want syscall.Errno) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}

	// Another file's domain: not found, whatever the request.
	notify := rawNotify{Size: uint32(unsafe.Sizeof(rawNotify{})), Domain: dm.id, Eventfd: -1, Threshold: 1}
	errno("NOTIFY on another file's domain", d2.ioctl("notify", iocNotify, unsafe.Pointer(&notify)), syscall.ENOENT)
	for _, c := range []struct {
		name string
		n    rawNotify
	}{
		{"an unknown flag", rawNotify{Eventfd: -1, Threshold: 1, Flags: 2}},
		{"adaptive without an interval", rawNotify{Eventfd: -1, Threshold: 1, Flags: notifyAdaptive}},
		{"an interval over an hour", rawNotify{Eventfd: -1, IntervalUS: 3600*1000*1000 + 1}},
	} {
		c.n.Size, c.n.Domain = uint32(unsafe.Sizeof(rawNotify{})), dm.id
		errno("NOTIFY with "+c.name, d1.ioctl("notify", iocNotify, unsafe.Pointer(&c.n)), syscall.EINVAL)
	}
	arm := rawArm{Size: uint32(unsafe.Sizeof(rawArm{})), Domain: dm.id, Key: 1, Bits: uint32(W), IOVA: 0, Length: PageSize}
	errno("ARM with another file's domain", d2.ioctl("arm", iocArm, unsafe.Pointer(&arm)), syscall.ENOENT)
	destroy := rawDomain{Size: uint32(unsafe.Sizeof(rawDomain{})), Domain: dm.id}
	errno("DESTROY of another file's domain", d2.ioctl("domain destroy", iocDomainDestroy, unsafe.Pointer(&destroy)), syscall.ENOENT)
	mlen := os.Getpagesize() + MinLogSize
	mmapRefused(t, d2, int64(dm.id)*int64(os.Getpagesize()), mlen, syscall.ENOENT, "of another file's domain")

	// mmap: offsets beyond any domain id, a free id, the wrong length.
	for _, c := range []struct {
		name string
		off  int64
		n    int
		want syscall.Errno
	}{
		{"an offset beyond every domain id", int64(MaxDomains+1) * int64(os.Getpagesize()), mlen, syscall.EINVAL},
		{"a domain id no domain has", 0, mlen, syscall.ENOENT},
		{"one page short", int64(dm.id) * int64(os.Getpagesize()), mlen - os.Getpagesize(), syscall.EINVAL},
		{"one page too many", int64(dm.id) * int64(os.Getpagesize()), mlen + os.Getpagesize(), syscall.EINVAL},
	} {
		mmapRefused(t, d1, c.off, c.n, c.want, "at "+c.name)
	}

	// NOTIFY with descriptors that are not eventfds.
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	for _, c := range []struct {
		name string
		fd   int32
		want syscall.Errno
	}{
		{"/dev/null", int32(null.Fd()), syscall.EINVAL},
		{"a descriptor not open", 1 << 20, syscall.EBADF},
	} {
		n := rawNotify{Size: uint32(unsafe.Sizeof(rawNotify{})), Domain: dm.id, Eventfd: c.fd, Threshold: 1}
		errno("NOTIFY with "+c.name, d1.ioctl("notify", iocNotify, unsafe.Pointer(&n)), c.want)
	}

	// Wrong sizes, reserved flags, unknown requests, bad pointers.
	bad := notify
	bad.Size--
	errno("NOTIFY with a short size", d1.ioctl("notify", iocNotify, unsafe.Pointer(&bad)), syscall.EINVAL)
	bad = notify
	bad.Flags = 1
	errno("NOTIFY with reserved flags", d1.ioctl("notify", iocNotify, unsafe.Pointer(&bad)), syscall.EINVAL)
	// A structure from a newer program: larger, with bytes the module does
	// not know. Zero there, they are taken as absent; anything else is
	// refused with E2BIG.
	longCreate := struct {
		rawCreate
		Tail uint64
	}{rawCreate{Size: uint32(unsafe.Sizeof(rawCreate{})) + 8, LogSize: MinLogSize}, 1}
	errno("CREATE with a long size and a non-zero tail", d1.ioctl("domain create", iocDomainCreate, unsafe.Pointer(&longCreate)), syscall.E2BIG)
	longCreate.Tail = 0
	if err := d1.ioctl("domain create", iocDomainCreate, unsafe.Pointer(&longCreate)); err != nil {
		t.Errorf("CREATE with a long size and a zero tail: %v", err)
	} else {
		gone := rawDomain{Size: uint32(unsafe.Sizeof(rawDomain{})), Domain: longCreate.Domain}
		if err := d1.ioctl("domain destroy", iocDomainDestroy, unsafe.Pointer(&gone)); err != nil {
			t.Errorf("DESTROY of the long CREATE's domain: %v", err)
		}
	}
	errno("an unknown request", d1.ioctl("unknown", ioc(iocWrite, 0x7f, 8), unsafe.Pointer(&notify)), syscall.ENOTTY)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, d1.Fd(), iocArm, 8); e != syscall.EFAULT {
		t.Errorf("ARM from an unmapped address: %v, want EFAULT", e)
	}

	// Both domains still work, each on its own file.
	if err := dm.Notify(NotifyOptions{Threshold: 1}); err != nil {
		t.Fatalf("Notify after the misuse: %v", err)
	}
	if err := other.Notify(NotifyOptions{Threshold: 1}); err != nil {
		t.Fatalf("Notify on the other file: %v", err)
	}
	if es, err := dm.Read(nil, 0); err != nil || len(es) != 0 {
		t.Fatalf("Read after the misuse: %v, %v", es, err)
	}
	st, err := d1.Stats()
	if err != nil || st.Domains < 2 {
		t.Fatalf("stats %+v, %v", st, err)
	}
}
