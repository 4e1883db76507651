//go:build lab

package jbmt_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
)

// collect waits for and polls n completions.
func collect(t *testing.T, ctx context.Context, s *jbmt.Service, n int) []jbmt.Completion {
	t.Helper()
	var all []jbmt.Completion
	buf := make([]jbmt.Completion, 8)
	for len(all) < n {
		if err := s.Wait(ctx); err != nil {
			t.Fatalf("Wait with %d of %d completions: %v", len(all), n, err)
		}
		k := s.Poll(buf)
		all = append(all, buf[:k]...)
	}
	return all
}

// TestLabTransferAsync (suite jbmt): 8 gets and 8 puts of 512 KiB started
// at once end with one completion each, found by Wait and Poll, each with
// its tag, all its bytes, and its stages' times in order; every byte is
// checked. A bad token's transfer ends with ErrBadToken in its
// completion.
func TestLabTransferAsync(t *testing.T) {
	s := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := self(t, ctx, s)
	const each = 512 << 10
	mem, reg := region(t, s, 16*each, jbmt.Read|jbmt.Write)
	bufs := make([][]byte, 16)
	for i := range bufs {
		data := random(each, uint64(200+i))
		if i%2 == 0 {
			copy(mem[i*each:], data)
			bufs[i] = make([]byte, each)
			if err := p.StartGet(bufs[i], reg.Token(), uint64(i*each), uint64(i)); err != nil {
				t.Fatal(err)
			}
		} else {
			bufs[i] = data
			if err := p.StartPut(bufs[i], reg.Token(), uint64(i*each), uint64(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	seen := map[uint64]bool{}
	for _, c := range collect(t, ctx, s, 16) {
		if c.Err != nil || c.N != each || c.Tag >= 16 || seen[c.Tag] {
			t.Fatalf("completion %+v", c)
		}
		seen[c.Tag] = true
		if !(c.Submitted > 0 && c.Submitted <= c.Started && c.Started <= c.FirstAnswer && c.FirstAnswer <= c.Ended) {
			t.Errorf("completion %d: stages out of order: %+v", c.Tag, c)
		}
		i := int(c.Tag)
		want := random(each, uint64(200+i))
		got := bufs[i]
		if i%2 == 1 {
			got = mem[i*each : (i+1)*each]
		}
		if !bytes.Equal(got, want) {
			t.Errorf("transfer %d: other bytes", i)
		}
	}
	bad := reg.Token()
	bad.Key++
	if err := p.StartGet(make([]byte, 10), bad, 0, 99); err != nil {
		t.Fatal(err)
	}
	if c := collect(t, ctx, s, 1)[0]; c.Tag != 99 || !errors.Is(c.Err, jbmt.ErrBadToken) {
		t.Errorf("a bad token's completion: %+v", c)
	}
	checkUnpinned(t)
}

// TestLabTransferAsyncFullAndClose (suite jbmt): with a ring of 4 entries
// a fifth transfer is refused (ErrBusy) while four are in flight, and
// taken once their completions are polled; closing the Service with
// transfers in flight returns (the module cancels and waits for them)
// and leaves nothing pinned.
func TestLabTransferAsyncFullAndClose(t *testing.T) {
	s, err := jbmt.Open(&jbmt.Options{RingEntries: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := self(t, ctx, s)
	const big = 16 << 20
	_, reg := region(t, s, big, jbmt.Read|jbmt.Write)
	dst := make([][]byte, 5)
	for i := range dst {
		dst[i] = make([]byte, big)
	}
	for i := range 4 {
		if err := p.StartGet(dst[i], reg.Token(), 0, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.StartGet(dst[4], reg.Token(), 0, 4); !errors.Is(err, jbmt.ErrBusy) {
		t.Fatalf("a fifth transfer on a ring of 4: %v, want ErrBusy", err)
	}
	for _, c := range collect(t, ctx, s, 4) {
		if c.Err != nil || c.N != big {
			t.Fatalf("completion %+v", c)
		}
	}
	if err := p.StartGet(dst[4], reg.Token(), 0, 4); err != nil {
		t.Fatalf("a transfer once the ring was polled: %v", err)
	}
	for i := range 3 {
		if err := p.StartGet(dst[i], reg.Token(), 0, uint64(10+i)); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close with 4 transfers of 16 MiB in flight: %v", time.Since(t0).Round(time.Millisecond))
	// nothing lands in the buffers once Close returned
	snap := make([][]byte, len(dst))
	for i := range dst {
		snap[i] = bytes.Clone(dst[i])
	}
	time.Sleep(300 * time.Millisecond)
	for i := range dst {
		if !bytes.Equal(dst[i], snap[i]) {
			t.Errorf("buffer %d changed after Close returned", i)
		}
	}
	if err := s.Wait(ctx); !errors.Is(err, jbmt.ErrClosed) {
		t.Errorf("Wait after Close: %v, want ErrClosed", err)
	}
	checkUnpinned(t)
}
