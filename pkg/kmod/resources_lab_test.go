//go:build lab

package kmod

// The module's resource model on a device open to every user: memory it
// keeps for a process counts against RLIMIT_MEMLOCK for as long as it is
// kept (a log's pages while mapped, buffer records), host-wide ids have a
// per-user cap, and mailbox keys cannot be guessed.
//
// Run: go run ./test/softroce gotest ./pkg/kmod -test.run 'TestLabResource' -test.v

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// setParam sets a module parameter for the rest of the test.
func setParam(t *testing.T, name string, v int) {
	t.Helper()
	p := "/sys/module/rdmaplus/parameters/" + name
	old, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(strconv.Itoa(v)), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(p, []byte(strings.TrimSpace(string(old))), 0) })
}

func rawDomainCreate(d *Device, logSize uint64) (rawCreate, error) {
	c := rawCreate{Size: uint32(unsafe.Sizeof(rawCreate{})), LogSize: logSize}
	err := d.ioctl("domain create", iocDomainCreate, unsafe.Pointer(&c))
	return c, err
}

func rawDomainDestroy(d *Device, id uint32) error {
	a := rawDomain{Size: uint32(unsafe.Sizeof(rawDomain{})), Domain: id}
	return d.ioctl("domain destroy", iocDomainDestroy, unsafe.Pointer(&a))
}

// A log's pages stay charged to RLIMIT_MEMLOCK while a mapping holds them,
// after the domain is destroyed: create, map, destroy in a loop ends with
// ENOMEM at the limit (64 KiB: 8 logs of a ring page and a 4 KiB area),
// not with memory pinned past it; unmapping gives it back.
func TestLabResourceLogMappedAfterDestroy(t *testing.T) {
	labenv.Device(t)
	labenv.AsUnprivileged(t, 64<<10, 0, func() {
		d, err := Open()
		if err != nil {
			t.Error(err)
			return
		}
		defer d.Close()
		var maps [][]byte
		defer func() {
			for _, m := range maps {
				unix.Munmap(m)
			}
		}()
		n := 0
		for ; n < 64; n++ {
			c, err := rawDomainCreate(d, MinLogSize)
			if err != nil {
				if !errors.Is(err, syscall.ENOMEM) {
					t.Errorf("domain %d: %v, want ENOMEM", n, err)
				}
				break
			}
			m, err := unix.Mmap(int(d.Fd()), int64(c.MmapOffset), int(c.MmapSize), unix.PROT_READ, unix.MAP_SHARED)
			if err != nil {
				t.Errorf("mmap of domain %d: %v", n, err)
				return
			}
			maps = append(maps, m)
			if err := rawDomainDestroy(d, c.Domain); err != nil {
				t.Errorf("destroy of domain %d: %v", n, err)
				return
			}
		}
		if n != 8 {
			t.Errorf("created, mapped and destroyed %d logs under a 64 KiB limit, want 8", n)
		}
		for _, m := range maps {
			unix.Munmap(m)
		}
		maps = nil
		if _, err := rawDomainCreate(d, MinLogSize); err != nil {
			t.Errorf("after unmapping every log: %v", err)
		}
	})
}

// Host-wide Active Access domain ids have a per-user cap (EDQUOT beyond),
// which another user does not share.
func TestLabResourceDomainsPerUser(t *testing.T) {
	labenv.Device(t)
	setParam(t, "max_domains_per_user", 6)
	var devs []*Device
	defer func() {
		for _, d := range devs {
			d.Close()
		}
	}()
	for i := 0; i < 2; i++ {
		d, err := Open()
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, d)
	}
	for i := 0; i < 6; i++ {
		if _, err := rawDomainCreate(devs[i%2], MinLogSize); err != nil {
			t.Fatalf("domain %d: %v", i, err)
		}
	}
	_, err := rawDomainCreate(devs[0], MinLogSize)
	if !errors.Is(err, syscall.EDQUOT) || !errors.Is(err, ErrQuota) || !errors.Is(err, ErrTooManyDomains) {
		t.Fatalf("domain 7 of the user: %v, want EDQUOT (ErrQuota, ErrTooManyDomains)", err)
	}
	labenv.AsUnprivileged(t, 1<<20, 65534, func() {
		d, err := Open()
		if err != nil {
			t.Error(err)
			return
		}
		defer d.Close()
		if _, err := rawDomainCreate(d, MinLogSize); err != nil {
			t.Errorf("another user's first domain: %v", err)
		}
	})
	devs[1].Close()
	devs = devs[:1]
	if _, err := rawDomainCreate(devs[0], MinLogSize); err != nil {
		t.Fatalf("after closing a device: %v", err)
	}
}

// Mailbox keys: a per-user cap (EDQUOT beyond), and 28 random bits, so
// that neither their ids nor their low bytes follow each other.
func TestLabResourceMailboxKeys(t *testing.T) {
	labenv.Device(t)
	setParam(t, "max_mbkeys_per_user", 16)
	d, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s := rawRVMASetup{Size: uint32(unsafe.Sizeof(rawRVMASetup{})), Windows: 32, Records: 4, Eventfd: -1}
	if err := d.ioctl("setup", iocRVMASetup, unsafe.Pointer(&s)); err != nil {
		t.Fatal(err)
	}
	var keys []uint32
	for i := 0; i < 17; i++ {
		c := rawRVMAWin{Size: uint32(unsafe.Sizeof(rawRVMAWin{})), Kind: uint32(CountBytes), Flags: rvmaWinMBKey}
		err := d.ioctl("create", iocRVMAWinCreate, unsafe.Pointer(&c))
		if i == 16 {
			if !errors.Is(err, syscall.EDQUOT) || !errors.Is(err, ErrQuota) {
				t.Fatalf("mailbox key 17 of the user: %v, want EDQUOT (ErrQuota)", err)
			}
			break
		}
		if err != nil {
			t.Fatalf("mailbox key %d: %v", i, err)
		}
		if c.MBKey>>28 != 0xf {
			t.Fatalf("mailbox key %#x lacks the mailbox bits", c.MBKey)
		}
		keys = append(keys, c.MBKey)
	}
	seqIDs, lowZero := 0, 0
	for i, k := range keys {
		if k&0xff == 0 {
			lowZero++
		}
		if i > 0 && (k>>8)&0xfffff == (keys[i-1]>>8)&0xfffff+1 {
			seqIDs++
		}
	}
	if seqIDs > 2 || lowZero > 2 {
		t.Fatalf("mailbox keys look guessable: %#x", keys)
	}
	// a window's destruction gives its key back to the user
	if err := d.ioctl("destroy", iocRVMAWinDestroy, unsafe.Pointer(&rawRVMAWinDestroy{Size: 8, ID: 1})); err != nil {
		t.Fatal(err)
	}
	c := rawRVMAWin{Size: uint32(unsafe.Sizeof(rawRVMAWin{})), Kind: uint32(CountBytes), Flags: rvmaWinMBKey}
	if err := d.ioctl("create", iocRVMAWinCreate, unsafe.Pointer(&c)); err != nil {
		t.Fatalf("after destroying a window: %v", err)
	}
}

// Buffer records count against RLIMIT_MEMLOCK: posting one-byte buffers
// and publishing them (published ranges are kept to refuse late writes)
// ends with ENOMEM at a 1 MiB limit, well before the file's 65536 ranges,
// and closing the device gives the memory back.
func TestLabResourceRangesCharged(t *testing.T) {
	name := labenv.Device(t)
	vctx, err := verbs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer vctx.Close()
	pd, err := vctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	mr, err := pd.AllocMR(MaxRecords, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	const records = 1024
	posted := func() (int, error) {
		d, err := Open()
		if err != nil {
			return 0, err
		}
		defer d.Close()
		s := rawRVMASetup{Size: uint32(unsafe.Sizeof(rawRVMASetup{})), Windows: 1, Records: records, Eventfd: -1}
		if err := d.ioctl("setup", iocRVMASetup, unsafe.Pointer(&s)); err != nil {
			return 0, err
		}
		w := rawRVMAWin{Size: uint32(unsafe.Sizeof(rawRVMAWin{})), Kind: uint32(CountBytes)}
		if err := d.ioctl("create", iocRVMAWinCreate, unsafe.Pointer(&w)); err != nil {
			return 0, err
		}
		n := 0
		for ; n < MaxRecords; n++ {
			p := rawRVMAPost{Size: uint32(unsafe.Sizeof(rawRVMAPost{})), Win: w.ID, Key: mr.RKey(),
				IOVA: mr.Addr() + uint64(n), Length: 1, Threshold: 1, Gen: uint64(n), Record: uint32(n % records)}
			if err := d.ioctl("post", iocRVMAPost, unsafe.Pointer(&p)); err != nil {
				return n, err
			}
			if n%records == records-1 {
				e := rawRVMAEnd{Size: uint32(unsafe.Sizeof(rawRVMAEnd{})), Win: w.ID, Gen: 0, Flags: rvmaEndAll}
				if err := d.ioctl("end", iocRVMAEnd, unsafe.Pointer(&e)); err != nil {
					return n, err
				}
			}
		}
		return n, nil
	}
	labenv.AsUnprivileged(t, 1<<20, 0, func() {
		for round := 0; round < 2; round++ {
			n, err := posted()
			if !errors.Is(err, syscall.ENOMEM) || !errors.Is(err, ErrNoMemory) {
				t.Errorf("round %d: %d buffers posted, then %v; want ENOMEM", round, n, err)
				return
			}
			// 1 MiB less the area (64 KiB of records, a page of states)
			// and the windows: some thousands of records, never 65536
			if n < 1000 || n > 16000 {
				t.Errorf("round %d: %d buffers posted under a 1 MiB limit", round, n)
			}
			t.Logf("round %d: %d buffers, then %v", round, n, err)
		}
	})
}
