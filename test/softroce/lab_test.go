package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// startHub starts a hub in a fresh directory, closed when the test ends.
func startHub(t *testing.T) (*hub, string) {
	t.Helper()
	dir := t.TempDir()
	h, err := newHub(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h, dir
}

// dialHub connects a fake qemu NIC to the hub.
func dialHub(t *testing.T, dir string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", hubAddr(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func sendFrame(t *testing.T, c net.Conn, payload []byte) {
	t.Helper()
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(payload)))
	if _, err := c.Write(append(hdr[:], payload...)); err != nil {
		t.Fatal(err)
	}
}

func recvFrame(c net.Conn, wait time.Duration) ([]byte, error) {
	c.SetReadDeadline(time.Now().Add(wait))
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return nil, err
	}
	buf := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	_, err := io.ReadFull(c, buf)
	return buf, err
}

func TestHubRepeatsToOthersOnly(t *testing.T) {
	h, dir := startHub(t)
	g := []net.Conn{dialHub(t, dir), dialHub(t, dir), dialHub(t, dir)}
	waitPorts(t, h, 3)
	frame := []byte("an ethernet frame from guest 1")
	for i := 0; i < 100; i++ {
		sendFrame(t, g[0], frame)
	}
	for _, i := range []int{1, 2} {
		for n := 0; n < 100; n++ {
			got, err := recvFrame(g[i], 5*time.Second)
			if err != nil || !bytes.Equal(got, frame) {
				t.Fatalf("guest %d frame %d: %q, %v", i+1, n, got, err)
			}
		}
	}
	if got, err := recvFrame(g[0], 200*time.Millisecond); err == nil {
		t.Fatalf("the sender got its own frame back: %q", got)
	}
	if h.frames.Load() != 100 || h.dropped.Load() != 0 {
		t.Errorf("frames %d dropped %d", h.frames.Load(), h.dropped.Load())
	}
}

// A guest that reads nothing loses frames (counted) but does not hold up
// the others.
func TestHubSlowGuestDoesNotBlockOthers(t *testing.T) {
	h, dir := startHub(t)
	src, fast, _ := dialHub(t, dir), dialHub(t, dir), dialHub(t, dir) // the third never reads
	waitPorts(t, h, 3)
	frame := bytes.Repeat([]byte{0xab}, 1500)
	const n = 3 * hubQueue
	go func() {
		for i := 0; i < n; i++ {
			sendFrame(t, src, frame)
		}
	}()
	// With one queue per guest the fast guest keeps receiving although the
	// third never reads; with a shared hub it would stall after a few
	// hundred frames. (It may lose some of its own when it falls behind.)
	got := 0
	for ; got < n; got++ {
		if _, err := recvFrame(fast, 2*time.Second); err != nil {
			break
		}
	}
	if got < n/2 {
		t.Errorf("fast guest got only %d of %d frames", got, n)
	}
	if h.dropped.Load() == 0 {
		t.Error("no frame counted as dropped for the guest that never reads")
	}
}

func TestHubRejectsBadFraming(t *testing.T) {
	h, dir := startHub(t)
	bad, good := dialHub(t, dir), dialHub(t, dir)
	waitPorts(t, h, 2)
	bad.Write([]byte{0xff, 0xff, 0xff, 0xff}) // a 4 GiB frame
	waitPorts(t, h, 1)
	sendFrame(t, good, []byte("still works"))
	for i := 0; h.frames.Load() != 1; i++ {
		if i == 500 {
			t.Fatalf("frames = %d, want 1", h.frames.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitPorts(t *testing.T, h *hub, n int) {
	t.Helper()
	for i := 0; i < 500; i++ {
		h.mu.Lock()
		got := len(h.outs)
		h.mu.Unlock()
		if got == n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("hub never had %d guests", n)
}

func TestUnsignedLen(t *testing.T) {
	body := []byte("\x7fELF module body")
	sig := []byte("PKCS#7 signature bytes")
	info := make([]byte, 12)
	binary.BigEndian.PutUint32(info[8:], uint32(len(sig)))
	signed := append(append(append(append([]byte{}, body...), sig...), info...), moduleSigMagic...)
	n, ok := unsignedLen(signed)
	if !ok || n != len(body) {
		t.Fatalf("unsignedLen = %d, %v; want %d", n, ok, len(body))
	}
	if _, ok := unsignedLen(body); ok {
		t.Error("unsigned module reported as signed")
	}
	binary.BigEndian.PutUint32(info[8:], 1<<30)
	bogus := append(append(append([]byte{}, body...), info...), moduleSigMagic...)
	if _, ok := unsignedLen(bogus); ok {
		t.Error("a signature longer than the file was accepted")
	}
}

func TestGuestMarker(t *testing.T) {
	g := &guest{started: time.Now()}
	if g.marker("EXIT wrongtoken 0", "tok") {
		t.Error("a marker with another token was taken")
	}
	if !g.marker("READY tok 6.87", "tok") || g.readyUptime != "6.87" {
		t.Errorf("READY not taken: %q", g.readyUptime)
	}
	if !g.marker("EXIT tok 3", "tok") || g.state != stateExited || g.status != 3 {
		t.Errorf("EXIT not taken: state %d status %d", g.state, g.status)
	}
	if v := g.verdict(time.Minute); !strings.HasSuffix(v, "command exited with status 3") {
		t.Errorf("verdict %q", v)
	}
}

func TestGuestVerdicts(t *testing.T) {
	cases := []struct {
		g    *guest
		want string
	}{
		{&guest{name: "s", state: stateExited}, ""},
		{&guest{name: "s", state: stateExited, kernel: []string{"WARNING: CPU: 0"}}, "s: kernel WARNING: CPU: 0 (1 report(s) in kmsg.log)"},
		{&guest{name: "s", state: stateHung}, "s: no result within the 1m0s deadline (hung); killed"},
		{&guest{name: "s", state: stateNoReport}, "s: qemu exited without the guest reporting a result (kernel panic or crash)"},
		{&guest{name: "s", state: stateExited, status: 126}, "s: the command passed but unloading our kernel module failed"},
	}
	for _, c := range cases {
		if got := c.g.verdict(time.Minute); got != c.want {
			t.Errorf("verdict = %q, want %q", got, c.want)
		}
	}
}

func TestGuestEnv(t *testing.T) {
	l := &Lab{Root: "/repo", kernel: &Kernel{Name: "bookworm", ABI: "6.1.0-56-amd64"}, kmods: []string{"/lab/build/kmod/x/rdmaplus.ko"}}
	s := &Suite{Name: "demo", Guests: 3}
	env := l.guestEnv(s, 2, "run")
	for _, want := range []string{
		"LAB_INDEX='2'\n", "LAB_ROLE='client'\n", "LAB_ADDR='10.77.0.2'\n",
		"LAB_ADDRS='10.77.0.1 10.77.0.2 10.77.0.3'\n", "LAB_PEERS='10.77.0.1 10.77.0.3'\n",
		"LAB_BIN='/lab/build/lab/bin'\n", "LAB_KMODS='/lab/build/kmod/x/rdmaplus.ko'\n",
	} {
		if !strings.Contains(env, want) {
			t.Errorf("env lacks %q:\n%s", want, env)
		}
	}
	if !strings.Contains(l.guestEnv(s, 1, "run"), "LAB_ROLE='server'\n") {
		t.Error("guest 1 is not the server")
	}
}

func TestShellQuote(t *testing.T) {
	if got := shellQuote(`it's -test.run 'X$'`); got != `'it'\''s -test.run '\''X$'\'''` {
		t.Errorf("shellQuote = %s", got)
	}
}

func TestGDBPort(t *testing.T) {
	k := &Kernel{Name: "bookworm", ABI: "6.1.0-0-amd64", Root: t.TempDir()}
	gdbArg := func(l *Lab, i int) string {
		args := qemuArgs(l, k, "initrd", "run", "sock", "token", i, 1, 1024, false)
		for j, a := range args {
			if a == "-gdb" && j+1 < len(args) {
				return args[j+1]
			}
		}
		return ""
	}
	if a := gdbArg(&Lab{MemMiB: 1024}, 1); a != "" {
		t.Errorf("no -gdb asked, got -gdb %s", a)
	}
	if a := gdbArg(&Lab{MemMiB: 1024, GDBPort: 1240}, 3); a != "tcp:127.0.0.1:1242" {
		t.Errorf("guest 3 of -gdb 1240: got %q, want tcp:127.0.0.1:1242", a)
	}
	for _, bad := range []string{"80", "65535", "-1"} {
		err := dispatch(t.Context(), "list", []string{"-gdb", bad})
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "-gdb") {
			t.Errorf("-gdb %s: got %v, want a usage error naming -gdb", bad, err)
		}
	}
}
