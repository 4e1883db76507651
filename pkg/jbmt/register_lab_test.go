//go:build lab

package jbmt_test

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

func open(t *testing.T) *jbmt.Service {
	t.Helper()
	labenv.Device(t)
	s, err := jbmt.Open(nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func stats(t *testing.T) jbmt.Stats {
	t.Helper()
	st, err := jbmt.ReadStats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// vmstat reads one counter of /proc/vmstat.
func vmstat(t *testing.T, name string) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("/proc/vmstat has no %s", name)
	return 0
}

// TestLabRegisterNoPin registers 1 GiB (more than the guest's RAM, never
// touched) and 4 KiB as a process without CAP_IPC_LOCK under a 64 KiB
// RLIMIT_MEMLOCK: both succeed, and nothing is pinned (the kernel's
// FOLL_PIN counter does not move). The tokens differ in id and key;
// closing the regions takes the host's counters back.
func TestLabRegisterNoPin(t *testing.T) {
	s := open(t)
	big, err := jbmt.Alloc(1 << 30)
	if err != nil {
		t.Fatal(err)
	}
	defer jbmt.Free(big)
	small, err := jbmt.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer jbmt.Free(small)
	before := stats(t)
	pinned := vmstat(t, "nr_foll_pin_acquired")
	var rb, rs *jbmt.Region
	labenv.AsUnprivileged(t, 64<<10, 0, func() {
		if rb, err = s.Register(big, jbmt.Read|jbmt.Write); err != nil {
			return
		}
		rs, err = s.Register(small, jbmt.Read)
	})
	if err != nil {
		t.Fatalf("Register under a 64 KiB memlock limit: %v", err)
	}
	if got := vmstat(t, "nr_foll_pin_acquired"); got != pinned {
		t.Errorf("registering pinned %d pages", got-pinned)
	}
	tb, ts := rb.Token(), rs.Token()
	if tb.ID == ts.ID || tb.Key == ts.Key || tb.Rights != jbmt.Read|jbmt.Write || ts.Rights != jbmt.Read {
		t.Errorf("tokens %+v and %+v", tb, ts)
	}
	st := stats(t)
	if st.Regions-before.Regions != 2 || st.RegisteredBytes-before.RegisteredBytes != 1<<30+4096 ||
		st.Registrations-before.Registrations != 2 {
		t.Errorf("counters %+v after two registrations (before %+v)", st, before)
	}
	if err := rb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rb.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := rs.Close(); err != nil {
		t.Fatal(err)
	}
	st = stats(t)
	if st.Regions != before.Regions || st.RegisteredBytes != before.RegisteredBytes ||
		st.Deregistrations-before.Deregistrations != 2 {
		t.Errorf("counters %+v after closing both (before %+v)", st, before)
	}
}

// TestLabRegisterErrors: every argument the module refuses, through the
// raw device where the package would refuse it first; tokens of another
// file or with a wrong generation or key answer as no region at all; a
// closed Service refuses, and the per-user cap holds.
func TestLabRegisterErrors(t *testing.T) {
	s := open(t)
	buf, err := jbmt.Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	defer jbmt.Free(buf)
	if _, err := s.Register(buf, 0); !errors.Is(err, jbmt.ErrInvalid) {
		t.Errorf("no rights: %v", err)
	}
	if _, err := s.Register(buf[:0], jbmt.Read); !errors.Is(err, jbmt.ErrInvalid) {
		t.Errorf("empty: %v", err)
	}

	d, err := kmod.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	addr := uintptr(unsafe.Pointer(&buf[0]))
	for _, c := range []struct {
		name   string
		addr   uintptr
		length uint64
		rights uint32
	}{
		{"no rights", addr, 4096, 0},
		{"unknown rights", addr, 4096, 4},
		{"zero length", addr, 0, kmod.JBMTRead},
		{"wrapping", addr, ^uint64(0), kmod.JBMTRead},
		{"kernel address", 0xffff888000000000, 4096, kmod.JBMTRead},
		{"reaching into the kernel", 0x7ffffffff000, 1 << 20, kmod.JBMTRead},
	} {
		if _, err := d.JBMTRegister(c.addr, c.length, c.rights); !errors.Is(err, kmod.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", c.name, err)
		}
	}

	r, err := s.Register(buf, jbmt.Write)
	if err != nil {
		t.Fatal(err)
	}
	tok := r.Token()
	raw := kmod.JBMTToken{ID: tok.ID, Gen: tok.Gen, Key: tok.Key}
	if err := d.JBMTDeregister(raw); !errors.Is(err, kmod.ErrNoRegion) {
		t.Errorf("another file's token: %v, want ErrNoRegion", err)
	}
	for _, bad := range []kmod.JBMTToken{{ID: raw.ID, Gen: raw.Gen, Key: raw.Key ^ 1},
		{ID: raw.ID, Gen: raw.Gen + 1, Key: raw.Key}, {ID: kmod.JBMTMaxID, Gen: 1, Key: 1}, {}} {
		if err := d.JBMTDeregister(bad); !errors.Is(err, kmod.ErrNoRegion) {
			t.Errorf("token %+v: %v, want ErrNoRegion", bad, err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatalf("the owner's Close after the others failed: %v", err)
	}

	// the per-user cap
	const param = "/sys/module/rdmaplus/parameters/max_jbmt_regions_per_user"
	old, err := os.ReadFile(param)
	if err != nil {
		t.Fatal(err)
	}
	defer os.WriteFile(param, old, 0o644)
	if err := os.WriteFile(param, []byte("3"), 0o644); err != nil {
		t.Fatal(err)
	}
	var held []*jbmt.Region
	for i := 0; i < 3; i++ {
		r, err := s.Register(buf[i:i+1], jbmt.Read)
		if err != nil {
			t.Fatalf("region %d of 3: %v", i, err)
		}
		held = append(held, r)
	}
	if _, err := s.Register(buf, jbmt.Read); !errors.Is(err, jbmt.ErrQuota) {
		t.Errorf("a fourth region with a cap of 3: %v, want ErrQuota", err)
	}
	held[0].Close()
	if _, err := s.Register(buf, jbmt.Read); err != nil {
		t.Errorf("after closing one: %v", err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Register(buf, jbmt.Read); !errors.Is(err, jbmt.ErrClosed) {
		t.Errorf("Register after Close: %v, want ErrClosed", err)
	}
	if err := held[1].Close(); err != nil {
		t.Errorf("a region's Close after its Service's: %v", err)
	}
}

// TestLabRegisterRevokedOnClose: closing the Service (or the process
// exiting) revokes every region it registered.
func TestLabRegisterRevokedOnClose(t *testing.T) {
	s := open(t)
	buf, err := jbmt.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer jbmt.Free(buf)
	before := stats(t)
	for i := 0; i < 1000; i++ {
		if _, err := s.Register(buf[i:], jbmt.Read); err != nil {
			t.Fatalf("region %d: %v", i, err)
		}
	}
	if st := stats(t); st.Regions-before.Regions != 1000 {
		t.Fatalf("%d regions registered, want 1000", st.Regions-before.Regions)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	st := stats(t)
	if st.Regions != before.Regions || st.RegisteredBytes != before.RegisteredBytes ||
		st.Revoked-before.Revoked != 1000 {
		t.Errorf("counters %+v after Close (before %+v)", st, before)
	}
}
