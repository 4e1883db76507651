package main

import (
	"bufio"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// txStatus is what qemu 7.2's info virtio-queue-status prints for a
// transmit queue.
const txStatus = `/machine/peripheral/nic0/virtio-backend:
  device_name:          virtio-net
  queue_index:          1
  inuse:                1
  used_idx:             4660
  signalled_used:       4660
  signalled_used_valid: true
  last_avail_idx:       4661
  shadow_avail_idx:     4670
  VRing:
    num:          256
    num_default:  256
    align:        4096
    desc:         0x0000000003a5c000
    avail:        0x0000000003a5d000
    used:         0x0000000003a5d240
`

func TestRingReads(t *testing.T) {
	out := "(qemu) info virtio-queue-status " + nicPath + " 1\n" + txStatus +
		"(qemu) info virtio-queue-status " + nicPath + " 0\n" + strings.ReplaceAll(txStatus, "0x0000000003a5", "0x0000000004b6")
	want := []string{
		"xp /2hx 0x3a5d000",
		"xp /2hx 0x3a5d240",
		fmt.Sprintf("xp /1hx %#x", 0x3a5d000+4+2*256),
		fmt.Sprintf("xp /1hx %#x", 0x3a5d240+4+8*256),
	}
	if got := ringReads(out); !reflect.DeepEqual(got, want) {
		t.Errorf("ringReads = %q, want %q", got, want)
	}
	if got := ringReads("monitor: no such device\n"); got != nil {
		t.Errorf("ringReads of no status = %q, want none", got)
	}
	if got, want := queueIndices(out), "inuse=1 used_idx=4660 last_avail_idx=4661 shadow_avail_idx=4670"; got != want {
		t.Errorf("queueIndices = %q, want %q", got, want)
	}
	if got := queueIndices(""); got != "unknown" {
		t.Errorf("queueIndices of nothing = %q", got)
	}
}

// TestHMP runs the monitor client against a fake qemu monitor that echoes
// each command with terminal escapes, as qemu's readline does.
func TestHMP(t *testing.T) {
	addr := filepath.Join(t.TempDir(), "mon.sock")
	ln, err := net.Listen("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprint(c, "QEMU 7.2.22 monitor - type 'help' for more information\r\n(qemu) ")
		r := bufio.NewReader(c)
		for {
			cmd, err := r.ReadString('\n')
			if err != nil {
				return
			}
			cmd = strings.TrimSpace(cmd)
			for i := 1; i <= len(cmd); i++ { // the echo, redrawn as readline does
				fmt.Fprintf(c, "%s\x1b[K\x1b[%dD", cmd[:i], i)
			}
			fmt.Fprintf(c, "%s\r\n", cmd)
			switch cmd {
			case "info network":
				fmt.Fprint(c, "hub 0\r\nnet0: index=0,type=stream,unix:/tmp/x/hub.sock\r\n")
			default:
				fmt.Fprintf(c, "unknown command: '%s'\r\n", cmd)
			}
			fmt.Fprint(c, "(qemu) ")
		}
	}()
	got, err := hmp(addr, []string{"info network", "info nothing"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := "(qemu) info network\nhub 0\nnet0: index=0,type=stream,unix:/tmp/x/hub.sock\n" +
		"(qemu) info nothing\nunknown command: 'info nothing'\n"
	if got != want {
		t.Errorf("hmp returned %q, want %q", got, want)
	}

	if _, err := hmp(filepath.Join(t.TempDir(), "none.sock"), []string{"info network"}, time.Second); err == nil {
		t.Error("hmp on no monitor: no error")
	}
}

// TestHubReport checks that the hub names each guest's port by the source
// address of its frames and counts what passed.
func TestHubReport(t *testing.T) {
	h, dir := startHub(t)
	a, b := dialHub(t, dir), dialHub(t, dir)
	waitPorts(t, h, 2)
	frame := make([]byte, 64)
	copy(frame[6:12], []byte{0x52, 0x54, 0, 0x4c, 0x41, 1})
	sendFrame(t, a, frame)
	if _, err := recvFrame(b, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	want := []string{"hub: 1 frames repeated, 0 dropped", "port 52:54:00:4c:41:01: 1 frames in", "0 out", "port (no frame yet): 0 frames in, the last 0s ago; 1 out, 0 queued"}
	var rep string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		rep = h.report(time.Now())
		if containsAll(rep, want) {
			return
		}
	}
	t.Errorf("report %q lacks one of %q", rep, want)
}

func containsAll(s string, subs []string) bool {
	for _, w := range subs {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}
