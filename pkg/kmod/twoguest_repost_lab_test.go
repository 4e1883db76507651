//go:build lab

package kmod_test

import (
	"context"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// Guest 2 streams RDMA WRITEs into guest 1's region, which guest 1's
// process gates with a counted mailbox. Meanwhile one thread of that
// process re-posts a buffer over the same range again and again (what
// pkg/rvma does every epoch), while another forks (copying its table of
// some 4000 descriptors under the table's lock) on the other vCPU. The
// module once checked the region's uverbs file, a walk of that table, while
// holding the lock the data path takes in softirq for every packet into
// the region: a packet interrupting the forking thread then spun on the
// mailbox lock while the re-posting thread, holding it with interrupts
// off, spun on the table's lock, and the guest froze without a word. Now
// the check runs before the lock is taken: the re-posts and forks all
// finish and every write completes.
func TestTwoGuestsRepostFork(t *testing.T) {
	const run = 20 * time.Second
	l := newLink(t, 16, 64)
	qp, cq, mr, me := l.qp, l.cq, l.mr, l.me

	if labenv.Role() != "server" {
		var srv peerInfo
		fetch(t, "rp-server", &srv)
		l.connect(t, srv)
		publish(t, "rp-client", me)
		waitFor(t, "rp-server-rtr")
		// one write in flight at a time, into the region's second half
		// (outside the buffer: each packet still takes the file's lock)
		deadline := time.Now().Add(run)
		n := 0
		for time.Now().Before(deadline) {
			if err := qp.PostSend(verbs.SendWR{Op: verbs.OpWrite, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{mr.SGE(0, 4096)}, RemoteAddr: srv.Addr + 8*page, RKey: srv.RKey}); err != nil {
				t.Fatal(err)
			}
			c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			wcs := make([]verbs.WC, 1)
			_, err := cq.Wait(c, wcs)
			cancel()
			if err == nil {
				err = wcs[0].Err()
			}
			if err != nil {
				t.Fatalf("write %d: %v", n, err)
			}
			n++
		}
		t.Logf("%d writes of 4 KiB", n)
		labenv.Signal("rp-client-done")
		waitFor(t, "rp-server-done")
		return
	}

	// Some 4000 descriptors make each fork hold the table's lock long.
	var fds []int
	for i := 0; i < 4000; i++ {
		fd, err := unix.Dup(2)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	d, err := kmod.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	mb, err := d.Mailboxes(1, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()
	win, err := mb.CreateWindow(kmod.CountBytes)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, "rp-server", me)
	var peer peerInfo
	fetch(t, "rp-client", &peer)
	l.connect(t, peer)
	labenv.Signal("rp-server-rtr")

	var stop atomic.Bool
	var wg sync.WaitGroup
	var forks, reposts atomic.Int64
	pin := func(cpu int) {
		runtime.LockOSThread() // never unlocked: the thread goes with us
		var set unix.CPUSet
		set.Set(cpu % runtime.NumCPU())
		unix.SchedSetaffinity(0, &set)
	}
	wg.Add(2)
	go func() { // forks on vCPU 0, where the NIC's interrupts land
		defer wg.Done()
		pin(0)
		for !stop.Load() {
			if err := exec.Command("true").Run(); err != nil {
				t.Errorf("fork and exec: %v", err)
				return
			}
			forks.Add(1)
		}
	}()
	go func() { // re-posts on vCPU 1
		defer wg.Done()
		pin(1)
		for gen := uint64(1); !stop.Load(); gen++ {
			p := kmod.MailboxPost{Key: mr.RKey(), IOVA: mr.Addr(), Length: 4 * page, Threshold: 4 * page, Gen: gen}
			if err := mb.Post(win, p); err != nil {
				t.Errorf("post of generation %d: %v", gen, err)
				return
			}
			if err := mb.End(win, gen, 0, false); err != nil {
				t.Errorf("end of generation %d: %v", gen, err)
				return
			}
			reposts.Add(1)
		}
	}()
	waitFor(t, "rp-client-done")
	stop.Store(true)
	wg.Wait()
	if forks.Load() == 0 || reposts.Load() < 2 {
		t.Fatalf("%d forks and %d re-posts", forks.Load(), reposts.Load())
	}
	t.Logf("%d forks and %d re-posts while the writes streamed in", forks.Load(), reposts.Load())
	labenv.Signal("rp-server-done")
}
