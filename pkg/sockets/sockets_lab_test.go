//go:build lab

package sockets_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/sockets"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// The suite test/softroce/suites/sockets-go.sh runs these between two
// guests, each with rvmad's sockets broker (guest 1 serves, guest 2
// dials). SOCKETS_PHASE names the run (barriers are per boot), and
// SOCKETS_RVMAD=stopped says rvmad was stopped on both guests. For
// measurements: SOCKETS_RING sets the ring size of TestLabRDMATransfer,
// SOCKETS_CPUPROFILE=1 writes its CPU profile into $LAB_OUT.

const mib = 1 << 20

func phase() string {
	if p := os.Getenv("SOCKETS_PHASE"); p != "" {
		return p
	}
	return "a"
}

// role fails the test unless the boot has two guests with a device; it
// returns true on the server (guest 1).
func role(t *testing.T) (server bool) {
	t.Helper()
	labenv.Device(t)
	if n, err := labenv.Guests(); err != nil || n != 2 {
		t.Fatalf("this test needs a boot of two guests (have %d, %v)", n, err)
	}
	return labenv.Role() == "server"
}

func signal(t *testing.T, name string) {
	t.Helper()
	if err := labenv.Signal(phase() + "-" + name); err != nil {
		t.Fatal(err)
	}
}

func wait(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	if err := labenv.Wait(ctx, phase()+"-"+name); err != nil {
		t.Fatal(err)
	}
}

func serverAddr(t *testing.T, port int) string {
	t.Helper()
	a, err := labenv.AddrOf(1)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(a, strconv.Itoa(port))
}

// listen listens on this guest's address (IPv4, as the dialer's socket).
func listen(t *testing.T, port int, o *sockets.Options) *sockets.Listener {
	t.Helper()
	l, err := sockets.Listen("tcp4", net.JoinHostPort(labenv.Addr(), strconv.Itoa(port)), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func accept(t *testing.T, l *sockets.Listener) *sockets.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c, err := l.AcceptContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func dial(t *testing.T, port int, o *sockets.Options) *sockets.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := sockets.Dial(ctx, "tcp4", serverAddr(t, port), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitPath waits until c's path is want (each direction), within d.
func waitPath(t *testing.T, c *sockets.Conn, read, write sockets.Transport, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		p := c.Path()
		if p.Read == read && p.Write == write {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("path %+v after %v, want read %s write %s; stats %+v", p, d, read, write, c.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// counters are the proof of transport: rxe's packet counters and the
// kernel's TCP segment counters.
type counters struct {
	rdmaSent, rdmaRcvd, tcpOut, tcpIn uint64
}

func readUint(t *testing.T, path string) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

func readCounters(t *testing.T) counters {
	t.Helper()
	dev := labenv.Device(t)
	hw := filepath.Join("/sys/class/infiniband", dev, "ports/1/hw_counters")
	c := counters{rdmaSent: readUint(t, filepath.Join(hw, "sent_pkts")), rdmaRcvd: readUint(t, filepath.Join(hw, "rcvd_pkts"))}
	f, err := os.Open("/proc/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var head []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 || fs[0] != "Tcp:" {
			continue
		}
		if head == nil {
			head = fs
			continue
		}
		for i, name := range head {
			if i >= len(fs) {
				break
			}
			v, _ := strconv.ParseUint(fs[i], 10, 64)
			switch name {
			case "OutSegs":
				c.tcpOut = v
			case "InSegs":
				c.tcpIn = v
			}
		}
	}
	if head == nil {
		t.Fatal("no Tcp line in /proc/net/snmp")
	}
	return c
}

func activeMTU(t *testing.T) int {
	t.Helper()
	ctx, err := verbs.Open(labenv.Device(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	pa, err := ctx.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	return pa.ActiveMTU.Bytes()
}

// sendRecv writes out on c while reading len(in) bytes and checks them;
// after writing, it shuts c's writing and expects end of file after the
// bytes when eof is set. hook, if set, runs in the reader once at
// hookAt bytes read.
func sendRecv(t *testing.T, c *sockets.Conn, out, in []byte, eof bool, hookAt int, hook func()) {
	t.Helper()
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for p := out; len(p) > 0; {
			n, err := c.Write(p[:min(len(p), 64<<10)])
			if err != nil {
				werr = err
				return
			}
			p = p[n:]
		}
		if eof {
			werr = c.CloseWrite()
		}
	}()
	got := make([]byte, len(in))
	off := 0
	for off < len(in) {
		n, err := c.Read(got[off:min(len(in), off+100_000)])
		if hook != nil && off < hookAt && off+n >= hookAt {
			go hook()
		}
		off += n
		if err != nil {
			t.Fatalf("read at %d of %d: %v (stats %+v)", off, len(in), err, c.Stats())
		}
	}
	if i := firstDiff(got, in); i >= 0 {
		t.Fatalf("byte %d of %d differs (stats %+v)", i, len(in), c.Stats())
	}
	if eof {
		var b [1]byte
		if n, err := c.Read(b[:]); n != 0 || err != io.EOF {
			t.Fatalf("after the last byte: %d, %v; want end of file", n, err)
		}
	}
	wg.Wait()
	if werr != nil {
		t.Fatalf("write: %v", werr)
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestLabRDMATransfer moves 16 MiB each way over an attached connection
// with every byte checked, and proves that RDMA carried them: rxe's
// packet counters moved by at least the bytes' packets, the TCP segment
// counters by almost nothing.
func TestLabRDMATransfer(t *testing.T) {
	server := role(t)
	const size = 16 * mib
	mtu := activeMTU(t)
	var c *sockets.Conn
	ring, _ := strconv.Atoi(os.Getenv("SOCKETS_RING")) // 0: the default
	if server {
		l := listen(t, 7481, &sockets.Options{RingSize: ring})
		signal(t, "xfer-listen")
		c = accept(t, l)
	} else {
		wait(t, "xfer-listen")
		c = dial(t, 7481, &sockets.Options{WaitAttach: true, RingSize: ring})
	}
	// Both directions on RDMA before the clock starts: the client's
	// SWITCH comes first on the QP, then the server's.
	waitPath(t, c, sockets.RDMA, sockets.RDMA, 30*time.Second)
	if server {
		signal(t, "xfer-attached-server")
		wait(t, "xfer-attached-client")
	} else {
		signal(t, "xfer-attached-client")
		wait(t, "xfer-attached-server")
	}
	mine, theirs := pattern(11, size), pattern(12, size)
	if server {
		mine, theirs = theirs, mine
	}
	if os.Getenv("SOCKETS_CPUPROFILE") != "" {
		f, err := os.Create(filepath.Join(os.Getenv(labenv.EnvOut), "cpu-"+labenv.Role()+".pprof"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	// Both take their "before" first: the transfer starts after.
	before := readCounters(t)
	if server {
		signal(t, "xfer-counted-server")
		wait(t, "xfer-counted-client")
	} else {
		signal(t, "xfer-counted-client")
		wait(t, "xfer-counted-server")
	}
	t0 := time.Now()
	sendRecv(t, c, mine, theirs, true, 0, nil)
	el := time.Since(t0)
	after := readCounters(t)
	st := c.Stats()
	sent, rcvd := after.rdmaSent-before.rdmaSent, after.rdmaRcvd-before.rdmaRcvd
	out, in := after.tcpOut-before.tcpOut, after.tcpIn-before.tcpIn
	fmt.Printf("guest %s: 16 MiB each way in %v (%.1f MB/s each way): rxe sent_pkts +%d rcvd_pkts +%d; TCP OutSegs +%d InSegs +%d; stats %+v\n",
		labenv.Role(), el.Round(time.Millisecond), float64(size)/el.Seconds()/1e6, sent, rcvd, out, in, st)
	pkts := uint64(size / mtu)
	if sent < pkts || rcvd < pkts {
		t.Errorf("rxe moved %d and %d packets, fewer than the %d packets of %d bytes at MTU %d: RDMA did not carry the bytes", sent, rcvd, pkts, size, mtu)
	}
	// 16 MiB over TCP would be more than 11,000 segments each way.
	if out+in > 400 {
		t.Errorf("TCP moved %d segments out and %d in during the transfer: TCP carried bytes", out, in)
	}
	if st.ReadRDMA != size || st.WrittenRDMA != size || st.ReadTCP != 0 || st.WrittenTCP != 0 || st.RDMAWrites == 0 || st.Upgrades != 1 {
		t.Errorf("stats %+v: want every byte by RDMA", st)
	}
	if server {
		signal(t, "xfer-done-server")
		wait(t, "xfer-done-client")
	} else {
		signal(t, "xfer-done-client")
		wait(t, "xfer-done-server")
	}

	// The same exchange on TCP alone (Disable), for the ratio.
	var p *sockets.Conn
	off := &sockets.Options{Disable: true}
	if server {
		l := listen(t, 7492, off)
		signal(t, "xfer-tcp-listen")
		p = accept(t, l)
	} else {
		wait(t, "xfer-tcp-listen")
		p = dial(t, 7492, off)
	}
	before = readCounters(t)
	t0 = time.Now()
	sendRecv(t, p, mine, theirs, true, 0, nil)
	tel := time.Since(t0)
	after = readCounters(t)
	fmt.Printf("guest %s: the same on TCP alone in %v (%.1f MB/s each way; RDMA/TCP time %.2f): rxe sent_pkts +%d; TCP OutSegs +%d InSegs +%d\n",
		labenv.Role(), tel.Round(time.Millisecond), float64(size)/tel.Seconds()/1e6, el.Seconds()/tel.Seconds(),
		after.rdmaSent-before.rdmaSent, after.tcpOut-before.tcpOut, after.tcpIn-before.tcpIn)
	// OutSegs counts what TCP hands the device (TSO/GSO segments of up
	// to 64 KiB on virtio), so at least size/64 KiB.
	if out := after.tcpOut - before.tcpOut; out < uint64(size/(64<<10)) {
		t.Errorf("TCP alone moved %d segments out for %d bytes: the TCP counters do not count what they should", out, size)
	}
	if server {
		signal(t, "xfer-tcp-done-server")
		wait(t, "xfer-tcp-done-client")
	} else {
		signal(t, "xfer-tcp-done-client")
		wait(t, "xfer-tcp-done-server")
	}
}

// TestLabPlainPeer: a peer without pkg/sockets (plain net) on either side
// keeps the connection on TCP, with every byte right.
func TestLabPlainPeer(t *testing.T) {
	server := role(t)
	const size = 2 * mib
	a, b := pattern(21, size), pattern(22, size)
	// 1. A plain server, a pkg/sockets client: rvmad finds no owner.
	if server {
		l, err := net.Listen("tcp4", net.JoinHostPort(labenv.Addr(), "7482"))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		signal(t, "plain1-listen")
		nc, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		plainSendRecv(t, nc, b, a)
	} else {
		wait(t, "plain1-listen")
		c := dial(t, 7482, &sockets.Options{WaitAttach: true})
		sendRecv(t, c, a, b, true, 0, nil)
		st := c.Stats()
		if p := c.Path(); p.Read != sockets.TCP || p.Write != sockets.TCP || st.ReadTCP != size || st.WrittenTCP != size {
			t.Errorf("client of a plain server: path %+v, stats %+v", p, st)
		}
		if st.Fallbacks["no_owner"] != 1 {
			t.Errorf("fallbacks %v, want no_owner", st.Fallbacks)
		}
		fmt.Printf("client of a plain server: path %+v, stats %+v\n", c.Path(), st)
	}
	// 2. A pkg/sockets server, a plain client: nobody asks.
	if server {
		l := listen(t, 7483, nil)
		signal(t, "plain2-listen")
		c := accept(t, l)
		sendRecv(t, c, b, a, true, 0, nil)
		st := c.Stats()
		if p := c.Path(); p.Read != sockets.TCP || p.Write != sockets.TCP || st.ReadTCP != size || st.Upgrades != 0 {
			t.Errorf("server of a plain client: path %+v, stats %+v", p, st)
		}
		fmt.Printf("server of a plain client: path %+v, stats %+v\n", c.Path(), st)
	} else {
		wait(t, "plain2-listen")
		nc, err := net.Dial("tcp4", serverAddr(t, 7483))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		plainSendRecv(t, nc, a, b)
	}
	signal(t, "plain-done-"+labenv.Role())
	if server {
		wait(t, "plain-done-client")
	} else {
		wait(t, "plain-done-server")
	}
}

func plainSendRecv(t *testing.T, nc net.Conn, out, in []byte) {
	t.Helper()
	nc.SetDeadline(time.Now().Add(120 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := nc.Write(out)
		if err == nil {
			err = nc.(*net.TCPConn).CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(nc)
	if err != nil || !bytes.Equal(got, in) {
		t.Fatalf("plain peer read %d bytes (%v), want %d checked", len(got), err, len(in))
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestLabNoRvmad: without rvmad (a broker socket nobody serves, or rvmad
// stopped on both guests) connections stay on TCP.
func TestLabNoRvmad(t *testing.T) {
	server := role(t)
	o := &sockets.Options{Socket: "/run/rvmad/nobody.sock", WaitAttach: true}
	if os.Getenv("SOCKETS_RVMAD") == "stopped" {
		o.Socket = "" // the default: rvmad's own, now stopped
	}
	const size = 2 * mib
	a, b := pattern(31, size), pattern(32, size)
	var c *sockets.Conn
	if server {
		l := listen(t, 7484, o)
		signal(t, "norvmad-listen")
		c = accept(t, l)
		a, b = b, a
	} else {
		wait(t, "norvmad-listen")
		c = dial(t, 7484, o)
	}
	sendRecv(t, c, a, b, true, 0, nil)
	st := c.Stats()
	fmt.Printf("guest %s without rvmad (%s): path %+v, stats %+v\n", labenv.Role(), o.Socket, c.Path(), st)
	if p := c.Path(); p.Read != sockets.TCP || p.Write != sockets.TCP || st.ReadTCP != size || st.WrittenTCP != size || st.Fallbacks["no_daemon"] != 1 {
		t.Errorf("path %+v, stats %+v: want TCP, a no_daemon fallback", p, st)
	}
	signal(t, "norvmad-done-"+labenv.Role())
	if server {
		wait(t, "norvmad-done-client")
	} else {
		wait(t, "norvmad-done-server")
	}
}

// TestLabDemote demotes an attached connection while 8 MiB move each way:
// once asked by the client, once by the server. Every byte arrives, the
// connection ends on TCP, and each side counts its demote.
// attachedPair makes the connection name on port between the guests,
// attached both ways, and the 8 MiB each side sends (out) and must get
// (in), from seeds seed and seed+1. server is guest 1's role.
func attachedPair(t *testing.T, port int, name string, seed uint64) (c *sockets.Conn, out, in []byte, server bool) {
	t.Helper()
	server = role(t)
	out, in = pattern(seed, 8*mib), pattern(seed+1, 8*mib)
	if server {
		l := listen(t, port, nil)
		signal(t, name+"-listen")
		c = accept(t, l)
		out, in = in, out
	} else {
		wait(t, name+"-listen")
		c = dial(t, port, &sockets.Options{WaitAttach: true})
	}
	waitPath(t, c, sockets.RDMA, sockets.RDMA, 30*time.Second)
	return c, out, in, server
}

// demotedCheck waits (30 s at most) until c's demote completed, prints
// what happened, checks c is plain TCP with both paths in what it read
// (8 MiB in all), and returns its statistics.
func demotedCheck(t *testing.T, c *sockets.Conn, what string) sockets.Stats {
	t.Helper()
	end := time.Now().Add(30 * time.Second)
	for c.Path().Phase != "plain" && time.Now().Before(end) {
		time.Sleep(20 * time.Millisecond)
	}
	st, p := c.Stats(), c.Path()
	fmt.Printf("%s, guest %s: path %+v, stats %+v\n", what, labenv.Role(), p, st)
	if p.Read != sockets.TCP || p.Write != sockets.TCP || p.Phase != "plain" {
		t.Errorf("path %+v: want plain TCP", p)
	}
	if st.ReadRDMA == 0 || st.ReadTCP == 0 || st.ReadRDMA+st.ReadTCP != 8*mib {
		t.Errorf("read %d by RDMA and %d by TCP: want both, %d in all", st.ReadRDMA, st.ReadTCP, 8*mib)
	}
	return st
}

// bothDone waits until both guests finished the connection name.
func bothDone(t *testing.T, name string) {
	t.Helper()
	signal(t, name+"-done-"+labenv.Role())
	if labenv.Role() == "server" {
		wait(t, name+"-done-client")
	} else {
		wait(t, name+"-done-server")
	}
}

func TestLabDemote(t *testing.T) {
	for i, by := range []string{"client", "server", "both"} {
		t.Run("by-"+by, func(t *testing.T) {
			name := "demote-" + by
			c, a, b, _ := attachedPair(t, []int{7485, 7486, 7495}[i], name, uint64(41+2*i))
			mine := labenv.Role() == by || by == "both"
			var derr error
			done := make(chan struct{})
			hook := func() {
				defer close(done)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				derr = c.Demote(ctx)
			}
			if !mine {
				hook = nil
				close(done)
			}
			sendRecv(t, c, a, b, true, 2*mib, hook)
			<-done
			if derr != nil && !(by == "both" && errors.Is(derr, sockets.ErrNotAttached)) {
				// (Both: the peer's DEMOTE may have come first.)
				t.Fatalf("Demote: %v", derr)
			}
			st := demotedCheck(t, c, "demote by "+by)
			want := "peer"
			if mine {
				want = "app"
			}
			got := st.Demotes[want]
			if by == "both" {
				got = st.Demotes["app"] + st.Demotes["peer"]
			}
			if got != 1 {
				t.Errorf("demotes %v: want one %s demote", st.Demotes, want)
			}
			bothDone(t, name)
		})
	}
}

// TestLabHelperServer is the peer TestLabPeerKilled kills: run only as
// its child (SOCKETS_HELPER=1).
func TestLabHelperServer(t *testing.T) {
	if os.Getenv("SOCKETS_HELPER") != "1" {
		t.Skip("the child of TestLabPeerKilled")
	}
	l := listen(t, 7487, nil)
	signal(t, "kill-listen")
	c := accept(t, l)
	waitPath(t, c, sockets.RDMA, sockets.RDMA, 30*time.Second)
	if _, err := c.Write(pattern(51, mib)); err != nil {
		t.Fatal(err)
	}
	signal(t, "kill-written")
	time.Sleep(10 * time.Minute) // until killed
}

// TestLabPeerKilled: the attached server's process is killed mid-stream
// (SIGKILL); the client's Read gives end of file or an error, and its
// Writes an error, never a hang.
func TestLabPeerKilled(t *testing.T) {
	server := role(t)
	if server {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLabHelperServer$", "-test.v")
		cmd.Env = append(os.Environ(), "SOCKETS_HELPER=1")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wait(t, "kill-read")
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		fmt.Println("the attached server was killed with SIGKILL")
		signal(t, "kill-killed")
		wait(t, "kill-done")
		return
	}
	wait(t, "kill-listen")
	defer signal(t, "kill-done") // even when failing: the server waits for it
	c := dial(t, 7487, &sockets.Options{WaitAttach: true, DemoteTimeout: 5 * time.Second})
	got := make([]byte, mib)
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, pattern(51, mib)) {
		t.Fatalf("reading the server's MiB: %v", err)
	}
	if p := c.Path(); p.Read != sockets.RDMA || p.Write != sockets.RDMA {
		t.Fatalf("path %+v before the kill", p)
	}
	signal(t, "kill-read")
	wait(t, "kill-killed")
	t0 := time.Now()
	errc := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 100)); errc <- err }()
	select {
	case err := <-errc:
		fmt.Printf("read after the peer was killed: %v after %v\n", err, time.Since(t0).Round(time.Millisecond))
		if err == nil {
			t.Error("Read returned bytes after the peer died")
		}
	case <-time.After(60 * time.Second):
		pprof.Lookup("goroutine").WriteTo(os.Stdout, 1)
		t.Fatal("Read hangs after the peer was killed")
	}
	wdone := make(chan error, 1)
	go func() {
		var err error
		buf := make([]byte, 64<<10)
		for i := 0; i < 1000 && err == nil; i++ {
			_, err = c.Write(buf)
		}
		wdone <- err
	}()
	select {
	case err := <-wdone:
		fmt.Printf("write after the peer was killed: %v after %v; stats %+v\n", err, time.Since(t0).Round(time.Millisecond), c.Stats())
		if err == nil {
			t.Error("64 MiB written to a dead peer without an error")
		}
	case <-time.After(90 * time.Second):
		fmt.Printf("path %+v stats %+v\n", c.Path(), c.Stats())
		pprof.Lookup("goroutine").WriteTo(os.Stdout, 1)
		t.Fatal("Write hangs after the peer was killed")
	}
}

// TestLabDeadlines: deadlines on an attached connection; a Read blocked
// while the ring is next wakes when ring bytes arrive.
func TestLabDeadlines(t *testing.T) {
	server := role(t)
	if server {
		l := listen(t, 7488, nil)
		signal(t, "dl-listen")
		c := accept(t, l)
		waitPath(t, c, sockets.RDMA, sockets.RDMA, 30*time.Second)
		wait(t, "dl-ping")
		time.Sleep(300 * time.Millisecond)
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		wait(t, "dl-done") // reads nothing meanwhile: the client's writes block
		return
	}
	wait(t, "dl-listen")
	c := dial(t, 7488, &sockets.Options{WaitAttach: true})
	waitPath(t, c, sockets.RDMA, sockets.RDMA, 30*time.Second)
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	t0 := time.Now()
	_, err := c.Read(make([]byte, 10))
	if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(t0) > 10*time.Second {
		t.Fatalf("Read past its deadline: %v after %v", err, time.Since(t0))
	}
	c.SetReadDeadline(time.Time{})
	signal(t, "dl-ping")
	t0 = time.Now()
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("blocked Read: %q, %v", b, err)
	}
	fmt.Printf("a Read blocked on the ring woke with the peer's bytes after %v (the peer wrote after 300 ms)\n", time.Since(t0).Round(time.Millisecond))
	if st := c.Stats(); st.ReadRDMA != 4 {
		t.Errorf("stats %+v: want the 4 bytes by RDMA", st)
	}
	c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 64<<10)
	total := 0
	var werr error
	for i := 0; i < 100 && werr == nil; i++ {
		var n int
		n, werr = c.Write(buf)
		total += n
	}
	if !errors.Is(werr, os.ErrDeadlineExceeded) {
		t.Fatalf("Write to a peer that does not read: %v after %d bytes", werr, total)
	}
	fmt.Printf("Write to a peer that does not read: %v after %d bytes\n", werr, total)
	if total > 2*sockets.DefaultRingSize {
		t.Errorf("%d bytes taken by a peer that reads nothing: more than the send buffer", total)
	}
	signal(t, "dl-done")
}

// TestLabPeerCloses: the attached server writes 1 MiB and closes at once;
// Close keeps the attachment until the client consumed every byte, and
// the client reads them all, then end of file.
func TestLabPeerCloses(t *testing.T) {
	server := role(t)
	data := pattern(61, 3*mib/2)
	if server {
		l := listen(t, 7489, nil)
		signal(t, "close-listen")
		c := accept(t, l)
		waitPath(t, c, sockets.RDMA, sockets.RDMA, 30*time.Second)
		if _, err := c.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal("second Close:", err)
		}
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Read after Close: %v", err)
		}
		wait(t, "close-done")
		return
	}
	wait(t, "close-listen")
	defer signal(t, "close-done")
	c := dial(t, 7489, &sockets.Options{WaitAttach: true})
	time.Sleep(500 * time.Millisecond) // the server closes with most of its bytes unconsumed
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d of %d bytes from a server that closed: %v", len(got), len(data), err)
	}
	st := c.Stats()
	fmt.Printf("read all %d bytes, then end of file, from a server that closed at once: stats %+v\n", len(got), st)
	if st.ReadRDMA != uint64(len(data)) {
		t.Errorf("stats %+v: want every byte by RDMA", st)
	}
}

// TestLabUpgrade attaches two connections made by the net package, each
// end upgraded with its role.
func TestLabUpgrade(t *testing.T) {
	server := role(t)
	a, b := pattern(71, mib), pattern(72, mib)
	var c *sockets.Conn
	if server {
		l, err := net.Listen("tcp4", net.JoinHostPort(labenv.Addr(), "7490"))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		signal(t, "upgrade-listen")
		nc, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if c, err = sockets.Upgrade(context.Background(), nc.(*net.TCPConn), &sockets.Options{Accepted: true}); err != nil {
			t.Fatal(err)
		}
		a, b = b, a
	} else {
		wait(t, "upgrade-listen")
		nc, err := net.Dial("tcp4", serverAddr(t, 7490))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err = sockets.Upgrade(ctx, nc.(*net.TCPConn), &sockets.Options{WaitAttach: true}); err != nil {
			t.Fatal(err)
		}
	}
	defer c.Close()
	waitPath(t, c, sockets.RDMA, sockets.RDMA, 30*time.Second)
	sendRecv(t, c, a, b, true, 0, nil)
	st := c.Stats()
	fmt.Printf("upgraded (%s): stats %+v\n", labenv.Role(), st)
	if st.ReadRDMA != mib || st.Upgrades != 1 {
		t.Errorf("stats %+v: want the MiB by RDMA", st)
	}
	signal(t, "upgrade-done-"+labenv.Role())
	if server {
		wait(t, "upgrade-done-client")
	} else {
		wait(t, "upgrade-done-server")
	}
}

// TestLabDualStack: a server listening on a dual-stack socket (its
// accepted IPv4 connections are AF_INET6 sockets with ::ffff:
// addresses) attaches with an IPv4 dialer (AF_INET): rvmad pairs the two
// views of the connection.
func TestLabDualStack(t *testing.T) {
	server := role(t)
	a, b := pattern(91, mib), pattern(92, mib)
	var c *sockets.Conn
	if server {
		l, err := sockets.Listen("tcp", ":7491", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		signal(t, "ds-listen")
		c = accept(t, l)
		a, b = b, a
	} else {
		wait(t, "ds-listen")
		c = dial(t, 7491, &sockets.Options{WaitAttach: true})
	}
	waitPath(t, c, sockets.RDMA, sockets.RDMA, 30*time.Second)
	sendRecv(t, c, a, b, true, 0, nil)
	st := c.Stats()
	fmt.Printf("dual-stack listener, %s (local %v): path %+v, stats %+v\n", labenv.Role(), c.LocalAddr(), c.Path(), st)
	if st.ReadRDMA != mib || st.Upgrades != 1 {
		t.Errorf("stats %+v: want the MiB by RDMA", st)
	}
	signal(t, "ds-done-"+labenv.Role())
	if server {
		wait(t, "ds-done-client")
	} else {
		wait(t, "ds-done-server")
	}
}

// TestLabMany attaches eight connections at once (one broker
// connection per process, one completion channel per device, a CQ and QP
// each) and moves 2 MiB each way on each, every byte checked.
func TestLabMany(t *testing.T) {
	server := role(t)
	const n, size = 8, 2 * mib
	conns := make([]*sockets.Conn, n)
	if server {
		l := listen(t, 7493, nil)
		signal(t, "many-listen")
		for i := range conns {
			conns[i] = accept(t, l)
		}
	} else {
		wait(t, "many-listen")
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				c, err := sockets.Dial(ctx, "tcp4", serverAddr(t, 7493), &sockets.Options{WaitAttach: true})
				if err != nil {
					errs <- err
					return
				}
				conns[i] = c
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for _, c := range conns {
			t.Cleanup(func() { c.Close() })
		}
	}
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each connection's content tells which it is: the
			// accepted order need not be the dialed one.
			port := c.LocalAddr().(*net.TCPAddr).Port
			if server {
				port = c.RemoteAddr().(*net.TCPAddr).Port
			}
			a, b := pattern(uint64(port)*2, size), pattern(uint64(port)*2+1, size)
			if server {
				a, b = b, a
			}
			waitPath(t, c, sockets.RDMA, sockets.RDMA, 60*time.Second)
			sendRecv(t, c, a, b, true, 0, nil)
			if st := c.Stats(); st.ReadRDMA != size {
				t.Errorf("connection %d: stats %+v", i, st)
			}
		}()
	}
	wg.Wait()
	fmt.Printf("guest %s: %d attached connections moved %d MiB each way each\n", labenv.Role(), n, size/mib)
	signal(t, "many-done-"+labenv.Role())
	if server {
		wait(t, "many-done-client")
	} else {
		wait(t, "many-done-server")
	}
}

// TestLabQPError fails the server's QP (as a failing link would) while
// 8 MiB move each way: the connection demotes through rvmad (reason
// qp_error) and every byte arrives, the rest by TCP.
func TestLabQPError(t *testing.T) {
	c, a, b, server := attachedPair(t, 7494, "qperr", 81)
	var hook func()
	if server {
		hook = func() {
			if err := sockets.FailQP(c); err != nil {
				t.Errorf("FailQP: %v", err)
			}
		}
	}
	sendRecv(t, c, a, b, true, 2*mib, hook)
	st := demotedCheck(t, c, "QP failed on the server")
	if server && st.Demotes["qp_error"] != 1 || !server && st.Demotes["qp_error"]+st.Demotes["peer"] != 1 {
		t.Errorf("demotes %v", st.Demotes)
	}
	bothDone(t, "qperr")
}

// TestLabDeviceRemoved deletes the server's rxe device (rdma link delete)
// in the middle of a transfer on RDMA: rvmad tells the process, which
// demotes and closes the device, so the delete returns while the bytes
// go on over TCP, every one checked. The device is added again after.
func TestLabDeviceRemoved(t *testing.T) {
	c, a, b, server := attachedPair(t, 7496, "devgone", 91)
	dev := os.Getenv(labenv.EnvDevice)
	deleted := make(chan error, 1)
	var took time.Duration
	var hook func()
	if server {
		parent, err := os.ReadFile(filepath.Join("/sys/class/infiniband", dev, "parent"))
		if err != nil {
			t.Fatalf("device %q: %v", dev, err)
		}
		netdev := strings.TrimSpace(string(parent))
		t.Cleanup(func() { relink(t, dev, netdev) })
		hook = func() {
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, "rdma", "link", "delete", dev).CombinedOutput()
			took = time.Since(t0)
			if err != nil {
				err = fmt.Errorf("rdma link delete %s after %v: %w: %s", dev, took, err, out)
			}
			deleted <- err
		}
	} else {
		close(deleted)
	}
	sendRecv(t, c, a, b, true, 2*mib, hook)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	st := demotedCheck(t, c, fmt.Sprintf("device deleted on the server (the delete took %v)", took))
	if server && st.Demotes["device"] != 1 || !server && st.Demotes["peer"] != 1 {
		t.Errorf("demotes %v", st.Demotes)
	}
	c.Close()
	bothDone(t, "devgone")
}

// relink adds the rxe device dev on netdev again, and waits until its
// port is active with a RoCE v2 GID for the guest's address.
func relink(t *testing.T, dev, netdev string) {
	if _, err := os.Stat(filepath.Join("/sys/class/infiniband", dev)); err == nil {
		return
	}
	if out, err := exec.Command("rdma", "link", "add", dev, "type", "rxe", "netdev", netdev).CombinedOutput(); err != nil {
		t.Errorf("rdma link add %s: %v: %s", dev, err, out)
		return
	}
	end := time.Now().Add(20 * time.Second)
	for time.Now().Before(end) {
		state, _ := os.ReadFile(filepath.Join("/sys/class/infiniband", dev, "ports/1/state"))
		if strings.Contains(string(state), "ACTIVE") {
			if ctx, err := verbs.Open(dev); err == nil {
				gids, _ := ctx.GIDs()
				ctx.Close()
				if _, err := verbs.PickRoCEv2GID(gids, 1, net.ParseIP(labenv.Addr())); err == nil {
					return
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("%s added again on %s, but no active port with a RoCE v2 GID for %s within 20 s", dev, netdev, labenv.Addr())
}
