//go:build lab

package kmod_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// perFile is the module's default max_domains_per_file.
const perFile = 256

// One open device holds at most perFile domains (EMFILE); the host has
// MaxDomains ids, and the next one is ENFILE. Closing gives them back.
// (The per-user cap, max_domains_per_user, is raised above the host's
// ids here: TestLabResourceDomainsPerUser tests it.)
func TestLabDomainLimits(t *testing.T) {
	const param = "/sys/module/rdmaplus/parameters/max_domains_per_user"
	old, err := os.ReadFile(param)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(param, []byte("100000"), 0); err != nil {
		t.Fatal(err)
	}
	defer os.WriteFile(param, old, 0)
	base := idle(t, openDev(t))
	var devs []*kmod.Device
	defer func() {
		for _, d := range devs {
			d.Close()
		}
	}()
	for len(devs)*perFile < kmod.MaxDomains {
		d, err := kmod.Open()
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, d)
		for i := 0; i < perFile; i++ {
			if _, err := d.NewDomain(kmod.MinLogSize); err != nil {
				t.Fatalf("device %d, domain %d: %v", len(devs), i, err)
			}
		}
		_, err = d.NewDomain(kmod.MinLogSize)
		if !errors.Is(err, kmod.ErrTooManyDomains) || !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("domain %d of one device: %v, want ErrTooManyDomains (EMFILE)", perFile+1, err)
		}
	}
	d, err := kmod.Open()
	if err != nil {
		t.Fatal(err)
	}
	devs = append(devs, d)
	_, err = d.NewDomain(kmod.MinLogSize)
	if !errors.Is(err, kmod.ErrTooManyDomains) || !errors.Is(err, syscall.ENFILE) {
		t.Fatalf("domain %d of the host: %v, want ErrTooManyDomains (ENFILE)", kmod.MaxDomains+1, err)
	}
	if st, _ := d.Stats(); st.Domains != kmod.MaxDomains {
		t.Fatalf("stats with every id in use: %+v", st)
	}
	devs[0].Close()
	if _, err := d.NewDomain(kmod.MinLogSize); err != nil {
		t.Fatalf("after closing a device: %v", err)
	}
	for _, d := range devs {
		d.Close()
	}
	devs = nil
	if st := idle(t, openDev(t)); st.Domains != base.Domains {
		t.Fatalf("after closing every device: %+v", st)
	}
}

// memlockChild creates minimum-size domains until one fails, on a thread
// without CAP_IPC_LOCK and with RLIMIT_MEMLOCK at 64 KiB, twice (closing
// the device in between), and prints how many it got each time and the
// error that stopped it.
func memlockChild() error {
	runtime.LockOSThread() // capabilities belong to a thread
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[unix.CAP_IPC_LOCK/32].Effective &^= 1 << (unix.CAP_IPC_LOCK % 32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return err
	}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: 64 << 10, Max: 64 << 10}); err != nil {
		return err
	}
	for round := 0; round < 2; round++ {
		d, err := kmod.Open()
		if err != nil {
			return err
		}
		n := 0
		for ; n < 100; n++ {
			if _, err = d.NewDomain(kmod.MinLogSize); err != nil {
				break
			}
		}
		fmt.Printf("GOT %d %v\n", n, errors.Is(err, kmod.ErrNoMemory))
		d.Close()
	}
	return nil
}

// A log's pages count against the user's RLIMIT_MEMLOCK unless the
// process has CAP_IPC_LOCK: with 64 KiB, 8 domains of one ring page and
// one 4 KiB area fit and the 9th fails with ErrNoMemory; closing the
// device gives the memory back.
func TestLabLogMemlock(t *testing.T) {
	labenv.Device(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestLabChild$")
	cmd.Env = append(os.Environ(), childEnv+"=memlock")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := "GOT 8 true\nGOT 8 true\n"
	if got := string(out); !strings.Contains(got, want) {
		t.Fatalf("child printed %q, want %q", got, want)
	}
}

// Arming races with the region's deregistration: whichever wins, nothing
// of the region stays in the module (an entry left behind would name
// freed memory that a later region may reuse). Before the dereg hook
// moved behind ib_core's resource table, an arm that found the region
// after the hook ran kept it.
func TestLabArmRacesDereg(t *testing.T) {
	d := openDev(t)
	dm := newDomain(t, d, 1<<16)
	ctx, err := verbs.Open(labenv.Device(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	armed, lost := 0, 0
	for i := 0; i < 100; i++ {
		mr, err := pd.AllocMR(4*page, verbs.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		key, addr := mr.RKey(), mr.Addr()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				err := dm.Arm(key, addr, 4*page, kmod.WL)
				switch {
				case err == nil:
					armed++
				case errors.Is(err, kmod.ErrNoRegion):
					lost++
					return
				default:
					t.Errorf("Arm: %v", err)
					return
				}
			}
		}()
		for j := 0; j < i%7; j++ {
			runtime.Gosched()
		}
		if err := mr.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if st, _ := d.Stats(); st.MRs != 0 || st.Pages != 0 {
			t.Fatalf("iteration %d: the deregistered region stayed: %+v", i, st)
		}
	}
	t.Logf("%d arms succeeded, %d found the region gone", armed, lost)
	st, _ := d.Stats()
	for i := 0; i < 100 && st.HooksArmed; i++ { // unhooked by a work item
		time.Sleep(20 * time.Millisecond)
		st, _ = d.Stats()
	}
	if st.HooksArmed {
		t.Fatalf("hooks still registered: %+v", st)
	}
}
