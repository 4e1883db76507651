//go:build lab

package counter_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/counter"
	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/internal/aalab"
)

const (
	pages    = 16
	page     = aalab.Page
	straddle = 13*page + 2500 // a 3000-byte put and get across pages 13 and 14
	strLen   = 3000
)

// plan is how many small accesses source s (0 or 1) makes to page p;
// every page gets a different mix, some none.
func plan(s, p int) (puts, gets int) { return (p*3 + s) % 5, (p + 2*s) % 4 }

// TestLabCounter: two sources on guest 2 make known numbers of active puts
// and gets (64 bytes, each inside one page and one packet) to known pages;
// the counts at the target are exact, per page and per kind, and so are
// the bytes of a larger access across a page boundary. In the transparent
// mode plain RDMA WRITEs and READs are counted too (the module sees every
// access); in the mediated mode they bypass the log and are not.
func TestLabCounter(t *testing.T) { aalab.ForModes(t, testCounter) }

func testCounter(t *testing.T, mode activeaccess.Mode, b func(string) string) {
	port := 7620 + uint16(mode)
	const plainPage, plainN = 15, 7 // plain puts and gets, 100 bytes each
	if aalab.Server(t) {
		tg := aalab.Listen(t, port, pages*page, &activeaccess.TargetOptions{LogSize: 1 << 18, Mode: mode})
		for _, bad := range []struct {
			tg          *activeaccess.Target
			off, length int
			want        error
		}{
			{nil, 0, page, activeaccess.ErrInvalid}, {tg, 1, page, activeaccess.ErrInvalid}, {tg, 0, 100, activeaccess.ErrInvalid},
			{tg, -page, page, activeaccess.ErrInvalid}, {tg, 0, 0, activeaccess.ErrInvalid}, {tg, page, pages * page, activeaccess.ErrRange},
		} {
			if c, err := counter.New(bad.tg, bad.off, bad.length, nil); !errors.Is(err, bad.want) {
				t.Fatalf("New(%v, %d, %d): %v, %v; want %v", bad.tg != nil, bad.off, bad.length, c, err, bad.want)
			}
		}
		c, err := counter.New(tg, 0, pages*page, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		defer aalab.Signal(t, b("checked"))
		aalab.Signal(t, b("ready"))
		aalab.Await(t, b("done"))

		all := c.All()
		for p := 0; p < pages; p++ {
			var want counter.Counts
			for s := 0; s < 2; s++ {
				np, ng := plan(s, p)
				want = want.Add(counter.Counts{Puts: uint64(np), Gets: uint64(ng), PutBytes: uint64(64 * np), GetBytes: uint64(64 * ng)})
			}
			got := all[p]
			switch p {
			case 13, 14: // the straddling access: bytes exact, one entry per packet and page at least
				n := uint64(page - straddle%page)
				if p == 14 {
					n = strLen - n
				}
				if got.Puts < want.Puts+1 || got.Gets < want.Gets+1 {
					t.Errorf("page %d: %+v, want at least %d puts and %d gets", p, got, want.Puts+1, want.Gets+1)
				}
				want.PutBytes += n
				want.GetBytes += n
				got.Puts, got.Gets, want.Puts, want.Gets = 0, 0, 0, 0
			case plainPage:
				if mode == activeaccess.ModeTransparent {
					want = want.Add(counter.Counts{Puts: plainN, Gets: plainN, PutBytes: 100 * plainN, GetBytes: 100 * plainN})
				}
			}
			if got != want {
				t.Errorf("page %d: counted %+v, want %+v", p, got, want)
			}
			if q, err := c.Page(p*page + 17); err != nil || q != all[p] {
				t.Errorf("Page(%d): %+v, %v", p*page+17, q, err)
			}
		}
		if _, err := c.Page(pages * page); !errors.Is(err, activeaccess.ErrRange) {
			t.Errorf("Page past the range: %v", err)
		}
		if !bytes.Equal(tg.Memory()[straddle:straddle+strLen], aalab.Pattern(straddle, strLen, 9)) {
			t.Error("the straddling put is not in memory (W=1)")
		}
		if err := c.Err(); err != nil {
			t.Fatal(err)
		}
		if err := tg.Err(); err != nil {
			t.Fatalf("target: %v", err)
		}
		tot := c.Total()
		t.Logf("%v: %d entries processed; total %+v", mode, c.Processed(), tot)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if c.Total() != tot {
			t.Error("counts changed by Close")
		}
		return
	}

	aalab.Await(t, b("ready"))
	defer aalab.Signal(t, b("done"))
	ctx := aalab.Timeout(t, 120*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for s := 0; s < 2; s++ {
		src := aalab.Dial(t, port, fmt.Sprintf("counter-%d", s))
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- access(ctx, src, s)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	src := aalab.Dial(t, port, "counter-big")
	if err := src.PutWait(ctx, straddle, aalab.Pattern(straddle, strLen, 9)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, strLen)
	if err := src.GetWait(ctx, straddle, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, aalab.Pattern(straddle, strLen, 9)) {
		t.Fatal("the straddling get read other bytes than were put")
	}
	for i := 0; i < plainN; i++ {
		if _, err := src.PutPlain(ctx, plainPage*page+i*100, make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		if _, err := src.GetPlain(ctx, plainPage*page+i*100, make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.FlushPlain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := src.Flush(ctx); err != nil { // the plain accesses' entries were processed too
		t.Fatal(err)
	}
}

// access makes source s's planned puts and gets, interleaved across
// pages, then flushes them.
func access(ctx context.Context, src *activeaccess.Source, s int) error {
	for round := 0; round < 5; round++ {
		for p := 0; p < pages; p++ {
			np, ng := plan(s, p)
			off := p*page + (round*2+s)*64
			if round < np {
				if _, err := src.Put(ctx, off, aalab.Pattern(off, 64, byte(s))); err != nil {
					return fmt.Errorf("source %d: put to page %d: %w", s, p, err)
				}
			}
			if round < ng {
				if _, err := src.Get(ctx, off+1024, make([]byte, 64)); err != nil {
					return fmt.Errorf("source %d: get from page %d: %w", s, p, err)
				}
			}
		}
	}
	if err := src.Flush(ctx); err != nil {
		return fmt.Errorf("source %d: flush: %w", s, err)
	}
	return nil
}
