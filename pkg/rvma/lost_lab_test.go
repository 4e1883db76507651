//go:build lab

package rvma

// Control messages lost on the way (as with a stripe that fails while
// they are in flight): the first RESOLVE, RESOLVED, GET and GETREPLY of a
// loopback endpoint are dropped, and the put and the Get still complete
// with the right bytes because the asking side sends again.
//
// Run: go run ./test/softroce gotest ./pkg/rvma -test.run TestLabLostControl -test.v

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

func TestLabLostControl(t *testing.T) {
	labenv.Device(t)
	ep := guestListen(t, guestPort+7, &EndpointOptions{Stripes: 2})
	self := ep.Addr()

	var mu sync.Mutex
	lost := map[wire.CtrlType]int{}
	ep.loseCtrl = func(m wire.Ctrl) bool {
		mu.Lock()
		defer mu.Unlock()
		switch m.Type {
		case wire.CtrlResolve, wire.CtrlResolved, wire.CtrlGet, wire.CtrlGetReply:
			if lost[m.Type] == 0 {
				lost[m.Type]++
				return true
			}
		}
		return false
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const mb = Mailbox(0x1057)
	w, err := ep.InitWindow(mb, &WindowOptions{Threshold: 4096, Keep: 1})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := ep.Alloc(2 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	p, err := w.Post(ctx, mem[:4096], nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Post(ctx, mem[4096:], nil); err != nil {
		t.Fatal(err)
	}

	data := patterned(4096, 3)
	if err := ep.Put(ctx, self, mb, 0, data); err != nil {
		t.Fatalf("put after a lost RESOLVE and RESOLVED: %v", err)
	}
	rec, err := p.Wait(ctx)
	if err != nil || rec.Len != 4096 || !bytes.Equal(p.Bytes(), data) {
		t.Fatalf("epoch 0: %+v %v", rec, err)
	}
	into := make([]byte, 4096)
	res, err := ep.Get(ctx, self, mb, 0, 0, into)
	if err != nil || res.N != 4096 || !bytes.Equal(into, data) {
		t.Fatalf("get after a lost GET and GETREPLY: %+v %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ty := range []wire.CtrlType{wire.CtrlResolve, wire.CtrlResolved, wire.CtrlGet, wire.CtrlGetReply} {
		if lost[ty] != 1 {
			t.Errorf("%v lost %d times, want 1", ty, lost[ty])
		}
	}
}
