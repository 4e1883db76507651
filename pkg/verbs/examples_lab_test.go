//go:build lab

package verbs_test

import (
	"strings"
	"testing"

	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// TestExamplesPingPong runs the package's ping-pong example on the guest's
// device and checks what it printed.
func TestExamplesPingPong(t *testing.T) {
	labenv.Device(t)
	out := labenv.CaptureStdout(t, Example_pingPong)
	t.Logf("example printed:\n%s", out)
	if want := "ping\npong 42\n"; out != want {
		t.Fatalf("example printed %q, want %q", out, strings.TrimSpace(want))
	}
}

// TestExamplesSendPlan runs the send plan example on the guest's device.
func TestExamplesSendPlan(t *testing.T) {
	labenv.Device(t)
	out := labenv.CaptureStdout(t, ExampleSendPlan)
	if want := "1000 999\n"; out != want {
		t.Fatalf("example printed %q, want %q", out, strings.TrimSpace(want))
	}
}

// TestExamplesDial runs the Dial example on the guest (whose address it
// names) and checks what it printed.
func TestExamplesDial(t *testing.T) {
	labenv.Device(t)
	if labenv.Addr() != "10.77.0.1" {
		t.Fatalf("the example listens on 10.77.0.1, the guest is %s", labenv.Addr())
	}
	out := labenv.CaptureStdout(t, ExampleDial)
	if want := "ping\npeer gone\n"; out != want {
		t.Fatalf("example printed %q, want %q", out, strings.TrimSpace(want))
	}
}
