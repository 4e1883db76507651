package verbs

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestWCStatus(t *testing.T) {
	if got := WCRemAccessErr.Name(); got != "IBV_WC_REM_ACCESS_ERR" {
		t.Fatalf("name %q", got)
	}
	if got := WCRemAccessErr.String(); got != "remote access error" {
		t.Fatalf("msg %q", got)
	}
	wc := WC{ID: 7, Status: WCRemAccessErr, QPN: 17}
	err := wc.Err()
	if !errors.Is(err, WCRemAccessErr) || errors.Is(err, WCRetryExcErr) {
		t.Fatalf("errors.Is on %v", err)
	}
	var we *WCError
	if !errors.As(err, &we) || we.ID != 7 {
		t.Fatalf("errors.As on %v", err)
	}
	if (WC{}).Err() != nil {
		t.Fatal("success has an error")
	}
	if WCStatus(99).Name() != "IBV_WC_STATUS(99)" {
		t.Fatal(WCStatus(99).Name())
	}
}

func TestOpError(t *testing.T) {
	err := opErr("ibv_reg_mr", int(syscall.EOPNOTSUPP))
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("%v", err)
	}
	if errors.Is(opErr("x", int(syscall.EINVAL)), ErrNotSupported) {
		t.Fatal("EINVAL is not ErrNotSupported")
	}
	pe := &PostError{Op: "ibv_post_send", Index: 3, Err: syscall.ENOMEM}
	if !errors.Is(pe, ErrQueueFull) || !errors.Is(pe, syscall.ENOMEM) {
		t.Fatalf("%v", pe)
	}
}

func TestGIDPick(t *testing.T) {
	g4, _ := GIDFromIP(net.ParseIP("10.0.0.2"))
	g6, _ := GIDFromIP(net.ParseIP("fe80::1"))
	entries := []GIDEntry{
		{GID: g6, Index: 0, Port: 1, Type: GIDTypeRoCEv1},
		{GID: g4, Index: 1, Port: 1, Type: GIDTypeRoCEv2},
		{GID: g6, Index: 2, Port: 1, Type: GIDTypeRoCEv2},
	}
	e, err := PickRoCEv2GID(entries, 1, nil)
	if err != nil || e.Index != 1 {
		t.Fatalf("nil ip: %+v %v", e, err)
	}
	e, err = PickRoCEv2GID(entries, 1, net.ParseIP("fe80::1"))
	if err != nil || e.Index != 2 {
		t.Fatalf("v6: %+v %v", e, err)
	}
	if _, err := PickRoCEv2GID(entries, 1, net.ParseIP("10.0.0.3")); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("missing: %v", err)
	}
	if _, err := PickRoCEv2GID(entries, 2, nil); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("port 2: %v", err)
	}
	if g4.String() != "10.0.0.2" {
		t.Fatal(g4.String())
	}
}

func TestMTU(t *testing.T) {
	if MTU1024.Bytes() != 1024 || MTU4096.Bytes() != 4096 || MTU(9).Bytes() != 0 {
		t.Fatal("Bytes")
	}
	if MTUFromBytes(1500) != MTU1024 || MTUFromBytes(100) != 0 || MTUFromBytes(9000) != MTU4096 {
		t.Fatal("MTUFromBytes")
	}
	if LinkGbps(2, 4) != 40 {
		t.Fatal(LinkGbps(2, 4))
	}
}

func TestQPInfoRoundTrip(t *testing.T) {
	g, _ := GIDFromIP(net.ParseIP("192.168.1.9"))
	in := QPInfo{QPN: 0x11, PSN: 0xabcdef, LID: 3, GID: g}
	b, _ := in.MarshalBinary()
	var out QPInfo
	if err := out.UnmarshalBinary(b); err != nil || out != in {
		t.Fatalf("%+v %v", out, err)
	}
	if err := out.UnmarshalBinary(b[:5]); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

func TestAccess(t *testing.T) {
	if s := (AccessLocalWrite | AccessRemoteRead).String(); s != "LOCAL_WRITE|REMOTE_READ" {
		t.Fatal(s)
	}
	if err := checkAccess(AccessRemoteWrite); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if err := checkAccess(AccessAll); err != nil {
		t.Fatal(err)
	}
	if IncRKey(0x12345aff) != 0x12345a00 || IncRKey(0x100) != 0x101 {
		t.Fatal("IncRKey")
	}
}

func TestCheckSend(t *testing.T) {
	c := QPCap{MaxSendWR: 4, MaxSendSGE: 2, MaxInlineData: 16}
	sge8 := []SGE{{Addr: 64, Length: 8, LKey: 1}}
	cases := []struct {
		name string
		wr   SendWR
		typ  QPType
		ok   bool
	}{
		{"send", SendWR{Op: OpSend, SGL: sge8}, QPTypeRC, true},
		{"zero-byte send", SendWR{Op: OpSend}, QPTypeRC, true},
		{"zero-length SGE", SendWR{Op: OpSend, SGL: []SGE{{Addr: 8}}}, QPTypeRC, false},
		{"too many SGEs", SendWR{Op: OpSend, SGL: []SGE{{1, 1, 1}, {2, 1, 1}, {3, 1, 1}}}, QPTypeRC, false},
		{"inline too big", SendWR{Op: OpSend, Flags: SendInline, SGL: []SGE{{1, 17, 1}}}, QPTypeRC, false},
		{"fetch-add", SendWR{Op: OpAtomicFAA, SGL: sge8, RemoteAddr: 8}, QPTypeRC, true},
		{"unaligned atomic", SendWR{Op: OpAtomicFAA, SGL: sge8, RemoteAddr: 12}, QPTypeRC, false},
		{"atomic local unaligned", SendWR{Op: OpAtomicCAS, SGL: []SGE{{Addr: 3, Length: 8, LKey: 1}}}, QPTypeRC, false},
		{"atomic 4 bytes", SendWR{Op: OpAtomicCAS, SGL: []SGE{{Addr: 8, Length: 4, LKey: 1}}}, QPTypeRC, false},
		{"atomic on UC", SendWR{Op: OpAtomicFAA, SGL: sge8}, QPTypeUC, false},
		{"read on UD", SendWR{Op: OpRead, SGL: sge8}, QPTypeUD, false},
		{"UD without AH", SendWR{Op: OpSend, SGL: sge8}, QPTypeUD, false},
		{"UD with AH", SendWR{Op: OpSend, SGL: sge8, AH: &AH{}}, QPTypeUD, true},
		{"bind without MW", SendWR{Op: OpBindMW}, QPTypeRC, false},
		{"bad opcode", SendWR{Op: 42}, QPTypeRC, false},
	}
	for _, tc := range cases {
		err := checkSend(0, &tc.wr, tc.typ, c)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err=%v", tc.name, err)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v does not wrap ErrInvalid", tc.name, err)
		}
	}
}

func TestBuffer(t *testing.T) {
	if _, err := Alloc(0); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	b, err := Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	mem := b.Bytes()
	if len(mem) != 8192 || b.Addr()%4096 != 0 {
		t.Fatal("size/alignment")
	}
	mem[8191] = 1
	if bufferOf(mem[100:200]) != b || bufferOf(mem) != b {
		t.Fatal("bufferOf sub-slice")
	}
	if bufferOf(make([]byte, 10)) != nil {
		t.Fatal("Go heap memory taken for a Buffer")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if b.Bytes() != nil || bufferOf(mem) != nil {
		t.Fatal("closed buffer still reachable")
	}
}

// TestNodeTree checks the parent/child rule on bare nodes.
func TestNodeTree(t *testing.T) {
	var order []string
	var mu sync.Mutex
	mk := func(name string) *node {
		n := &node{}
		n.init(name, func() error { mu.Lock(); order = append(order, name); mu.Unlock(); return nil })
		return n
	}
	ctx, pd, cq, qp, mr := mk("ctx"), mk("pd"), mk("cq"), mk("qp"), mk("mr")
	for _, x := range []struct{ kid, parents []*node }{
		{[]*node{pd}, []*node{ctx}}, {[]*node{cq}, []*node{ctx}},
		{[]*node{mr}, []*node{pd}}, {[]*node{qp}, []*node{pd, cq}},
	} {
		if err := x.kid[0].attach(x.parents...); err != nil {
			t.Fatal(err)
		}
	}
	if err := ctx.close(); err != nil {
		t.Fatal(err)
	}
	want := []string{"qp", "cq", "mr", "pd", "ctx"}
	if len(order) != len(want) {
		t.Fatalf("order %v", order)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order %v, want %v", order, want)
		}
	}
	if err := qp.use("test"); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if err := mk("late").attach(ctx); !errors.Is(err, ErrClosed) {
		t.Fatal("attach to closed parent:", err)
	}
	if ctx.close() != nil || len(order) != 5 {
		t.Fatal("second close destroyed again")
	}
}

func TestNodeConcurrentClose(t *testing.T) {
	for i := 0; i < 100; i++ {
		var count int
		var mu sync.Mutex
		p := &node{}
		p.init("p", func() error { return nil })
		k := &node{}
		k.init("k", func() error { mu.Lock(); count++; mu.Unlock(); return nil })
		k.attach(p)
		var wg sync.WaitGroup
		for j := 0; j < 4; j++ {
			wg.Add(2)
			go func() { defer wg.Done(); p.close() }()
			go func() {
				defer wg.Done()
				if k.use("test") == nil {
					k.unuse()
				}
				k.close()
			}()
		}
		wg.Wait()
		if count != 1 || p.children() != 0 {
			t.Fatalf("destroyed %d times, %d children left", count, p.children())
		}
	}
}

func TestNoDeviceOnHost(t *testing.T) {
	devs, err := Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) > 0 {
		t.Skip("this machine has RDMA devices")
	}
	if _, err := Open(""); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Open on a host without devices: %v", err)
	}
}

func TestAckTimeoutExp(t *testing.T) {
	for _, c := range []struct {
		d  time.Duration
		n  uint8
		ok bool
	}{
		{0, 0, false},
		{-time.Second, 0, false},
		{time.Nanosecond, 1, true},
		{8192 * time.Nanosecond, 1, true},
		{8193 * time.Nanosecond, 2, true},
		{100 * time.Millisecond, 15, true}, // 134 ms
		{134217728 * time.Nanosecond, 15, true},
		{2147483648 * time.Nanosecond, 19, true}, // rdma_cm's RoCE default
		{ackStep << 31, 31, true},
		{ackStep<<31 + 1, 0, false},
	} {
		n, ok := ackTimeoutExp(c.d)
		if n != c.n || ok != c.ok {
			t.Errorf("ackTimeoutExp(%v) = %d, %v; want %d, %v", c.d, n, ok, c.n, c.ok)
		}
	}
}
