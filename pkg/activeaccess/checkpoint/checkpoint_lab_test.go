//go:build lab

package checkpoint_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/checkpoint"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/internal/aalab"
)

const (
	pages = 32
	page  = aalab.Page
)

// A round: the source's puts (offset, length) and the pages the target
// then writes itself; the next checkpoint must save exactly the union.
type round struct {
	puts  [][2]int
	local []int
	get   int // a page the source reads (reads change nothing)
}

var rounds = []round{
	{puts: [][2]int{{1*page + 100, 64}, {5 * page, 4096}, {9*page + 4000, 96}}, local: []int{5, 20}, get: -1},
	{puts: [][2]int{{2*page + 3000, 5000}}, local: []int{31}, get: 8},
	{get: 8},
	{puts: [][2]int{{7 * page, 10}}, local: []int{7, 0}, get: 6},
}

func (r round) remotePages() []int {
	var ps []int
	for _, p := range r.puts {
		for q := p[0] / page; q <= (p[0]+p[1]-1)/page; q++ {
			ps = append(ps, q)
		}
	}
	return ps
}

func union(a, b []int) int {
	m := map[int]bool{}
	for _, x := range append(slices.Clone(a), b...) {
		m[x] = true
	}
	return len(m)
}

// TestLabCheckpoint: remote puts (from guest 2) and local stores between
// checkpoints; each incremental checkpoint saves exactly the pages
// changed (remote ones found in the log, local ones through soft-dirty
// bits), its size is that of those pages, a page only read is not saved,
// and restoring the chain (also into the target's own memory, after
// wiping it) gives the memory at each checkpoint byte for byte.
func TestLabCheckpoint(t *testing.T) { aalab.ForModes(t, testCheckpoint) }

func testCheckpoint(t *testing.T, mode activeaccess.Mode, b func(string) string) {
	port := 7640 + uint16(mode)
	if !aalab.Server(t) {
		aalab.Await(t, b("ready"))
		s := aalab.Dial(t, port, "checkpoint-src")
		ctx := aalab.Timeout(t, 120*time.Second)
		for k, r := range rounds {
			aalab.Await(t, b(fmt.Sprint("put-", k)))
			for _, p := range r.puts {
				if _, err := s.Put(ctx, p[0], aalab.Pattern(p[0], p[1], byte(10+k))); err != nil {
					t.Fatal(err)
				}
			}
			if r.get >= 0 {
				if err := s.GetWait(ctx, r.get*page, make([]byte, 200)); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			aalab.Signal(t, b(fmt.Sprint("put-done-", k)))
		}
		return
	}

	tg := aalab.Listen(t, port, pages*page, &activeaccess.TargetOptions{Mode: mode})
	mem := tg.Memory()
	copy(mem, aalab.Pattern(0, len(mem), 1))
	ctx := aalab.Timeout(t, 120*time.Second)
	for _, bad := range []struct {
		tg          *activeaccess.Target
		off, length int
		want        error
	}{
		{nil, 0, page, checkpoint.ErrInvalid}, {tg, 1, page, checkpoint.ErrInvalid}, {tg, 0, 0, checkpoint.ErrInvalid},
		{tg, page, pages * page, activeaccess.ErrRange},
	} {
		if _, err := checkpoint.New(bad.tg, bad.off, bad.length, nil); !errors.Is(err, bad.want) {
			t.Fatalf("New(%v, %d, %d): %v; want %v", bad.tg != nil, bad.off, bad.length, err, bad.want)
		}
	}
	tr, err := checkpoint.New(tg, 0, pages*page, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.Restore(ctx, make([]byte, page)); !errors.Is(err, checkpoint.ErrInvalid) {
		t.Fatalf("Restore without images: %v", err)
	}
	defer tr.Close()
	aalab.Signal(t, b("ready"))
	dir := t.TempDir()
	var files []string
	var snaps [][]byte
	take := func() checkpoint.Info {
		t.Helper()
		f := filepath.Join(dir, fmt.Sprintf("ck%d", len(files)+1))
		w, err := os.Create(f)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		info, err := tr.Checkpoint(ctx, w)
		if err != nil {
			t.Fatalf("Checkpoint: %v", err)
		}
		if st, err := os.Stat(f); err != nil || st.Size() != info.Bytes || info.Bytes != checkpoint.ImageSize(info.Pages) {
			t.Fatalf("image %s: %v, info %+v", f, err, info)
		}
		files = append(files, f)
		snaps = append(snaps, slices.Clone(mem))
		return info
	}
	if info := take(); !info.Full || info.Pages != pages || info.Seq != 1 {
		t.Fatalf("first checkpoint: %+v, want a full one of %d pages", info, pages)
	}
	for k, r := range rounds {
		aalab.Signal(t, b(fmt.Sprint("put-", k)))
		aalab.Await(t, b(fmt.Sprint("put-done-", k)))
		for _, p := range r.puts {
			if !bytes.Equal(mem[p[0]:p[0]+p[1]], aalab.Pattern(p[0], p[1], byte(10+k))) {
				t.Fatalf("round %d: put at %d not in memory", k, p[0])
			}
		}
		for _, p := range r.local {
			mem[p*page+123] ^= 0xff // one byte dirties the page
		}
		info := take()
		rp := r.remotePages()
		wantLocal := len(r.local)
		if mode == activeaccess.ModeMediated {
			// The mediated runtime applies puts with the CPU: those
			// pages are dirty locally too.
			wantLocal = union(r.local, rp)
		}
		t.Logf("checkpoint %d: %+v (remote pages %v, local %v)", info.Seq, info, rp, r.local)
		if info.Full || info.Pages != union(rp, r.local) || info.Remote != len(rp) || info.Local != wantLocal {
			t.Fatalf("round %d: checkpoint %+v, want %d pages (%d remote, %d local)", k, info, union(rp, r.local), len(rp), wantLocal)
		}
	}
	open := func(n int) []io.Reader {
		var rs []io.Reader
		for _, f := range files[:n] {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			rs = append(rs, bytes.NewReader(b))
		}
		return rs
	}
	for n := 1; n <= len(files); n++ {
		dst := make([]byte, pages*page)
		info, err := checkpoint.Restore(ctx, dst, open(n)...)
		if err != nil || info.Seq != uint64(n) {
			t.Fatalf("Restore of %d images: %+v, %v", n, info, err)
		}
		if !bytes.Equal(dst, snaps[n-1]) {
			t.Fatalf("Restore of %d images differs from the memory at checkpoint %d", n, n)
		}
	}
	want := slices.Clone(mem)
	clear(mem)
	if _, err := checkpoint.Restore(ctx, mem, open(len(files))...); err != nil || !bytes.Equal(mem, want) {
		t.Fatalf("Restore into the target's memory: %v (equal %v)", err, bytes.Equal(mem, want))
	}
	if err := tr.Err(); err != nil {
		t.Fatal(err)
	}
	if err := tg.Err(); err != nil {
		t.Fatalf("target: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := tr.Checkpoint(ctx, io.Discard); !errors.Is(err, checkpoint.ErrClosed) || !strings.Contains(err.Error(), "checkpoint: checkpoint:") {
		t.Fatalf("Checkpoint after Close: %v, want ErrClosed naming the call", err)
	}
}
