//go:build lab

package verbs_test

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// TestExamplesPingPong runs the package's ping-pong example on the guest's
// device and checks what it printed.
func TestExamplesPingPong(t *testing.T) {
	labenv.Device(t)
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
		Example_pingPong()
	}()
	out := <-done
	t.Logf("example printed:\n%s", out)
	if want := "ping\npong 42\n"; !bytes.Equal(out, []byte(want)) {
		t.Fatalf("example printed %q, want %q", out, strings.TrimSpace(want))
	}
}
