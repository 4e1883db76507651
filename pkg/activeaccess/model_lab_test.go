//go:build lab

package activeaccess_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

type record struct {
	kind       activeaccess.Kind
	off, n     int
	data       []byte
	suppressed bool
	src        *activeaccess.Peer
	seq        uint64
}

type recorder struct {
	mu   sync.Mutex
	recs []record
}

func (r *recorder) add(a *activeaccess.Access) {
	r.mu.Lock()
	r.recs = append(r.recs, record{a.Kind, a.Offset, a.Length, a.Data, a.Suppressed, a.Source, a.Seq})
	r.mu.Unlock()
}

func (r *recorder) all() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.recs...)
}

// checkCover checks that the records of kind k cover exactly [off, off+n)
// once, with the data want (indexed from off).
func checkCover(t *testing.T, what string, recs []record, k activeaccess.Kind, off, n int, want []byte) {
	t.Helper()
	seen := make([]int, n)
	for _, r := range recs {
		if r.kind != k {
			continue
		}
		if r.off < off || r.off+r.n > off+n {
			t.Fatalf("%s: %v access [%d, +%d) outside [%d, +%d)", what, k, r.off, r.n, off, n)
		}
		if !bytes.Equal(r.data, want[r.off-off:r.off-off+r.n]) {
			t.Fatalf("%s: %v access [%d, +%d): logged data differs", what, k, r.off, r.n)
		}
		for i := r.off - off; i < r.off-off+r.n; i++ {
			seen[i]++
		}
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("%s: byte %d seen %d times by the handler", what, off+i, c)
		}
	}
}

// TestLabModel: active puts to intercepted pages (the handler gets the
// data, memory stays untouched, each access once, a reply each), active
// puts and gets on logged pages, plain puts and gets on plain pages, and
// the flush semantics (after Flush every reply is there).
func TestLabModel(t *testing.T) { forModes(t, testModel) }

func testModel(t *testing.T, mode activeaccess.Mode, b func(string) string) {
	port := 7510 + uint16(mode)
	const nputs = 200
	if server(t) {
		tg := listen(t, port, 8*page, &activeaccess.TargetOptions{LogSize: 1 << 16, Mode: mode})
		var ra, rb recorder
		// Wake-ups batched by 16 and no interval: a flush must still
		// pass the entries short of a batch (the marker wakes the runtime).
		da, err := tg.NewDomain(func(a *activeaccess.Access) {
			ra.add(a)
			if err := a.Reply(sum(a.Data)); err != nil {
				t.Errorf("Reply: %v", err)
			}
		}, &activeaccess.DomainOptions{Threshold: 16})
		if err != nil {
			t.Fatal(err)
		}
		db, err := tg.NewDomain(rb.add, &activeaccess.DomainOptions{Notify: activeaccess.Poll, PollIdle: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := da.Associate(0, 4*page, activeaccess.Intercept); err != nil {
			t.Fatal(err)
		}
		if err := db.Associate(4*page, 2*page, activeaccess.W|activeaccess.R|activeaccess.WL|activeaccess.WLD|activeaccess.RL|activeaccess.RLD); err != nil {
			t.Fatal(err)
		}
		// Page 7: W=0 R=0, reads logged with what was served (zeros).
		copy(tg.Memory()[7*page:], pattern(7*page, page, 4))
		if err := db.Associate(7*page, page, activeaccess.RL|activeaccess.RLD); err != nil {
			t.Fatal(err)
		}
		defer signal(t, b("model-checked"))
		signal(t, b("model-ready"))
		await(t, b("model-done"))

		recs := ra.all()
		if len(recs) != nputs {
			t.Fatalf("domain A handled %d accesses, want %d", len(recs), nputs)
		}
		srcAddr, err := labenv.AddrOf(2)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		for i, r := range recs {
			if r.kind != activeaccess.KindPut || r.n != 64 || !r.suppressed || r.src == nil || r.src.Name != "model-src" {
				t.Fatalf("access %d: %+v", i, r)
			}
			if a := r.src.Addr; a.Addr().Unmap().String() != srcAddr || a.Port() == 0 {
				t.Fatalf("access %d: the source's address is %v, want %s and its rdma_cm port", i, a, srcAddr)
			}
			if seen[r.off] || r.off%64 != 0 || r.off >= nputs*64 {
				t.Fatalf("access %d at offset %d: repeated or unexpected", i, r.off)
			}
			seen[r.off] = true
			if !bytes.Equal(r.data, pattern(r.off, 64, 1)) {
				t.Fatalf("access %d at %d: data differs", i, r.off)
			}
			if i > 0 && r.seq != recs[i-1].seq+1 {
				t.Fatalf("sequence numbers %d then %d", recs[i-1].seq, r.seq)
			}
		}
		mem := tg.Memory()
		if !bytes.Equal(mem[:4*page], make([]byte, 4*page)) {
			t.Fatal("an intercepted (W=0) page changed")
		}
		const bo, bn = 4*page + 3000, 3000
		var brec, hidden []record
		for _, r := range rb.all() {
			if r.off >= 7*page {
				hidden = append(hidden, r)
			} else {
				brec = append(brec, r)
			}
		}
		checkCover(t, "domain B", brec, activeaccess.KindPut, bo, bn, pattern(bo, bn, 2))
		checkCover(t, "domain B", brec, activeaccess.KindGet, bo, bn, pattern(bo, bn, 2))
		checkCover(t, "page 7", hidden, activeaccess.KindGet, 7*page+100, 1000, make([]byte, 1000))
		for _, r := range hidden {
			if r.kind != activeaccess.KindGet || !r.suppressed {
				t.Fatalf("page 7 (W=0 R=0, reads logged): %+v", r)
			}
		}
		if !bytes.Equal(mem[7*page:8*page], pattern(7*page, page, 4)) {
			t.Fatal("page 7 (W=0) changed")
		}
		if !bytes.Equal(mem[bo:bo+bn], pattern(bo, bn, 2)) {
			t.Fatal("domain B's memory lacks the put")
		}
		if !bytes.Equal(mem[6*page:6*page+4000], pattern(6*page, 4000, 3)) {
			t.Fatal("the plain put is not in memory")
		}
		for _, d := range []*activeaccess.Domain{da, db} {
			if ref, lost := d.Refused(); ref != 0 || lost != 0 || d.Err() != nil {
				t.Fatalf("domain %d: refused %d lost %d err %v", d.ID(), ref, lost, d.Err())
			}
		}
		if err := tg.Err(); err != nil {
			t.Fatalf("target: %v", err)
		}
		t.Logf("domain A: %d puts handled and replied to; domain B: %d accesses", len(recs), len(brec))
		return
	}

	await(t, b("model-ready"))
	defer signal(t, b("model-done")) // also when failing: the target stops waiting
	s := dial(t, port, "model-src")
	ctx := timeout(t, 120*time.Second)
	if s.Size() != 8*page || s.Mode() != mode || s.ID() == 0 {
		t.Fatalf("size %d mode %v id %d", s.Size(), s.Mode(), s.ID())
	}
	ops := make([]*activeaccess.Op, nputs)
	for i := range ops {
		var err error
		if ops[i], err = s.Put(ctx, i*64, pattern(i*64, 64, 1)); err != nil {
			t.Fatalf("Put %d: %v", i, err)
		}
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	for i, o := range ops {
		select {
		case <-o.Done():
		default:
			t.Fatalf("put %d not done after Flush", i)
		}
		if o.Err() != nil {
			t.Fatalf("put %d: %v", i, o.Err())
		}
	}
	// The handler replied to every put before the flush was acknowledged.
	if n := s.Replies(); n != nputs {
		t.Fatalf("%d replies after Flush, want %d", n, nputs)
	}
	got := map[uint64]bool{}
	for i := 0; i < nputs; i++ {
		r, err := s.Reply(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if r.Value != sum(pattern(int(r.Offset), 64, 1)) || got[r.Offset] {
			t.Fatalf("reply %d: %+v", i, r)
		}
		got[r.Offset] = true
	}
	if p := s.Processed(); p < nputs {
		t.Fatalf("target reports %d entries processed, want at least %d", p, nputs)
	}

	const bo, bn = 4*page + 3000, 3000
	if err := s.PutWait(ctx, bo, pattern(bo, bn, 2)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, bn)
	if err := s.GetWait(ctx, bo, buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, pattern(bo, bn, 2)) {
		t.Fatal("Get returned other bytes than the Put wrote")
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Page 7 (W=0 R=0): the get returns zeros, the put changes nothing.
	buf = bytes.Repeat([]byte{0xee}, 1000)
	if err := s.GetWait(ctx, 7*page+100, buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, make([]byte, 1000)) {
		t.Fatal("a get from an R=0 page returned other bytes than zeros")
	}
	if err := s.PutWait(ctx, 7*page+2000, pattern(0, 100, 9)); err != nil {
		t.Fatal(err)
	}

	po, err := s.PutPlain(ctx, 6*page, pattern(6*page, 4000, 3))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.FlushPlain(ctx); err != nil {
		t.Fatal(err)
	}
	if po.Err() != nil || !isDone(po) {
		t.Fatalf("plain put after FlushPlain: done %v err %v", isDone(po), po.Err())
	}
	buf = make([]byte, 4000)
	o, err := s.GetPlain(ctx, 6*page, buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, pattern(6*page, 4000, 3)) {
		t.Fatal("plain Get returned other bytes than the plain Put wrote")
	}
	start := time.Now()
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	t.Logf("empty flush %v; stats %+v; credits %d of %d", time.Since(start), st, s.Credits(), s.Grant())
	if s.Credits() != s.Grant() {
		t.Fatalf("after a flush with nothing pending, %d of %d credits available", s.Credits(), s.Grant())
	}
	signal(t, b("model-done"))
	await(t, b("model-checked"))
}

func isDone(o *activeaccess.Op) bool {
	select {
	case <-o.Done():
		return true
	default:
		return false
	}
}

// TestLabFlood: two sources flood a small log whose handler is slow; the
// credits make them wait, the module never refuses an access, and the
// handler sees every access exactly once. A third source is refused.
func TestLabFlood(t *testing.T) { forModes(t, testFlood) }

func testFlood(t *testing.T, mode activeaccess.Mode, b func(string) string) {
	port := 7520 + uint16(mode)
	const n = 3000
	if server(t) {
		tg := listen(t, port, 16*page, &activeaccess.TargetOptions{LogSize: 1 << 15, MaxSources: 2, Mode: mode})
		st0, err := tg.Stats()
		if mode == activeaccess.ModeMediated {
			if !errors.Is(err, kmod.ErrNotSupported) {
				t.Fatalf("Stats of a mediated target: %v", err)
			}
		} else if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		seen := map[string][]int{}
		var bad []string
		count := 0
		d, err := tg.NewDomain(func(a *activeaccess.Access) {
			mu.Lock()
			defer mu.Unlock()
			count++
			if count%50 == 0 {
				time.Sleep(2 * time.Millisecond) // a slow handler: the log fills up
			}
			if a.Source == nil || len(a.Data) < 8 || a.Length != len(a.Data) {
				bad = append(bad, "unexpected access")
				return
			}
			i := int(a.Data[4]) | int(a.Data[5])<<8 | int(a.Data[6])<<16
			if !bytes.Equal(a.Data, floodData(a.Source.Name, i)) || a.Offset != floodOff(i) {
				bad = append(bad, a.Source.Name+": data differs")
				return
			}
			seen[a.Source.Name] = append(seen[a.Source.Name], i)
			if err := a.Reply(uint64(i)); err != nil {
				bad = append(bad, "Reply: "+err.Error())
			}
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Associate(0, 16*page, activeaccess.Intercept); err != nil {
			t.Fatal(err)
		}
		defer signal(t, b("flood-checked"))
		signal(t, b("flood-ready"))
		await(t, b("flood-done"))
		mu.Lock()
		defer mu.Unlock()
		if st, err := tg.Stats(); err == nil {
			ref, lost := d.Refused()
			t.Logf("module: %d entries, %d refused writes, %d missed probe hits; domain: processed %d, refused %d lost %d",
				st.Entries-st0.Entries, st.RefusedWrites-st0.RefusedWrites, st.Missed, d.Processed(), ref, lost)
		}
		if err := d.Err(); err != nil {
			t.Errorf("domain runtime: %v", err)
		}
		if err := tg.Err(); err != nil {
			t.Errorf("target: %v", err)
		}
		if st, err := tg.Stats(); err == nil && st.Missed != 0 {
			t.Fatalf("the module missed %d probe hits: those accesses were neither steered nor logged", st.Missed)
		}
		for _, name := range []string{"flood-1", "flood-2"} {
			got := map[int]bool{}
			for _, i := range seen[name] {
				got[i] = true
			}
			var missing []int
			for i := 0; i < n; i++ {
				if !got[i] {
					missing = append(missing, i)
				}
			}
			if len(missing) > 0 {
				t.Logf("%s: missing accesses %v", name, missing[:min(len(missing), 20)])
			}
		}
		if len(bad) > 0 {
			t.Fatalf("%d bad accesses, first: %s", len(bad), bad[0])
		}
		for _, name := range []string{"flood-1", "flood-2"} {
			idx := seen[name]
			if len(idx) != n {
				t.Fatalf("%s: handler saw %d accesses, want %d", name, len(idx), n)
			}
			for k, i := range idx {
				if i != k {
					t.Fatalf("%s: access %d is #%d (each once, in order)", name, k, i)
				}
			}
		}
		if ref, lost := d.Refused(); ref != 0 || lost != 0 {
			t.Fatalf("the log refused %d accesses, lost %d reads", ref, lost)
		}
		st, _ := tg.Stats()
		if mode == activeaccess.ModeTransparent && (st.RefusedWrites != st0.RefusedWrites || st.Missed != 0) {
			t.Fatalf("module: refused writes %d -> %d, missed %d", st0.RefusedWrites, st.RefusedWrites, st.Missed)
		}
		t.Logf("%v: %d accesses through %d-byte logs (grant %d bytes per source), none refused", mode, 2*n, 1<<15, tg.Grant())
		return
	}

	await(t, b("flood-ready"))
	defer signal(t, b("flood-done"))
	ctx := timeout(t, 240*time.Second)
	srcs := []*activeaccess.Source{dial(t, port, "flood-1"), dial(t, port, "flood-2")}
	_, err := activeaccess.Dial(timeout(t, 60*time.Second), targetAddr(t, port), &activeaccess.SourceOptions{Name: "flood-3"})
	var rej *activeaccess.RejectError
	if !errors.As(err, &rej) || rej.Reason != activeaccess.RejectTooMany {
		t.Fatalf("a third source: %v, want a rejection for too many sources", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	start := time.Now()
	for k, s := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := []string{"flood-1", "flood-2"}[k]
			var ops []*activeaccess.Op
			for i := 0; i < n; i++ {
				o, err := s.Put(ctx, floodOff(i), floodData(name, i))
				if err != nil {
					errs <- err
					return
				}
				ops = append(ops, o)
			}
			if err := s.Flush(ctx); err != nil {
				errs <- err
				return
			}
			for i, o := range ops {
				if err := o.Err(); err != nil || !isDone(o) {
					errs <- fmt.Errorf("%s: put %d: done %v, %v", name, i, isDone(o), err)
					return
				}
			}
			// Each source gets the replies to its own accesses, in order.
			if r := s.Replies(); r != n {
				errs <- fmt.Errorf("%s: %d replies after Flush, want %d", name, r, n)
				return
			}
			for i := 0; i < n; i++ {
				r, err := s.Reply(ctx)
				if err != nil || r.Value != uint64(i) || r.Offset != uint64(floodOff(i)) {
					errs <- fmt.Errorf("%s: reply %d: %+v, %v", name, i, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, s := range srcs {
		st := s.Stats()
		t.Logf("source %d: %+v, %d of %d credits back", s.ID(), st, s.Credits(), s.Grant())
		if st.CreditWaits == 0 {
			t.Errorf("source %d never waited for credits: the flood did not fill the log", s.ID())
		}
		if s.Credits() != s.Grant() || s.Processed() != n {
			t.Errorf("source %d: %d of %d credits, %d processed after Flush", s.ID(), s.Credits(), s.Grant(), s.Processed())
		}
	}
	t.Logf("%d puts in %v", 2*n, time.Since(start))
	signal(t, b("flood-done"))
	await(t, b("flood-checked"))
}

func floodOff(i int) int { return (i % 200) * 256 }

// floodData is put number i of a source: 64 to 256 bytes naming it.
func floodData(name string, i int) []byte {
	b := pattern(floodOff(i), 64+(i%4)*64, name[len(name)-1])
	b[4], b[5], b[6] = byte(i), byte(i>>8), byte(i>>16)
	return b
}

const childEnv = "AA_LAB_CHILD_TARGET"

// childReadyEnv names the barrier the child target raises once it serves.
const childReadyEnv = "AA_LAB_CHILD_READY"

// childTarget runs in a child process of the target guest's test: a
// target whose handler never returns from an access starting with 0xff.
func childTarget() int {
	a, err := labenv.AddrOf(1)
	if err != nil {
		return 2
	}
	m, _ := strconv.Atoi(os.Getenv(childEnv))
	mode := activeaccess.Mode(m)
	tg, err := activeaccess.Listen(context.Background(), netip.AddrPortFrom(netip.MustParseAddr(a), uint16(7530+m)), 4*page,
		&activeaccess.TargetOptions{Mode: mode})
	if err != nil {
		os.Stderr.WriteString("child target: " + err.Error() + "\n")
		return 2
	}
	d, err := tg.NewDomain(func(a *activeaccess.Access) {
		if len(a.Data) > 0 && a.Data[0] == 0xff {
			select {} // a stuck handler: the source's flush cannot complete
		}
	}, nil)
	if err == nil {
		err = d.Associate(0, 4*page, activeaccess.Intercept)
	}
	if err != nil {
		os.Stderr.WriteString("child target: " + err.Error() + "\n")
		return 2
	}
	labenv.Signal(os.Getenv(childReadyEnv)) // the test's ready barrier
	select {}
}

// TestLabTargetDies: the target process is killed while a source waits
// in Flush; the flush fails with ErrDisconnected (no hang), and so does
// everything after it.
func TestLabTargetDies(t *testing.T) { forModes(t, testTargetDies) }

func testTargetDies(t *testing.T, mode activeaccess.Mode, b func(string) string) {
	port := 7530 + uint16(mode)
	if server(t) {
		cmd := startChild(t, mode, b("dies-ready"))
		await(t, b("dies-kill"))
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		signal(t, b("dies-killed"))
		await(t, b("dies-done"))
		return
	}
	await(t, b("dies-ready"))
	defer signal(t, b("dies-done"))
	defer signal(t, b("dies-kill"))
	s := dial(t, port, "dies-src")
	ctx := timeout(t, 120*time.Second)
	flushed := stuckFlush(ctx, t, s, time.Second)
	signal(t, b("dies-kill"))
	await(t, b("dies-killed"))
	flushFails(t, flushed, "the target was killed")
	if _, err := s.Put(ctx, 0, []byte("after")); !errors.Is(err, activeaccess.ErrDisconnected) {
		t.Fatalf("Put after the target died: %v", err)
	}
	if err := s.Flush(ctx); !errors.Is(err, activeaccess.ErrDisconnected) {
		t.Fatalf("second Flush: %v", err)
	}
	if _, err := s.Reply(ctx); !errors.Is(err, activeaccess.ErrDisconnected) {
		t.Fatalf("Reply: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close after the target died: %v", err)
	}
	// Nothing listens any more: Dial fails, it does not hang.
	dctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := activeaccess.Dial(dctx, targetAddr(t, port), nil); err == nil || dctx.Err() != nil {
		t.Fatalf("Dial to a dead target: %v (context %v)", err, dctx.Err())
	} else {
		t.Logf("Dial to the dead target: %v", err)
	}
	signal(t, b("dies-done"))
}

// startChild starts the child target (childTarget) for mode; it raises
// the barrier ready once it serves, and is killed with the test.
func startChild(t *testing.T, mode activeaccess.Mode, ready string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(int(mode)), childReadyEnv+"="+ready)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// stuckFlush makes s's next Flush wait on the child target's stuck
// handler: a put and a flush that succeed, then a put the handler sticks
// on and a Flush, which must still be waiting after d. It returns the
// Flush's result to come.
func stuckFlush(ctx context.Context, t *testing.T, s *activeaccess.Source, d time.Duration) <-chan error {
	t.Helper()
	if err := s.PutWait(ctx, 0, []byte("before")); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.PutWait(ctx, 64, []byte{0xff, 1, 2, 3}); err != nil { // the handler sticks on it
		t.Fatal(err)
	}
	flushed := make(chan error, 1)
	go func() { flushed <- s.Flush(ctx) }()
	select {
	case err := <-flushed:
		t.Fatalf("Flush returned while the handler is stuck: %v", err)
	case <-time.After(d):
	}
	return flushed
}

// flushFails waits at most 60 s for the Flush stuckFlush started, which
// must fail with ErrDisconnected now that the target is gone (what says
// how).
func flushFails(t *testing.T, flushed <-chan error, what string) {
	t.Helper()
	start := time.Now()
	var err error
	select {
	case err = <-flushed:
	case <-time.After(60 * time.Second):
		t.Fatalf("Flush still waiting 60 s after %s", what)
	}
	t.Logf("Flush returned %v after %s: %v", time.Since(start), what, err)
	if !errors.Is(err, activeaccess.ErrDisconnected) {
		t.Fatalf("Flush after %s: %v, want ErrDisconnected", what, err)
	}
}

// TestLabMisuse: bad arguments, use after Close, Close twice, on both
// sides; closing the target disconnects its sources.
func TestLabMisuse(t *testing.T) {
	const port = 7540
	if server(t) {
		for _, c := range []struct {
			addr netip.AddrPort
			size int
			opts *activeaccess.TargetOptions
		}{
			{netip.AddrPortFrom(netip.IPv4Unspecified(), port), page, nil},
			{targetAddr(t, 0), page, nil},
			{targetAddr(t, port), 0, nil},
			{targetAddr(t, port), page, &activeaccess.TargetOptions{LogSize: 5000}},
			{targetAddr(t, port), page, &activeaccess.TargetOptions{Mode: 9}},
			{targetAddr(t, port), page, &activeaccess.TargetOptions{LogSize: 4096, MaxSources: 2}},
		} {
			if _, err := activeaccess.Listen(timeout(t, time.Minute), c.addr, c.size, c.opts); !errors.Is(err, activeaccess.ErrInvalid) {
				t.Errorf("Listen(%v, %d, %+v): %v, want ErrInvalid", c.addr, c.size, c.opts, err)
			}
		}
		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := activeaccess.Listen(cancelled, targetAddr(t, port), page, nil); !errors.Is(err, context.Canceled) {
			t.Errorf("Listen with a cancelled context: %v, want context.Canceled", err)
		}
		tg := listen(t, port, 4*page, nil)
		if _, err := tg.NewDomain(nil, nil); !errors.Is(err, activeaccess.ErrInvalid) {
			t.Errorf("NewDomain without a handler: %v", err)
		}
		d, err := tg.NewDomain(func(*activeaccess.Access) {}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			off, n int
			want   error
		}{{100, page, activeaccess.ErrInvalid}, {0, 100, activeaccess.ErrInvalid}, {-page, page, activeaccess.ErrInvalid},
			{0, 0, activeaccess.ErrInvalid}, {0, 8 * page, activeaccess.ErrRange}, {4 * page, page, activeaccess.ErrRange}} {
			if err := d.Associate(c.off, c.n, activeaccess.Intercept); !errors.Is(err, c.want) {
				t.Errorf("Associate(%d, %d): %v, want %v", c.off, c.n, err, c.want)
			}
		}
		if err := d.Associate(0, page, activeaccess.Actions(1<<10)); !errors.Is(err, activeaccess.ErrInvalid) {
			t.Errorf("unknown action bits: %v", err)
		}
		if err := d.Associate(0, page, activeaccess.Intercept); err != nil {
			t.Fatal(err)
		}
		if err := d.Dissociate(0, page); err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); err != nil {
			t.Fatalf("second Domain.Close: %v", err)
		}
		if err := d.Associate(0, page, activeaccess.Intercept); !errors.Is(err, activeaccess.ErrClosed) {
			t.Errorf("Associate after Close: %v", err)
		}
		signal(t, "misuse-ready")
		await(t, "misuse-connected")
		n := 0
		for i := 0; i < 100; i++ {
			if n = tg.Sources(); n == 1 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if n != 1 {
			t.Errorf("%d sources connected, want 1 (one closed, one open)", n)
		}
		if err := tg.Close(); err != nil {
			t.Fatalf("Target.Close: %v", err)
		}
		if err := tg.Close(); err != nil {
			t.Fatalf("second Target.Close: %v", err)
		}
		if _, err := tg.NewDomain(func(*activeaccess.Access) {}, nil); !errors.Is(err, activeaccess.ErrClosed) {
			t.Errorf("NewDomain after Close: %v", err)
		}
		if tg.Memory() != nil {
			t.Error("Memory after Close")
		}
		if _, err := tg.Stats(); !errors.Is(err, activeaccess.ErrClosed) {
			t.Errorf("Stats after Close: %v", err)
		}
		signal(t, "misuse-closed")
		await(t, "misuse-done")
		return
	}

	await(t, "misuse-ready")
	defer signal(t, "misuse-done")
	defer signal(t, "misuse-connected")
	ctx := timeout(t, 60*time.Second)
	if _, err := activeaccess.Dial(ctx, targetAddr(t, port), &activeaccess.SourceOptions{Name: string(make([]byte, 41))}); !errors.Is(err, activeaccess.ErrInvalid) {
		t.Errorf("Dial with a 41-byte name: %v", err)
	}
	s, err := activeaccess.Dial(ctx, targetAddr(t, port), &activeaccess.SourceOptions{Name: "misuse", Staging: page})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off, n int
		want   error
	}{{-1, 8, activeaccess.ErrRange}, {4*page - 10, 20, activeaccess.ErrRange}, {4 * page, 1, activeaccess.ErrRange},
		{0, 0, activeaccess.ErrInvalid}, {0, 2 * page, activeaccess.ErrTooLarge}} {
		if _, err := s.Put(ctx, c.off, make([]byte, c.n)); !errors.Is(err, c.want) {
			t.Errorf("Put(%d, %d bytes): %v, want %v", c.off, c.n, err, c.want)
		}
		if _, err := s.GetPlain(ctx, c.off, make([]byte, c.n)); !errors.Is(err, c.want) {
			t.Errorf("GetPlain(%d, %d bytes): %v, want %v", c.off, c.n, err, c.want)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	before := s.Stats()
	if _, err := s.Put(cancelled, 0, []byte("x")); !errors.Is(err, context.Canceled) {
		t.Errorf("Put with a cancelled context: %v, want context.Canceled", err)
	}
	if err := s.Flush(cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("Flush with a cancelled context: %v, want context.Canceled", err)
	}
	if after := s.Stats(); after.Active != before.Active || after.Markers != before.Markers {
		t.Errorf("calls with a cancelled context issued work: %+v, then %+v", before, after)
	}
	if err := s.PutWait(ctx, 4*page-8, []byte("the end.")); err != nil {
		t.Fatalf("a put at the last byte: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Put(ctx, 0, []byte("x")); !errors.Is(err, activeaccess.ErrClosed) {
		t.Errorf("Put after Close: %v", err)
	}
	if err := s.Flush(ctx); !errors.Is(err, activeaccess.ErrClosed) {
		t.Errorf("Flush after Close: %v", err)
	}
	if err := s.FlushPlain(ctx); !errors.Is(err, activeaccess.ErrClosed) {
		t.Errorf("FlushPlain after Close: %v", err)
	}
	if _, err := s.Reply(ctx); !errors.Is(err, activeaccess.ErrClosed) {
		t.Errorf("Reply after Close: %v", err)
	}
	// Closing the target disconnects this one.
	s2 := dial(t, port, "misuse-2")
	if err := s2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	signal(t, "misuse-connected")
	await(t, "misuse-closed")
	var ferr error
	for i := 0; i < 200; i++ {
		if ferr = s2.Flush(ctx); ferr != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !errors.Is(ferr, activeaccess.ErrDisconnected) {
		t.Errorf("Flush to a closed target: %v, want ErrDisconnected", ferr)
	}
	signal(t, "misuse-done")
}
