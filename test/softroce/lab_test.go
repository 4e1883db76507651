package main

import (
	"bytes"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"
)

func TestHubRepeatsToOthersOnly(t *testing.T) {
	dir := t.TempDir()
	h, err := newHub(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var g [3]*net.UnixConn
	for i := range g {
		c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: guestSock(dir, i+1), Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		g[i] = c
	}
	frame := []byte("an ethernet frame from guest 1")
	if _, err := g[0].WriteToUnix(frame, &net.UnixAddr{Name: hubAddr(dir), Net: "unixgram"}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	for _, i := range []int{1, 2} {
		g[i].SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := g[i].Read(buf)
		if err != nil || !bytes.Equal(buf[:n], frame) {
			t.Fatalf("guest %d got %q, %v", i+1, buf[:n], err)
		}
	}
	g[0].SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := g[0].Read(buf); err == nil {
		t.Fatalf("the sender got its own frame back: %q", buf[:n])
	}
}

func TestHubSurvivesAbsentGuests(t *testing.T) {
	dir := t.TempDir()
	h, err := newHub(dir, 4)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: guestSock(dir, 1), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 10; i++ { // guests 2..4 have no socket yet
		if _, err := c.WriteToUnix([]byte("x"), &net.UnixAddr{Name: hubAddr(dir), Net: "unixgram"}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error)
	go func() { done <- h.Close() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("hub did not close")
	}
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
