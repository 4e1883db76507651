//go:build lab

package kmod_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

func TestLabVersion(t *testing.T) {
	d := openDev(t)
	v := d.Version()
	if v.ABI != kmod.ABIVersion || !v.ActiveAccess || v.Release == "" {
		t.Fatalf("version %+v", v)
	}
	st := idle(t, d)
	t.Logf("version %+v, stats %+v", v, st)
}

// W|WL|WLD: writes reach memory and are logged with their data, one entry
// per packet and page, in order, never torn.
func TestLabWriteLogged(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 4)
	dm := newDomain(t, d, 1<<16)
	if err := dm.Arm(p.key(), p.addr(0), 2*page, kmod.W|kmod.WL|kmod.WLD); err != nil {
		t.Fatalf("Arm: %v", err)
	}
	st, _ := d.Stats()
	if !st.HooksArmed || st.Pages != 2 || st.MRs != 1 || st.Domains != 1 {
		t.Fatalf("stats after arm: %+v", st)
	}
	if sy, err := kmod.StatsFromSysfs(""); err != nil || sy != st {
		t.Fatalf("sysfs counters %+v (%v), ioctl %+v", sy, err, st)
	}

	// One small write.
	data := pattern(100, 1)
	if err := p.write(0, 10, data); err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(p.dst.mr.Bytes()[10:110], data) {
		t.Fatal("target memory differs from what was written")
	}
	es := readAll(t, dm)
	if len(es) != 1 {
		t.Fatalf("%d entries, want 1: %+v", len(es), es)
	}
	e := es[0]
	if e.Op != kmod.OpWrite || e.Seq != 1 || e.IOVA != p.addr(10) || e.Length != 100 ||
		e.Domain != dm.ID() || e.Key != p.key() || e.Suppressed || !bytes.Equal(e.Data, data) {
		t.Fatalf("entry %+v", e)
	}
	p.checkSource(es)

	// A 3-page write from inside page 0: 1024-byte packets straddle page
	// boundaries; pages 0 and 1 are armed, page 2 is not.
	big := pattern(2*page+500, 3)
	if err := p.write(0, 300, big); err != nil {
		t.Fatalf("big write: %v", err)
	}
	if !bytes.Equal(p.dst.mr.Bytes()[300:300+len(big)], big) {
		t.Fatal("target memory differs after the big write")
	}
	es = readAll(t, dm)
	var got []byte
	next := uint64(2)
	for _, e := range es {
		if e.Seq != next {
			t.Fatalf("seq %d, want %d", e.Seq, next)
		}
		next++
		if e.IOVA/page != (e.IOVA+uint64(e.Length)-1)/page {
			t.Fatalf("entry crosses a page: %+v", e)
		}
		if e.IOVA != p.addr(300+len(got)) {
			t.Fatalf("entry at %#x, want %#x", e.IOVA, p.addr(300+len(got)))
		}
		got = append(got, e.Data...)
	}
	p.checkSource(es)
	if want := big[:2*page-300]; !bytes.Equal(got, want) {
		t.Fatalf("logged %d bytes, want the %d bytes that hit pages 0 and 1", len(got), len(want))
	}
	if h, seq := dm.Head(); h != dm.Tail() || seq != next-1 {
		t.Fatalf("head %d seq %d tail %d", h, seq, dm.Tail())
	}
	if err := dm.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := dm.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := dm.Read(nil, 0); !errors.Is(err, kmod.ErrClosed) {
		t.Fatalf("Read after Close: %v", err)
	}
	idle(t, d)
}

// W=0: the writer sees success, memory keeps its bytes, the log has the data.
func TestLabWriteSuppressed(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 4)
	dm := newDomain(t, d, 1<<16)
	before := pattern(4*page, 9)
	copy(p.dst.mr.Bytes(), before)
	if err := dm.Arm(p.key(), p.addr(page), page, kmod.R|kmod.WL|kmod.WLD); err != nil {
		t.Fatalf("Arm: %v", err)
	}
	// Straddles pages 0 (inactive) and 1 (W=0) in one packet.
	data := pattern(200, 77)
	if err := p.write(0, page-100, data); err != nil {
		t.Fatalf("write: %v", err)
	}
	want := append([]byte(nil), before...)
	copy(want[page-100:], data[:100])
	if !bytes.Equal(p.dst.mr.Bytes(), want) {
		t.Fatal("memory: page 0 part must change, page 1 part must not")
	}
	es := readAll(t, dm)
	if len(es) != 1 || !es[0].Suppressed || es[0].IOVA != p.addr(page) || es[0].Length != 100 ||
		!bytes.Equal(es[0].Data, data[100:]) {
		t.Fatalf("entries %+v", es)
	}
	// A write entirely inside the W=0 page.
	if err := p.write(0, page+8, data); err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(p.dst.mr.Bytes(), want) {
		t.Fatal("W=0 page changed")
	}
	if es := readAll(t, dm); len(es) != 1 || !bytes.Equal(es[0].Data, data) || !es[0].Suppressed {
		t.Fatalf("entries %+v", es)
	}
	st, _ := d.Stats()
	if st.HiddenWrites < 2 {
		t.Fatalf("stats %+v", st)
	}
}

// R|RL|RLD logs the data served; R=0 serves zeros and logs that.
func TestLabReads(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 4)
	dm := newDomain(t, d, 1<<16)
	mem := pattern(4*page, 21)
	copy(p.dst.mr.Bytes(), mem)
	if err := dm.Arm(p.key(), p.addr(0), page, kmod.W|kmod.R|kmod.RL|kmod.RLD); err != nil {
		t.Fatal(err)
	}
	if err := dm.Arm(p.key(), p.addr(page), page, kmod.W|kmod.RL); err != nil { // R=0
		t.Fatal(err)
	}
	got, err := p.read(0, 1000, 2000)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(got, mem[1000:3000]) {
		t.Fatal("read returned other bytes than memory")
	}
	es := readAll(t, dm)
	for _, e := range es {
		if e.Op != kmod.OpRead || e.Suppressed || len(e.Data) != int(e.Length) {
			t.Fatalf("entry %+v", e)
		}
	}
	p.checkSource(es)
	if lo, hi, n := covered(t, es, p.addr(0), func(o int) byte { return mem[o] }); lo != 1000 || hi != 3000 || n != 2000 {
		t.Fatalf("logged data covers [%d, %d) (%d bytes), want the 2000 bytes served", lo, hi, n)
	}

	// Across pages 0 (R=1) and 1 (R=0): the reader gets memory then zeros.
	got, err = p.read(0, page-1500, 3000)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	want := append(append([]byte(nil), mem[page-1500:page]...), make([]byte, 1500)...)
	if !bytes.Equal(got, want) {
		t.Fatal("R=0 page must read as zeros, R=1 page as memory")
	}
	if !bytes.Equal(p.dst.mr.Bytes(), mem) {
		t.Fatal("reads changed memory")
	}
	es = readAll(t, dm)
	var r0 []kmod.Entry
	for _, e := range es {
		if e.IOVA >= p.addr(page) {
			if !e.Suppressed || e.Data != nil {
				t.Fatalf("R=0 RL entry %+v", e)
			}
			r0 = append(r0, e)
		}
	}
	if lo, hi, n := covered(t, r0, p.addr(0), nil); lo != page || hi != page+1500 || n != 1500 {
		t.Fatalf("R=0 page: entries cover [%d, %d) (%d bytes)", lo, hi, n)
	}
	st, _ := d.Stats()
	if st.ZeroedReads == 0 || st.Reads == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Atomics: allowed and logged on W=1 R=1 pages, refused (remote invalid
// request, memory untouched) on W=0 pages.
func TestLabAtomics(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 2)
	dm := newDomain(t, d, 1<<16)
	le := func(off int) uint64 {
		b := p.dst.mr.Bytes()[off:]
		return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
			uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
	}
	p.dst.mr.Bytes()[64] = 5
	if err := dm.Arm(p.key(), p.addr(0), page, kmod.W|kmod.R|kmod.WL|kmod.WLD); err != nil {
		t.Fatal(err)
	}
	if err := p.post(verbs.OpAtomicFAA, 0, 64, 8, 10, 0); err != nil {
		t.Fatalf("fetch-add: %v", err)
	}
	if le(64) != 15 {
		t.Fatalf("after fetch-add: %d", le(64))
	}
	es := readAll(t, dm)
	if len(es) != 1 || es[0].Op != kmod.OpAtomic || es[0].Value != 5 || es[0].IOVA != p.addr(64) || len(es[0].Data) != 8 {
		t.Fatalf("entries %+v", es)
	}
	p.checkSource(es)
	if err := dm.Arm(p.key(), p.addr(page), page, kmod.R|kmod.WL); err != nil {
		t.Fatal(err)
	}
	p.dst.mr.Bytes()[page+8] = 1
	err := p.post(verbs.OpAtomicCAS, 0, page+8, 8, 1, 99)
	if !errors.Is(err, verbs.WCRemInvReqErr) {
		t.Fatalf("CAS on a W=0 page: %v, want IBV_WC_REM_INV_REQ_ERR", err)
	}
	if le(page+8) != 1 {
		t.Fatalf("W=0 page changed by an atomic: %d", le(page+8))
	}
	st, _ := d.Stats()
	if st.RefusedAtomics == 0 || st.Atomics < 2 {
		t.Fatalf("stats %+v", st)
	}
}

// Atomics need both W and R (they read and write) and room in the log when
// the page logs: otherwise the requester gets a remote invalid request
// error and memory is unchanged. Each case on its own connection, since
// the error ends the queue pair.
func TestLabAtomicsRefused(t *testing.T) {
	d := openDev(t)
	for _, c := range []struct {
		name string
		bits kmod.Bits
		fill bool // fill the log with writes first
	}{
		{"R=0", kmod.W | kmod.WL, false},
		{"W=0 R=0", kmod.WL, false},
		{"log full", kmod.W | kmod.R | kmod.WL, true},
	} {
		p := newPair(t, 2)
		dm := newDomain(t, d, kmod.MinLogSize)
		if err := dm.Arm(p.key(), p.addr(0), page, c.bits|kmod.W); err != nil {
			t.Fatal(err)
		}
		n := 0
		if c.fill {
			for ; n < kmod.MinLogSize/kmod.EntryHeader; n++ {
				if err := p.write(0, 8*n, []byte{1, 2, 3, 4, 5, 6, 7, byte(n)}); err != nil {
					t.Fatalf("%s: write %d: %v", c.name, n, err)
				}
			}
		}
		if err := dm.Arm(p.key(), p.addr(0), page, c.bits); err != nil {
			t.Fatal(err)
		}
		before, _ := d.Stats()
		p.dst.mr.Bytes()[page-8] = 7
		err := p.post(verbs.OpAtomicFAA, 0, page-8, 8, 1, 0)
		if !errors.Is(err, verbs.WCRemInvReqErr) {
			t.Fatalf("%s: fetch-add: %v, want IBV_WC_REM_INV_REQ_ERR", c.name, err)
		}
		if b := p.dst.mr.Bytes()[page-8]; b != 7 {
			t.Fatalf("%s: memory changed to %d", c.name, b)
		}
		after, _ := d.Stats()
		if after.RefusedAtomics != before.RefusedAtomics+1 {
			t.Fatalf("%s: refused atomics %d -> %d", c.name, before.RefusedAtomics, after.RefusedAtomics)
		}
		if es := readAll(t, dm); len(es) != n {
			t.Fatalf("%s: %d entries, want the %d writes only", c.name, len(es), n)
		}
	}
}

// A full log refuses writes with a remote access error; nothing is lost:
// every write that completed successfully is in the log, in order.
func TestLabLogFullRefuses(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 2)
	dm := newDomain(t, d, kmod.MinLogSize) // 64 metadata entries
	if err := dm.Arm(p.key(), p.addr(0), page, kmod.W|kmod.R|kmod.WL); err != nil {
		t.Fatal(err)
	}
	ok := 0
	var last error
	for i := 0; i < 100; i++ {
		if last = p.write(0, 8*(i%500), []byte{byte(i), 1, 2, 3, 4, 5, 6, 7}); last != nil {
			break
		}
		ok++
	}
	if ok != kmod.MinLogSize/kmod.EntryHeader || !errors.Is(last, verbs.WCRemAccessErr) {
		t.Fatalf("%d writes succeeded then %v; want %d then IBV_WC_REM_ACCESS_ERR", ok, last, kmod.MinLogSize/64)
	}
	if p.dst.mr.Bytes()[8*ok] != 0 {
		t.Fatal("the refused write reached memory")
	}
	es := readAll(t, dm)
	if len(es) != ok {
		t.Fatalf("%d entries for %d successful writes", len(es), ok)
	}
	for i, e := range es {
		if e.Seq != uint64(i+1) || e.IOVA != p.addr(8*i) {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}
	if refused, _ := dm.Refused(); refused != 1 {
		t.Fatalf("ring says %d refused", refused)
	}
}

// A flood: a consumer drains the log while the source writes as fast as
// its credits allow; every write is logged exactly once with its data.
// Then a source that ignores credits: each of its writes either completes
// and is logged, or fails at the source. None disappears.
func TestLabFlood(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 4)
	const logSize = 8192
	dm := newDomain(t, d, logSize)
	if err := dm.Arm(p.key(), p.addr(0), 4*page, kmod.W|kmod.R|kmod.WL|kmod.WLD); err != nil {
		t.Fatal(err)
	}
	if err := dm.Notify(kmod.NotifyOptions{Threshold: 8, Interval: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	const n, size = 3000, 48
	entrySize := kmod.EntryHeader + 64
	credits := make(chan struct{}, logSize/entrySize)
	for i := 0; i < cap(credits); i++ {
		credits <- struct{}{}
	}
	got := make(chan []kmod.Entry, 1)
	go func() {
		var all []kmod.Entry
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for len(all) < n {
			es, err := dm.Read(nil, 0)
			if err != nil {
				t.Error(err)
				break
			}
			for range es {
				credits <- struct{}{}
			}
			all = append(all, es...)
			if len(es) == 0 {
				if _, err := dm.Wait(ctx); err != nil {
					t.Error(err)
					break
				}
			}
		}
		got <- all
	}()
	payload := func(i int) []byte { return pattern(size, byte(i)) }
	posted := 0
	for posted < n {
		// Post a batch of as many writes as there are credits.
		batch := 0
		<-credits
		batch++
	more:
		for batch < 64 {
			select {
			case <-credits:
				batch++
			default:
				break more
			}
		}
		if posted+batch > n {
			for i := n - posted; i < batch; i++ {
				credits <- struct{}{}
			}
			batch = n - posted
		}
		for i := 0; i < batch; i++ {
			k := posted + i
			off := (k * 64) % (4 * page)
			copy(p.src.mr.Bytes()[off:], payload(k))
			wr := verbs.SendWR{ID: uint64(k), Op: verbs.OpWrite, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{p.src.mr.SGE(off, size)}, RemoteAddr: p.addr(off), RKey: p.key()}
			if err := p.src.qp.PostSend(wr); err != nil {
				t.Fatalf("PostSend %d: %v", k, err)
			}
		}
		for i := 0; i < batch; i++ {
			if err := p.waitOne(p.src); err != nil {
				t.Fatalf("write %d with credits: %v", posted+i, err)
			}
		}
		posted += batch
	}
	all := <-got
	if len(all) != n {
		t.Fatalf("%d entries for %d writes", len(all), n)
	}
	for i, e := range all {
		if e.Seq != uint64(i+1) || e.IOVA != p.addr((i*64)%(4*page)) || !bytes.Equal(e.Data, payload(i)) {
			t.Fatalf("entry %d: seq %d at %#x, %d data bytes", i, e.Seq, e.IOVA, len(e.Data))
		}
	}
	p.checkSource(all)
	t.Logf("with credits: %d writes, %d entries, all in order", n, len(all))

	// Without credits: 400 writes in flight, nobody draining.
	q := newPair(t, 4)
	dm2 := newDomain(t, d, kmod.MinLogSize)
	if err := dm2.Arm(q.key(), q.addr(0), 4*page, kmod.W|kmod.R|kmod.WL); err != nil {
		t.Fatal(err)
	}
	for k := 0; k < 400; k++ {
		wr := verbs.SendWR{ID: uint64(k), Op: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{q.src.mr.SGE(0, 8)}, RemoteAddr: q.addr(8 * k), RKey: q.key()}
		if err := q.src.qp.PostSend(wr); err != nil {
			t.Fatalf("PostSend %d: %v", k, err)
		}
		if k%64 == 63 {
			time.Sleep(time.Millisecond)
		}
	}
	okN, refused, flushed := 0, 0, 0
	for k := 0; k < 400; k++ {
		err := q.waitOne(q.src)
		switch {
		case err == nil:
			okN++
		case errors.Is(err, verbs.WCRemAccessErr):
			refused++
		case errors.Is(err, verbs.WCWRFlushErr):
			flushed++
		default:
			t.Fatalf("write completion: %v", err)
		}
	}
	es := readAll(t, dm2)
	if len(es) != okN || refused == 0 {
		t.Fatalf("no credits: %d ok, %d refused, %d flushed, %d entries", okN, refused, flushed, len(es))
	}
	t.Logf("without credits: %d ok and logged, %d refused, %d flushed", okN, refused, flushed)
	if st, _ := d.Stats(); st.Missed != 0 {
		t.Fatalf("missed %d", st.Missed)
	}
}

// Notification: eventfd after a count threshold, after an interval, and
// poll(2) on the device.
func TestLabNotify(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 1)
	dm := newDomain(t, d, 1<<16)
	if err := dm.Arm(p.key(), p.addr(0), page, kmod.W|kmod.R|kmod.WL); err != nil {
		t.Fatal(err)
	}
	if _, err := dm.Wait(context.Background()); !errors.Is(err, kmod.ErrInvalid) {
		t.Fatalf("Wait before Notify: %v", err)
	}
	if err := dm.Notify(kmod.NotifyOptions{Threshold: 3}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := p.write(0, 8*i, []byte("12345678")); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	if _, err := dm.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait below the threshold: %v", err)
	}
	cancel()
	fds := []unix.PollFd{{Fd: int32(d.Fd()), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 0); err != nil || n != 1 {
		t.Fatalf("poll with 2 pending entries: %d %v", n, err)
	}
	if err := p.write(0, 16, []byte("12345678")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n, err := dm.Wait(ctx); err != nil || n != 1 {
		t.Fatalf("Wait at the threshold: %d %v", n, err)
	}
	if es := readAll(t, dm); len(es) != 3 {
		t.Fatalf("%d entries", len(es))
	}
	if n, err := unix.Poll(fds, 0); err != nil || n != 0 {
		t.Fatalf("poll with an empty log: %d %v", n, err)
	}
	if err := dm.Notify(kmod.NotifyOptions{Interval: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := p.write(0, 24, []byte("12345678")); err != nil {
		t.Fatal(err)
	}
	if _, err := dm.Wait(ctx); err != nil {
		t.Fatalf("Wait with an interval: %v", err)
	}
	t.Logf("interval wake-up after %v", time.Since(start))
}

// Adaptive notification: an entry after a quiet interval wakes at once;
// entries right behind a wake-up wait until the interval has passed since
// it. Timers never fire early, so the lower bound is firm; the upper
// bounds leave TCG seconds of slack.
func TestLabNotifyAdaptive(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 1)
	dm := newDomain(t, d, 1<<16)
	if err := dm.Arm(p.key(), p.addr(0), page, kmod.W|kmod.R|kmod.WL); err != nil {
		t.Fatal(err)
	}
	if err := dm.Notify(kmod.NotifyOptions{Adaptive: true}); !errors.Is(err, kmod.ErrInvalid) {
		t.Fatalf("Adaptive without an interval: %v", err)
	}
	const interval = 3 * time.Second
	if err := dm.Notify(kmod.NotifyOptions{Interval: interval, Adaptive: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wait := func(what string) time.Time {
		t.Helper()
		if _, err := dm.Wait(ctx); err != nil {
			t.Fatalf("Wait %s: %v", what, err)
		}
		return time.Now()
	}
	start := time.Now()
	if err := p.write(0, 0, []byte("12345678")); err != nil {
		t.Fatal(err)
	}
	first := wait("after a quiet log")
	if el := first.Sub(start); el >= interval {
		t.Fatalf("the first entry woke after %v, not at once", el)
	}
	if es := readAll(t, dm); len(es) != 1 {
		t.Fatalf("%d entries", len(es))
	}
	for i := 1; i <= 2; i++ {
		if err := p.write(0, 8*i, []byte("12345678")); err != nil {
			t.Fatal(err)
		}
	}
	second := wait("behind a wake-up")
	if el := second.Sub(first); el < interval-500*time.Millisecond {
		t.Fatalf("entries behind a wake-up woke after %v, before the interval (%v)", el, interval)
	}
	if es := readAll(t, dm); len(es) != 2 {
		t.Fatalf("%d entries behind the first wake-up", len(es))
	}
	time.Sleep(interval)
	again := time.Now()
	if err := p.write(0, 24, []byte("12345678")); err != nil {
		t.Fatal(err)
	}
	if el := wait("after a quiet interval").Sub(again); el >= interval {
		t.Fatalf("an entry after a quiet interval woke after %v, not at once", el)
	}
	t.Logf("first wake-up after %v, the moderated one %v after it", first.Sub(start), second.Sub(first))
}

// Local transfers from and into active pages (the process's own work
// requests, incoming SENDs) are not remote accesses: untouched, unlogged.
func TestLabLocalNotIntercepted(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 1)
	dm := newDomain(t, d, 1<<16)
	data := pattern(500, 5)
	copy(p.dst.mr.Bytes(), data)
	// Arm the *source's* buffer: W=0 R=0 with logging.
	if err := dm.Arm(p.src.mr.RKey(), p.src.mr.Addr(), page, kmod.WL|kmod.RL|kmod.RLD|kmod.WLD); err != nil {
		t.Fatal(err)
	}
	copy(p.src.mr.Bytes(), pattern(500, 6))
	// The source writes from its armed page and reads into it.
	if err := p.post(verbs.OpWrite, 0, 0, 500, 0, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.dst.mr.Bytes()[:500], pattern(500, 6)) {
		t.Fatal("a local WRITE source on an active page was altered")
	}
	copy(p.dst.mr.Bytes(), data)
	if err := p.post(verbs.OpRead, 0, 0, 500, 0, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.src.mr.Bytes()[:500], data) {
		t.Fatal("a READ landing in a local active page was altered")
	}
	if es := readAll(t, dm); len(es) != 0 {
		t.Fatalf("local transfers logged: %+v", es)
	}
}

// Deregistering an armed region forgets it; misuse is refused.
func TestLabDeregAndMisuse(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 2)
	dm := newDomain(t, d, 1<<16)
	if err := dm.Arm(p.key(), p.addr(0), 2*page, kmod.W); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		key       uint32
		iova, len uint64
		bits      kmod.Bits
		want      error
	}{
		{"unaligned", p.key(), p.addr(1), page, kmod.W, kmod.ErrInvalid},
		{"empty", p.key(), p.addr(0), 0, kmod.W, kmod.ErrInvalid},
		{"bad bits", p.key(), p.addr(0), page, 0x80, kmod.ErrInvalid},
		{"beyond the region", p.key(), p.addr(0), 3 * page, kmod.W, kmod.ErrRange},
		{"no such key", 0xfffff0ff, p.addr(0), page, kmod.W, kmod.ErrNoRegion},
		{"key 0", 0, p.addr(0), page, kmod.W, kmod.ErrInvalid},
	} {
		if err := dm.Arm(c.key, c.iova, c.len, c.bits); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := d.NewDomain(1000); !errors.Is(err, kmod.ErrInvalid) {
		t.Errorf("odd log size: %v", err)
	}
	if err := p.dst.mr.Close(); err != nil {
		t.Fatal(err)
	}
	st, _ := d.Stats()
	for i := 0; i < 50 && (st.MRs != 0 || st.HooksArmed); i++ {
		time.Sleep(20 * time.Millisecond)
		st, _ = d.Stats()
	}
	if st.MRs != 0 || st.Pages != 0 || st.HooksArmed {
		t.Fatalf("after deregistration: %+v", st)
	}
	if err := dm.Disarm(p.key(), p.addr(0), page); !errors.Is(err, kmod.ErrNoRegion) {
		t.Fatalf("Disarm of a deregistered region: %v", err)
	}
}

// Two sources on two CPUs write concurrently into regions armed with the
// same domain: one log, entries from both interleaved but each whole, one
// sequence without gaps, and each source's writes in its order.
func TestLabConcurrentSources(t *testing.T) {
	d := openDev(t)
	ps := []*pair{newPair(t, 4), newPair(t, 4)}
	dm := newDomain(t, d, 1<<22)
	for _, p := range ps {
		if err := dm.Arm(p.key(), p.addr(0), 4*page, kmod.W|kmod.R|kmod.WL|kmod.WLD); err != nil {
			t.Fatal(err)
		}
	}
	const n, size = 1504, 64 // a multiple of the batch of 32
	errs := make(chan error, len(ps))
	for pi, p := range ps {
		go func() {
			for k := 0; k < n; k += 32 {
				for i := k; i < k+32; i++ {
					off := (i * size) % (4 * page)
					copy(p.src.mr.Bytes()[off:], pattern(size, byte(i+pi)))
					wr := verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: verbs.SendSignaled,
						SGL: []verbs.SGE{p.src.mr.SGE(off, size)}, RemoteAddr: p.addr(off), RKey: p.key()}
					if err := p.src.qp.PostSend(wr); err != nil {
						errs <- err
						return
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				wcs := make([]verbs.WC, 32)
				for got := 0; got < 32; {
					m, err := p.src.cq.Wait(ctx, wcs[:32-got])
					if err != nil {
						cancel()
						errs <- err
						return
					}
					for _, wc := range wcs[:m] {
						if err := wc.Err(); err != nil {
							cancel()
							errs <- err
							return
						}
					}
					got += m
				}
				cancel()
			}
			errs <- nil
		}()
	}
	for range ps {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	es := readAll(t, dm)
	if len(es) != 2*n {
		t.Fatalf("%d entries for %d writes", len(es), 2*n)
	}
	next := map[uint32]int{}
	for i, e := range es {
		if e.Seq != uint64(i+1) {
			t.Fatalf("entry %d has seq %d", i, e.Seq)
		}
		pi := -1
		for j, p := range ps {
			if e.QPN == p.dst.qp.QPN() && e.SrcQPN == p.src.qp.QPN() && e.Key == p.key() {
				pi = j
			}
		}
		if pi < 0 {
			t.Fatalf("entry %d from an unknown source: %+v", i, e)
		}
		k := next[e.QPN]
		next[e.QPN]++
		if e.IOVA != ps[pi].addr((k*size)%(4*page)) || !bytes.Equal(e.Data, pattern(size, byte(k+pi))) {
			t.Fatalf("entry %d: source %d's write %d is wrong or out of order", i, pi, k)
		}
	}
	t.Logf("%d entries from 2 concurrent sources, whole and in order", len(es))
}

// A packet across two pages of one domain, only the second of which logs:
// its entry is published at once. A READ that finds its log full is
// served as zeros and counted, never silently unlogged.
func TestLabStraddleAndLostReads(t *testing.T) {
	d := openDev(t)
	p := newPair(t, 3)
	dm := newDomain(t, d, kmod.MinLogSize)
	mem := pattern(3*page, 11)
	copy(p.dst.mr.Bytes(), mem)
	if err := dm.Arm(p.key(), p.addr(0), page, kmod.W|kmod.R); err != nil {
		t.Fatal(err)
	}
	if err := dm.Arm(p.key(), p.addr(page), page, kmod.W|kmod.R|kmod.WL); err != nil {
		t.Fatal(err)
	}
	if err := p.write(0, page-8, []byte("0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
	if es := readAll(t, dm); len(es) != 1 || es[0].IOVA != p.addr(page) || es[0].Length != 8 {
		t.Fatalf("entries %+v", es)
	}

	if err := dm.Arm(p.key(), p.addr(2*page), page, kmod.W|kmod.R|kmod.RL); err != nil {
		t.Fatal(err)
	}
	// Read until a read comes back as zeros: that is the one the full log
	// could not hold. (Usually after 64 reads; an RC retransmission of a
	// READ is served, and logged, again, so it may come earlier.)
	slots := kmod.MinLogSize / kmod.EntryHeader
	var i int
	for i = 0; i <= slots; i++ {
		got, err := p.read(0, 2*page+8*i, 8)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if bytes.Equal(got, make([]byte, 8)) {
			break
		}
		if !bytes.Equal(got, mem[2*page+8*i:2*page+8*i+8]) {
			t.Fatalf("read %d returned other bytes than memory", i)
		}
	}
	if i > slots {
		t.Fatalf("%d reads fitted a log of %d entries", i, slots)
	}
	if _, lost := dm.Refused(); lost < 1 { // more if the READ was retransmitted
		t.Fatalf("ring says %d lost", lost)
	}
	if es := readAll(t, dm); len(es) != slots {
		t.Fatalf("%d entries, want a full log of %d", len(es), slots)
	}
	if got, err := p.read(0, 2*page, 8); err != nil || !bytes.Equal(got, mem[2*page:2*page+8]) {
		t.Fatalf("read after draining: %x %v", got, err)
	}
	if st, _ := d.Stats(); st.LostReads == 0 {
		t.Fatalf("stats %+v", st)
	}
}
