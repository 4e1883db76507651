//go:build lab

package rvma

// The endpoint between guests: guest 1 receives, the others send. It
// proves the semantics of the issue that need real peers: counting
// independent of arrival order (recorded at the receiver over four
// stripes), several senders filling one epoch, stale puts refused without
// touching a buffer already handed over (and retried into the next epoch),
// last-byte polling (variant (c) of the benchmarks) completing early on the
// same traffic,
// a sender killed mid-epoch, a receiver killed under pending puts, and a
// Get of a kept epoch.
//
// Run: go run ./test/softroce gotest -guests 3 ./pkg/rvma -test.run TestLabGuests -test.v

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

const guestPort = 7480

func guestAddr(t *testing.T, i int, port uint16) netip.AddrPort {
	t.Helper()
	a, err := labenv.AddrOf(i)
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(a), port)
}

func guestListen(t *testing.T, port uint16, opts *EndpointOptions) *Endpoint {
	t.Helper()
	idx, _ := labenv.Index()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ep, err := Listen(ctx, guestAddr(t, idx, port), WithLabCounting(opts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	return ep
}

func fillPattern(b []byte, seed int) {
	for i := range b {
		b[i] = byte(seed*37) + byte(i*13) + byte(i>>9)
	}
}

func patterned(n, seed int) []byte { b := make([]byte, n); fillPattern(b, seed); return b }

// The puts of one ordering epoch: large and small alternate, every length
// distinct so that the receiver can tell which put arrived from its length.
// A large put is over 128 packets of 4 KiB, rxe's limit of unacknowledged
// packets per QP, so its stripe stalls for acknowledgements while the next
// stripe's small put goes out: that is what makes arrival order differ on
// rxe (one message's packets are otherwise sent within its post).
func orderSizes() (sizes, offs []int, total int) {
	return putLayout(func(i int) int {
		if i%2 == 0 {
			return 768<<10 + i*8
		}
		return 64 + i*8
	})
}

// The puts of a poll epoch, in offset order: four small ones, three of
// 4 MiB, then a small one holding the buffer's last bytes. The last one
// goes on the stripe of the fourth (small, long done), while the large
// ones still wait on theirs for acknowledgements (rxe keeps at most 128
// packets unacknowledged per QP, and they have 1024 each).
func pollSizes() (sizes, offs []int, total int) {
	return putLayout(func(i int) int {
		if i >= 4 && i < 7 {
			return 4<<20 + i*8
		}
		return 64 + i*8
	})
}

// putLayout lays 8 puts of size(i) bytes end to end in one buffer.
func putLayout(size func(i int) int) (sizes, offs []int, total int) {
	for i := 0; i < 8; i++ {
		sizes = append(sizes, size(i))
		offs = append(offs, total)
		total += sizes[i]
	}
	return
}

// postOrdering posts three buffers of an ordering epoch's size to w.
func postOrdering(t *testing.T, ep *Endpoint, w *Window) []*Posted {
	t.Helper()
	_, _, total := orderSizes()
	arena, err := ep.Alloc(3 * total)
	if err != nil {
		t.Fatal(err)
	}
	var posted []*Posted
	for i := 0; i < 3; i++ {
		p, err := w.Post(context.Background(), arena[i*total:(i+1)*total], nil)
		if err != nil {
			t.Fatal(err)
		}
		posted = append(posted, p)
	}
	return posted
}

// putOrdering issues the puts of epochs ordering epochs to mb, epoch e
// filled from src with pattern seed+e, in issueOrder(e), and returns them
// unwaited.
func putOrdering(ctx context.Context, ep *Endpoint, dst netip.AddrPort, mb Mailbox, src []byte, epochs, seed int) []*PutOp {
	sizes, offs, total := orderSizes()
	var ops []*PutOp
	for e := 0; e < epochs; e++ {
		mem := src[e*total : (e+1)*total]
		fillPattern(mem, seed+e)
		for _, i := range issueOrder(e) {
			ops = append(ops, ep.PutAsync(ctx, dst, mb, uint64(offs[i]), mem[offs[i]:offs[i]+sizes[i]]))
		}
	}
	return ops
}

func issueOrder(epoch int) []int {
	o := make([]int, 8)
	for i := range o {
		o[i] = i
	}
	switch epoch % 3 {
	case 1:
		for i := range o {
			o[i] = 7 - i
		}
	case 2:
		rand.New(rand.NewSource(int64(epoch))).Shuffle(8, func(i, j int) { o[i], o[j] = o[j], o[i] })
	}
	return o
}

const (
	mbOrder  = Mailbox(0x0A)
	mbShared = Mailbox(0x0B)
	mbStale  = Mailbox(0x0C)
	mbDies   = Mailbox(0x0D)
	mbGone   = Mailbox(0x0E)
	mbOpsOrd = Mailbox(0x0F)
	mbPoll   = Mailbox(0x10)
	mbStream = Mailbox(0x11) // the dying receiver's window that puts keep landing in

	streamBuf = 64 << 10 // its one buffer
	streamPut = 4 << 10  // the puts streamed into it

	orderEpochs  = 9
	opsEpochs    = 6 // the same puts into a window that counts operations
	opsSeed      = 50
	pollRounds   = 4 // offset-order epochs watched by a last-byte poller
	pollSeed     = 200
	sharedEpochs = 4
	share        = 8192
)

func TestLabGuests(t *testing.T) {
	labenv.Device(t)
	n, err := labenv.Guests()
	if err != nil || n < 2 {
		t.Fatalf("this test needs at least two guests (have %d)", n)
	}
	idx, _ := labenv.Index()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	// Barriers last for the boot: each counting mode has its own.
	wait := func(name string) {
		t.Helper()
		if err := labenv.Wait(ctx, *countingFlag+"-"+name); err != nil {
			t.Fatal(err)
		}
	}
	signal := func(name string) {
		t.Helper()
		if err := labenv.Signal(*countingFlag + "-" + name); err != nil {
			t.Fatal(err)
		}
	}
	if idx == 1 {
		receiver(t, ctx, n, wait, signal)
	} else {
		sender(t, ctx, idx, n, wait, signal)
	}
}

func receiver(t *testing.T, ctx context.Context, guests int, wait, signal func(string)) {
	ep := guestListen(t, guestPort, &EndpointOptions{Stripes: 4})

	// Ordering: a trace of every DATA arrival for the windows, one that
	// counts bytes and one that counts operations.
	sizes, _, total := orderSizes()
	wo, err := ep.InitWindow(mbOrder, &WindowOptions{Threshold: uint64(total)})
	if err != nil {
		t.Fatal(err)
	}
	wops, err := ep.InitWindow(mbOpsOrd, &WindowOptions{Kind: EpochOps, Threshold: 8})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	arrivals := map[uint32]map[uint16][]int{wo.slot: {}, wops.slot: {}} // slot, generation -> put indexes (from the length), in arrival order
	byLen := map[uint32]int{}
	for i, n := range sizes {
		byLen[uint32(n)] = i
	}
	ep.e.trace = func(imm wire.Imm, n uint32) {
		mu.Lock()
		if a := arrivals[imm.Slot]; a != nil {
			a[imm.Gen] = append(a[imm.Gen], byLen[n])
		}
		mu.Unlock()
	}
	posted, opsPosted := postOrdering(t, ep, wo), postOrdering(t, ep, wops)

	// Several senders, one epoch: each sender's share at its own offset.
	senders := guests - 1
	ws, _ := ep.InitWindow(mbShared, &WindowOptions{Threshold: uint64(senders * share)})
	sharedMem, _ := ep.Alloc(2 * senders * share)
	var sharedPosted []*Posted
	for i := 0; i < 2; i++ {
		p, err := ws.Post(ctx, sharedMem[i*senders*share:(i+1)*senders*share], nil)
		if err != nil {
			t.Fatal(err)
		}
		sharedPosted = append(sharedPosted, p)
	}
	signal("rvma-receiver-ready")

	checkOrder := func(kind string, posted []*Posted, slot uint32, epochs, seed int) {
		for e := 0; e < epochs; e++ {
			p := posted[e%3]
			rec, err := p.Wait(ctx)
			if err != nil {
				t.Fatalf("%s ordering epoch %d: %v\n%s", kind, e, err, labDump(ep))
			}
			if rec.Epoch != uint64(e) || rec.Len != uint64(total) || rec.Ops != 8 {
				t.Fatalf("%s ordering epoch %d: record %+v", kind, e, rec)
			}
			if !bytes.Equal(p.Bytes(), patterned(total, seed+e)) {
				t.Fatalf("%s ordering epoch %d: bytes differ", kind, e)
			}
			p.Release(ctx)
		}
		if ep.Counting() == CountModule {
			// The module counts without telling the library of each
			// put: the arrival order of this same traffic is traced in
			// the suite's library run.
			t.Logf("ordering, %s, counted by the module: %d epochs of 8 puts over 4 stripes complete exactly once with the right bytes", kind, epochs)
			return
		}
		reordered, kendall := 0, 0
		mu.Lock()
		defer mu.Unlock()
		for e := 0; e < epochs; e++ {
			got := arrivals[slot][uint16(e)]
			if len(got) != 8 {
				t.Fatalf("%s ordering epoch %d: %d arrivals traced", kind, e, len(got))
			}
			want := issueOrder(e)
			pos := map[int]int{}
			for i, v := range want {
				pos[v] = i
			}
			d := 0
			for i := 0; i < 8; i++ {
				for j := i + 1; j < 8; j++ {
					if pos[got[i]] > pos[got[j]] {
						d++
					}
				}
			}
			if d > 0 {
				reordered++
				kendall += d
			}
			if e < 3 {
				t.Logf("%s epoch %d: issued %v, arrived %v (Kendall distance %d)", kind, e, want, got, d)
			}
		}
		if reordered == 0 {
			t.Fatalf("%s: no epoch arrived out of issue order over 4 stripes: the test proves nothing", kind)
		}
		t.Logf("ordering, %s: %d epochs of 8 puts over 4 stripes, %d arrived out of issue order (total Kendall distance %d); every epoch complete exactly once with the right bytes",
			kind, epochs, reordered, kendall)
	}
	checkOrder("bytes", posted, wo.slot, orderEpochs, 0)
	checkOrder("operations", opsPosted, wops.slot, opsEpochs, opsSeed)

	for e := 0; e < sharedEpochs; e++ {
		p := sharedPosted[e%2]
		rec, err := p.Wait(ctx)
		if err != nil {
			t.Fatalf("shared epoch %d: %v", e, err)
		}
		if rec.Len != uint64(senders*share) || rec.Ops != uint64(senders) {
			t.Fatalf("shared epoch %d: record %+v", e, rec)
		}
		for s := 0; s < senders; s++ {
			if !bytes.Equal(p.Bytes()[s*share:(s+1)*share], patterned(share, 100+e*16+s)) {
				t.Fatalf("shared epoch %d: sender %d's bytes differ", e, s+2)
			}
		}
		p.Release(ctx)
		signal(fmt.Sprintf("rvma-shared-%d", e))
	}
	t.Logf("%d senders filled %d epochs together: counts and bytes right", senders, sharedEpochs)

	// Variant (c) on striped traffic: the puts of an epoch issued in
	// offset order (pollSizes), and a poller that takes the buffer's last
	// word arriving as the completion, as RDMA programs that poll the last
	// byte do. Over several paths the last put overtakes an earlier, larger
	// one, so the poller sees a buffer still missing bytes; RVMA's record
	// comes when every byte is there.
	_, _, ptotal := pollSizes()
	wp, _ := ep.InitWindow(mbPoll, &WindowOptions{Threshold: uint64(ptotal)})
	pollMem, _ := ep.Alloc(ptotal)
	pp, err := wp.Post(ctx, pollMem, nil)
	if err != nil {
		t.Fatal(err)
	}
	premature := 0
	for r := 0; r < pollRounds; r++ {
		want := patterned(ptotal, pollSeed+r)
		last := (*uint32)(unsafe.Pointer(&pollMem[ptotal-4]))
		lastWant := *(*uint32)(unsafe.Pointer(&want[ptotal-4]))
		seen := make(chan int, 1)
		go func() {
			for i := 0; atomic.LoadUint32(last) != lastWant; i++ {
				if i%4096 == 0 {
					if ctx.Err() != nil {
						seen <- -1
						return
					}
					runtime.Gosched()
				}
			}
			wrong := 0
			for i := range pollMem {
				if pollMem[i] != want[i] {
					wrong++
				}
			}
			seen <- wrong
		}()
		signal(fmt.Sprintf("rvma-poll-%d", r))
		wrong := <-seen
		rec, err := pp.Wait(ctx)
		if err != nil || rec.Len != uint64(ptotal) || rec.Ops != 8 || !bytes.Equal(pollMem, want) {
			t.Fatalf("poll round %d: RVMA's record %+v, %v (bytes right: %v)", r, rec, err, bytes.Equal(pollMem, want))
		}
		t.Logf("poll round %d: the last word arrived with %d of %d bytes still wrong; RVMA's completion came with all of them", r, wrong, ptotal)
		if wrong > 0 {
			premature++
		}
		clear(pollMem)
		pp.Release(ctx)
	}
	if premature == 0 {
		t.Fatalf("last-byte polling never completed early over 4 stripes: the test proves nothing")
	}
	t.Logf("last-byte polling saw the buffer complete early in %d of %d epochs", premature, pollRounds)

	// Stale: epoch 0 completes while the senders' views are kept old.
	wst, _ := ep.InitWindow(mbStale, &WindowOptions{Threshold: 4096, Keep: 2})
	staleMem, _ := ep.Alloc(3 * 4096)
	var stalePosted []*Posted
	for i := 0; i < 3; i++ {
		p, _ := wst.Post(ctx, staleMem[i*4096:(i+1)*4096], nil)
		stalePosted = append(stalePosted, p)
	}
	signal("rvma-stale-ready")
	wait("rvma-stale-resolved") // guest 2 resolved the window (1 byte in epoch 0)
	ep.holdNotices.Store(true)
	signal("rvma-stale-hold")
	rec0, err := stalePosted[0].Wait(ctx) // guest 2 completes epoch 0
	if err != nil || rec0.Len != 4096 {
		t.Fatalf("stale epoch 0: %+v %v", rec0, err)
	}
	handed := bytes.Clone(stalePosted[0].Bytes())
	// Refusals: the library counts receive WQEs completed with a remote
	// access error; the module counts the packets it refuses, per window.
	refusals := func() uint64 { return ep.e.prog.refused.Load() + wst.Stats().Stale }
	refused := refusals()
	signal("rvma-stale-completed")
	wait("rvma-stale-put") // a put with epoch 0's key was refused (no retry)
	// ... and one with retry landed in epoch 1.
	rec1, err := stalePosted[1].Wait(ctx)
	if err != nil {
		t.Fatalf("stale epoch 1: %v", err)
	}
	ep.holdNotices.Store(false)
	if !bytes.Equal(stalePosted[0].Bytes(), handed) {
		t.Fatal("a stale put changed a buffer already handed over")
	}
	for end := time.Now().Add(5 * time.Second); refusals()-refused < 2 && time.Now().Before(end); {
		time.Sleep(time.Millisecond) // a sender's knock may still be on its way
	}
	if got := refusals() - refused; got < 2 {
		t.Fatalf("receiver counted %d refused writes, want 2", got)
	}
	if rec1.Len != 4096 || !bytes.Equal(stalePosted[1].Bytes(), patterned(4096, 77)) {
		t.Fatalf("epoch 1 after the retried stale put: %+v", rec1)
	}
	t.Logf("stale puts: refused by the NIC, the handed-over buffer unchanged, %d refusals counted, the retried put landed in epoch 1; endpoint %+v",
		refusals()-refused, ep.Stats())

	// A sender killed mid-epoch: the receiver takes the partial buffer
	// with IncEpoch.
	wd, _ := ep.InitWindow(mbDies, &WindowOptions{Threshold: 8192})
	dieMem, _ := ep.Alloc(8192)
	pd, _ := wd.Post(ctx, dieMem, nil)
	failures := ep.Stats().LinkFailures
	signal("rvma-dies-ready")
	wait("rvma-dies-gone")
	for ep.Stats().LinkFailures == failures {
		select {
		case <-ctx.Done():
			t.Fatal("the receiver never saw the sender's link fail")
		case <-time.After(10 * time.Millisecond):
		}
	}
	rec, err := wd.IncEpoch(ctx)
	if err != nil || rec.Len != 3000 || rec.Flags&FlagPartial == 0 || !bytes.Equal(dieMem[:3000], patterned(3000, 5)) {
		t.Fatalf("partial epoch of a sender that was killed: %+v %v", rec, err)
	}
	if r, ok := pd.Load(); !ok || r != rec {
		t.Fatalf("completion pointer %+v", r)
	}
	t.Logf("sender killed mid-epoch (SIGKILL): link loss seen, IncEpoch handed over %d bytes (partial)", rec.Len)

	// A receiver that dies: a child process with an endpoint and a window
	// without buffers; the sender's put waits for a buffer, then the child
	// is killed (SIGKILL: no Close, the kernel tears its verbs down).
	child := startChild(t, ctx, "TestLabChildReceiver", "RVMA_CHILD_RECEIVER", "child-ready")
	signal("rvma-gone-ready")
	wait("rvma-gone-waiting")
	child.Process.Kill()
	child.Wait()
	wait("rvma-done")
}

// startChild runs test name of this binary as a child process with
// env=1 set, and returns once the child printed the line ready.
func startChild(t *testing.T, ctx context.Context, name, env, ready string) *exec.Cmd {
	t.Helper()
	child := exec.CommandContext(ctx, os.Args[0], "-test.run", "^"+name+"$", "-test.v")
	child.Env = append(os.Environ(), env+"=1")
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != ready {
	}
	return child
}

// TestLabChildReceiver is the receiver TestLabGuests kills; it runs only
// as that child.
func TestLabChildReceiver(t *testing.T) {
	if os.Getenv("RVMA_CHILD_RECEIVER") != "1" {
		return
	}
	ep := guestListen(t, guestPort+2, nil)
	if _, err := ep.InitWindow(mbGone, &WindowOptions{}); err != nil {
		t.Fatal(err)
	}
	// A window whose one buffer never completes (a threshold of puts far
	// beyond the test's), so the sender's puts keep landing in it until
	// this process dies.
	w, err := ep.InitWindow(mbStream, &WindowOptions{Kind: EpochOps, Threshold: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := ep.Alloc(streamBuf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Post(context.Background(), mem, nil); err != nil {
		t.Fatal(err)
	}
	fmt.Println("child-ready")
	select {}
}

// TestLabChildSender is the sender TestLabGuests kills mid-epoch; it runs
// only as that child.
func TestLabChildSender(t *testing.T) {
	if os.Getenv("RVMA_CHILD_SENDER") != "1" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ep := guestListen(t, guestPort+4, nil)
	if err := ep.Put(ctx, guestAddr(t, 1, guestPort), mbDies, 0, patterned(3000, 5)); err != nil {
		t.Fatal(err)
	}
	fmt.Println("child-put-done")
	select {}
}

func sender(t *testing.T, ctx context.Context, idx, guests int, wait, signal func(string)) {
	ep := guestListen(t, guestPort, &EndpointOptions{Stripes: 4})
	dst := guestAddr(t, 1, guestPort)
	wait("rvma-receiver-ready")

	if idx == 2 {
		_, _, total := orderSizes()
		src, _ := ep.Alloc(orderEpochs * total)
		order := func(mb Mailbox, epochs, seed int) {
			for i, op := range putOrdering(ctx, ep, dst, mb, src, epochs, seed) {
				if err := op.Wait(ctx); err != nil {
					t.Fatalf("ordering put %d to %v: %v\n%s", i, mb, err, labDump(ep))
				}
			}
		}
		order(mbOrder, orderEpochs, 0)
		order(mbOpsOrd, opsEpochs, opsSeed)
	}

	for e := 0; e < sharedEpochs; e++ {
		s := idx - 2
		if err := ep.Put(ctx, dst, mbShared, uint64(s*share), patterned(share, 100+e*16+s)); err != nil {
			t.Fatalf("shared epoch %d: %v", e, err)
		}
		wait(fmt.Sprintf("rvma-shared-%d", e))
	}
	if idx == 2 {
		sizes, offs, total := pollSizes()
		src, _ := ep.Alloc(total)
		for r := 0; r < pollRounds; r++ {
			wait(fmt.Sprintf("rvma-poll-%d", r))
			fillPattern(src, pollSeed+r)
			var ops []*PutOp
			for i := range sizes { // offset order: the last byte goes last
				ops = append(ops, ep.PutAsync(ctx, dst, mbPoll, uint64(offs[i]), src[offs[i]:offs[i]+sizes[i]]))
			}
			for i, op := range ops {
				if err := op.Wait(ctx); err != nil {
					t.Fatalf("poll round %d, put %d: %v", r, i, err)
				}
			}
		}
	}
	if idx != 2 {
		wait("rvma-done")
		return
	}

	// Stale, from two more endpoints of this guest: one that fails stale
	// puts, one that retries them.
	strict := guestListen(t, guestPort+1, &EndpointOptions{Stripes: 2, NoRetryStale: true})
	retry := guestListen(t, guestPort+3, &EndpointOptions{Stripes: 2})
	wait("rvma-stale-ready")
	if err := strict.Put(ctx, dst, mbStale, 4095, []byte{1}); err != nil { // resolves; 1 byte into epoch 0
		t.Fatal(err)
	}
	if err := retry.Put(ctx, dst, mbStale, 4094, []byte{2}); err != nil { // resolves; 1 byte into epoch 0
		t.Fatal(err)
	}
	signal("rvma-stale-resolved")
	wait("rvma-stale-hold")
	if err := ep.Put(ctx, dst, mbStale, 0, make([]byte, 4094)); err != nil { // completes epoch 0
		t.Fatal(err)
	}
	wait("rvma-stale-completed")
	err := strict.Put(ctx, dst, mbStale, 0, []byte("stale"))
	var pe *PutError
	if !errors.Is(err, ErrStale) || !errors.As(err, &pe) || pe.Epoch != 0 {
		t.Fatalf("stale put without retry: %v", err)
	}
	t.Logf("stale put without retry: %v", err)
	if err := retry.Put(ctx, dst, mbStale, 0, patterned(4096, 77)); err != nil {
		t.Fatalf("stale put with retry: %v", err)
	}
	if s := retry.Stats(); s.StalePuts != 1 {
		t.Fatalf("retrying endpoint: %+v", s)
	}
	signal("rvma-stale-put")

	// Get between guests: the receiver keeps epoch 1 (the retried put's
	// bytes) in its ring; read it back.
	into := make([]byte, 8192)
	for {
		res, err := ep.Get(ctx, dst, mbStale, 1, 0, into)
		if errors.Is(err, ErrNoBuffer) { // not handed over yet
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil || res.Epoch != 1 || res.N != 4096 || !bytes.Equal(into[:4096], patterned(4096, 77)) {
			t.Fatalf("get of epoch 1 between guests: %+v %v", res, err)
		}
		break
	}
	if _, err := ep.Get(ctx, dst, mbStale, 2, 0, into); !errors.Is(err, ErrNoBuffer) {
		t.Fatalf("get of an epoch not completed: %v", err)
	}
	t.Logf("get of a kept epoch between guests: 4096 bytes right")

	// Die mid-epoch: a child process puts 3000 of 8192 bytes and is
	// killed with SIGKILL (no Close: the kernel tears its verbs down).
	wait("rvma-dies-ready")
	child := startChild(t, ctx, "TestLabChildSender", "RVMA_CHILD_SENDER", "child-put-done")
	child.Process.Kill()
	child.Wait()
	signal("rvma-dies-gone")

	// The receiver dies while a put waits for a buffer, and while puts
	// stream into another of its windows: every put ends, landed or
	// failed with ErrPeerGone, and none hangs.
	wait("rvma-gone-ready")
	gone := guestAddr(t, 1, guestPort+2)
	op := ep.PutAsync(ctx, gone, mbGone, 0, []byte("nobody"))
	landed, failed := streamUntilGone(t, ctx, ep, gone, signal)
	t.Logf("puts streaming to a receiver that died: %d landed, then %d failed with ErrPeerGone, none hung", landed, failed)
	start := time.Now()
	if err := op.Wait(ctx); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("put to a receiver that died: %v", err)
	} else {
		t.Logf("put to a receiver that died failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
	signal("rvma-done")
}

// streamUntilGone puts streamPut bytes at a time into mbStream at dst,
// with up to 16 puts in flight, and signals rvma-gone-waiting once 32 have
// landed, so the receiver is killed while puts are on the wire. It stops
// issuing at the first failure, waits for every put issued (ctx bounds the
// wait: none may hang) and fails the test unless each landed or failed with
// ErrPeerGone and at least one failed. It returns how many landed and failed.
func streamUntilGone(t *testing.T, ctx context.Context, ep *Endpoint, dst netip.AddrPort, signal func(string)) (landed, failed int) {
	t.Helper()
	src, err := ep.Alloc(streamPut)
	if err != nil {
		t.Fatal(err)
	}
	fillPattern(src, 300)
	end := func(op *PutOp) {
		switch err := op.Wait(ctx); {
		case err == nil:
			if landed++; landed == 32 {
				signal("rvma-gone-waiting")
			}
		case errors.Is(err, ErrPeerGone):
			failed++
		default:
			t.Fatalf("put streaming to a receiver that died: %v (%d landed before)\n%s", err, landed, labDump(ep))
		}
	}
	var ops []*PutOp
	for i := 0; ; i++ {
		if len(ops) == 16 {
			if end(ops[0]); failed > 0 {
				break
			}
			ops = ops[1:]
		}
		off := uint64(i%(streamBuf/streamPut)) * streamPut
		ops = append(ops, ep.PutAsync(ctx, dst, mbStream, off, src))
	}
	ops = ops[1:] // the failed one, ended above
	for _, op := range ops {
		end(op)
	}
	if landed < 32 {
		t.Fatalf("puts streaming to a receiver that died: only %d landed before %d failed", landed, failed)
	}
	return landed, failed
}
