//go:build lab

package rvma_test

import (
	"strings"
	"testing"

	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// TestLabExamples runs the package's examples on the guest's device and
// checks what they printed.
func TestLabExamples(t *testing.T) {
	labenv.Device(t)
	out := labenv.CaptureStdout(t, Example_put)
	t.Logf("Example_put printed:\n%s", out)
	if want := "epoch 0: \"hello world\" in 2 puts\n"; out != want {
		t.Fatalf("Example_put printed %q, want %q", out, want)
	}
	out = labenv.CaptureStdout(t, ExampleWindowOptions_share)
	t.Logf("ExampleWindowOptions_share printed:\n%s", out)
	if want := "epoch 0: \"ping pong!\"\nepoch 1: \"ping pong!\"\nepoch 2: \"ping pong!\"\n"; out != want {
		t.Fatalf("ExampleWindowOptions_share printed %q, want %q", out, want)
	}
	out = labenv.CaptureStdout(t, ExampleNewCollector)
	t.Logf("ExampleNewCollector printed:\n%s", out)
	if !strings.Contains(out, "# TYPE rvma_window_buffers_posted gauge") ||
		!strings.Contains(out, `rvma_window_buffers_posted{endpoint="`+labenv.Addr()+`:7473",mailbox="0x42"} 0`) {
		t.Fatalf("ExampleNewCollector printed no rvma_window_buffers_posted 0 for mailbox 0x42")
	}
}
