//go:build lab

package rvma_test

import (
	"io"
	"os"
	"strings"
	"testing"

	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// capture runs f and returns what it printed on standard output.
func capture(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); done <- b }()
	func() {
		defer func() { os.Stdout = stdout; w.Close() }()
		f()
	}()
	return string(<-done)
}

// TestLabExamples runs the package's examples on the guest's device and
// checks what they printed.
func TestLabExamples(t *testing.T) {
	labenv.Device(t)
	out := capture(t, Example_put)
	t.Logf("Example_put printed:\n%s", out)
	if want := "epoch 0: \"hello world\" in 2 puts\n"; out != want {
		t.Fatalf("Example_put printed %q, want %q", out, want)
	}
	out = capture(t, ExampleNewCollector)
	t.Logf("ExampleNewCollector printed:\n%s", out)
	if !strings.Contains(out, "# TYPE rvma_window_buffers_posted gauge") ||
		!strings.Contains(out, `rvma_window_buffers_posted{endpoint="`+labenv.Addr()+`:7473",mailbox="0x42"} 0`) {
		t.Fatalf("ExampleNewCollector printed no rvma_window_buffers_posted 0 for mailbox 0x42")
	}
}
