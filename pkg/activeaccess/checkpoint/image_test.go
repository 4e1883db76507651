package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func region(pages int, seed byte) []byte {
	b := make([]byte, pages*Page)
	for i := range b {
		b[i] = seed ^ byte(i*7+i/251)
	}
	return b
}

func img(t *testing.T, info Info, mem []byte, idx []int) []byte {
	t.Helper()
	var buf bytes.Buffer
	info.Pages = len(idx)
	n, err := writeImage(context.Background(), &buf, info, mem, idx)
	if err != nil || n != int64(buf.Len()) || n != ImageSize(len(idx)) {
		t.Fatalf("writeImage: %d bytes, buffer %d, %v", n, buf.Len(), err)
	}
	return buf.Bytes()
}

func TestRestoreChain(t *testing.T) {
	const n = 8
	v1 := region(n, 1)
	full := img(t, Info{Seq: 1, Off: 4 * Page, Length: n * Page, Full: true}, v1, []int{0, 1, 2, 3, 4, 5, 6, 7})
	v2 := append([]byte(nil), v1...)
	copy(v2[2*Page:3*Page], region(1, 2))
	copy(v2[7*Page:8*Page], region(1, 3))
	inc := img(t, Info{Seq: 2, Off: 4 * Page, Length: n * Page}, v2, []int{2, 7})
	empty := img(t, Info{Seq: 3, Off: 4 * Page, Length: n * Page}, v2, nil)

	dst := make([]byte, n*Page)
	info, err := Restore(context.Background(), dst, bytes.NewReader(full), bytes.NewReader(inc), bytes.NewReader(empty))
	if err != nil || !bytes.Equal(dst, v2) {
		t.Fatalf("Restore: %v (equal %v)", err, bytes.Equal(dst, v2))
	}
	if info.Seq != 3 || info.Pages != 0 || info.Off != 4*Page || info.Length != n*Page || info.Bytes != ImageSize(0) {
		t.Fatalf("info %+v", info)
	}
	if _, err := Restore(context.Background(), dst, bytes.NewReader(full)); err != nil || !bytes.Equal(dst, v1) {
		t.Fatalf("Restore of the full image alone: %v", err)
	}
}

// Every damaged or misordered input is refused with its error and leaves
// the destination untouched.
func TestRestoreRefuses(t *testing.T) {
	const n = 4
	v := region(n, 5)
	full := img(t, Info{Seq: 1, Length: n * Page, Full: true}, v, []int{0, 1, 2, 3})
	inc2 := img(t, Info{Seq: 2, Length: n * Page}, v, []int{1})
	inc3 := img(t, Info{Seq: 3, Length: n * Page}, v, []int{3})
	other := img(t, Info{Seq: 2, Off: Page, Length: n * Page}, v, []int{1})
	flip := func(b []byte, i int) []byte { c := append([]byte(nil), b...); c[i] ^= 0x40; return c }
	cases := []struct {
		name string
		imgs [][]byte
		size int
		want error
	}{
		{"none", nil, n * Page, ErrInvalid},
		{"empty input", [][]byte{{}}, n * Page, ErrCorrupt},
		{"truncated header", [][]byte{full[:20]}, n * Page, ErrCorrupt},
		{"truncated page", [][]byte{full[:headerSize+100]}, n * Page, ErrCorrupt},
		{"no checksum", [][]byte{full[:len(full)-4]}, n * Page, ErrCorrupt},
		{"bad magic", [][]byte{flip(full, 0)}, n * Page, ErrCorrupt},
		{"flipped data byte", [][]byte{flip(full, headerSize+4+1000)}, n * Page, ErrCorrupt},
		{"flipped checksum", [][]byte{flip(full, len(full)-1)}, n * Page, ErrCorrupt},
		{"huge length", [][]byte{flip(full, 31)}, n * Page, ErrCorrupt},
		{"unknown flag", [][]byte{flip(full, 37)}, n * Page, ErrCorrupt},
		{"page index out of range", [][]byte{flip(full, headerSize+2)}, n * Page, ErrCorrupt},
		{"incremental first", [][]byte{inc2}, n * Page, ErrSequence},
		{"gap", [][]byte{full, inc3}, n * Page, ErrSequence},
		{"repeat", [][]byte{full, inc2, inc2}, n * Page, ErrSequence},
		{"other range", [][]byte{full, other}, n * Page, ErrSequence},
		{"small destination", [][]byte{full}, (n - 1) * Page, ErrCorrupt},
		{"large destination", [][]byte{full}, (n + 1) * Page, ErrInvalid},
		{"good then corrupt", [][]byte{full, flip(inc2, 50)}, n * Page, ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst := bytes.Repeat([]byte{0xAB}, c.size)
			rs := make([]io.Reader, len(c.imgs))
			for i, b := range c.imgs {
				rs[i] = bytes.NewReader(b)
			}
			_, err := Restore(context.Background(), dst, rs...)
			if !errors.Is(err, c.want) {
				t.Fatalf("Restore: %v, want %v", err, c.want)
			}
			if !bytes.Equal(dst, bytes.Repeat([]byte{0xAB}, c.size)) {
				t.Fatal("the destination changed")
			}
		})
	}
}

type failWriter struct{ left int }

func (f *failWriter) Write(b []byte) (int, error) {
	if len(b) > f.left {
		n := f.left
		f.left = 0
		return n, io.ErrShortWrite
	}
	f.left -= len(b)
	return len(b), nil
}

func TestWriteImageFails(t *testing.T) {
	v := region(2, 1)
	for _, left := range []int{0, 10, headerSize + 4 + 100, int(ImageSize(2)) - 2} {
		_, err := writeImage(context.Background(), &failWriter{left: left}, Info{Seq: 1, Length: 2 * Page, Full: true}, v, []int{0, 1})
		if !errors.Is(err, io.ErrShortWrite) {
			t.Fatalf("writer failing after %d bytes: %v", left, err)
		}
	}
}

// A call whose context is already done returns its error before doing
// anything: Restore reads no image (these readers would fail the test),
// Checkpoint touches neither the soft-dirty bits nor its writer (this
// Tracker has no target: any work would crash).
func TestDoneContext(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, c := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		if _, err := Restore(c.ctx, make([]byte, Page), failReader{t}); !errors.Is(err, c.want) || !strings.Contains(err.Error(), "checkpoint: restore:") {
			t.Errorf("Restore: %v, want %v naming the call", err, c.want)
		}
		if _, err := Restore(c.ctx, nil); !errors.Is(err, c.want) || errors.Is(err, ErrInvalid) {
			t.Errorf("Restore without images: %v, want %v before the arguments", err, c.want)
		}
		if _, err := (&Tracker{}).Checkpoint(c.ctx, failWriterT{t}); !errors.Is(err, c.want) || !strings.Contains(err.Error(), "checkpoint: checkpoint:") {
			t.Errorf("Checkpoint: %v, want %v naming the call", err, c.want)
		}
	}
}

// A context that ends while an image is written stops the write between
// pages with the context's error.
func TestContextEndsWhileWriting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	v := region(4, 1)
	w := &cancelWriter{cancel: cancel}
	_, err := writeImage(ctx, w, Info{Seq: 1, Length: 4 * Page, Full: true}, v, []int{0, 1, 2, 3})
	if !errors.Is(err, context.Canceled) || w.n >= int64(ImageSize(4)) {
		t.Fatalf("writeImage: %v after %d bytes", err, w.n)
	}
}

// After Close, Checkpoint fails with ErrClosed naming the call, and a
// second Close returns nil.
func TestClosed(t *testing.T) {
	tr := &Tracker{done: true}
	if _, err := tr.Checkpoint(context.Background(), failWriterT{t}); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "checkpoint: checkpoint:") {
		t.Errorf("Checkpoint after Close: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

type failReader struct{ t *testing.T }

func (r failReader) Read([]byte) (int, error) {
	r.t.Error("read with a done context")
	return 0, io.EOF
}

type failWriterT struct{ t *testing.T }

func (w failWriterT) Write([]byte) (int, error) {
	w.t.Error("write with a done context")
	return 0, io.ErrShortWrite
}

// cancelWriter cancels its context once the first page was written.
type cancelWriter struct {
	n      int64
	cancel context.CancelFunc
}

func (w *cancelWriter) Write(b []byte) (int, error) {
	w.n += int64(len(b))
	if w.n > Page {
		w.cancel()
	}
	return len(b), nil
}
