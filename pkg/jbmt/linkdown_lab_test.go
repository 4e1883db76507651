//go:build lab

package jbmt_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
	"github.com/rdmaplus/rdmaplus/test/softroce/labenv"
)

// The bound on noticing a peer that is gone. The module gives its QP a
// local ACK timeout of 4.096 µs × 2^17 (about 0.54 s) and 6 retries, so
// a send nobody acknowledges fails the QP after 7 timeouts, about 3.8 s;
// a connection with sections in flight whose peer has been silent for a
// probe period (0.5 s) sends a PING, at most two periods after the peer
// fell silent (kmod/rdmaplus_jbmt_net.c). That is about 4.8 s;
// linkDownBound adds 2 s for the teardown and the test's own latencies
// (the barrier, the gets' wake-ups under TCG). linkDownHold keeps the
// link down well beyond it, so every operation has to fail while the
// peer is still unreachable.
const (
	linkDownBound = 7 * time.Second
	linkDownHold  = 10 * time.Second
	// bounceDial bounds the new Dial over guest 1's device once its
	// link is back. rxe moves its QP1 (which carries the connection
	// manager's messages) to the error state for good when a message
	// cannot be sent because the link is down, and a device whose QP1
	// failed takes no rdma_cm connection until it is deleted and added
	// again. The module therefore sends none while the port is down: the
	// connection that went keeps its rdma_cm id (whose destruction sends
	// a DREQ or DREP) until the port is up again (docs/jbmt.md,
	// "Connections"), so the Dial connects over the same device.
	bounceDial = 10 * time.Second
)

// ipLink runs ip link ARGS (the full path first: busybox's applet lacks
// some forms).
func ipLink(t *testing.T, args ...string) {
	t.Helper()
	ip := "/usr/sbin/ip"
	if _, err := os.Stat(ip); err != nil {
		ip = "ip"
	}
	out, err := exec.Command(ip, append([]string{"link"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link %v: %v: %s", args, err, out)
	}
}

// portReady waits for dev's port 1 to be ACTIVE with its RoCE v2 IPv4 GID
// (index 1) back in the table.
func portReady(t *testing.T, ctx context.Context, dev string) {
	t.Helper()
	port := "/sys/class/infiniband/" + dev + "/ports/1/"
	for {
		st, _ := os.ReadFile(port + "state")
		gid, _ := os.ReadFile(port + "gids/1")
		g := strings.TrimSpace(string(gid))
		if strings.TrimSpace(string(st)) == "4: ACTIVE" && g != "" &&
			strings.Trim(g, "0:") != "" {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s port 1 not back (state %q, GID 1 %q)", dev, st, g)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cmSent returns how many messages the connection manager sent on dev's
// port 1, in all and those that end a connection, DREQs and DREPs
// (cm_tx_msgs, counted whether or not the send succeeded).
func cmSent(t *testing.T, dev string) (all, end int64) {
	t.Helper()
	dir := "/sys/class/infiniband/" + dev + "/ports/1/cm_tx_msgs/"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(dir + e.Name())
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatalf("%s%s: %v", dir, e.Name(), err)
		}
		all += n
		if e.Name() == "dreq" || e.Name() == "drep" {
			end += n
		}
	}
	return all, end
}

// TestTwoGuestsTransferLinkDown (suite jbmt-2guests): guest 1 takes its
// link down (eth0, which carries rxe) while guest 2 has three blocking
// gets, asynchronous gets and a put in flight on guest 1's region, and
// keeps it down for linkDownHold, beyond the QP's retries. Every
// operation in flight fails with ErrPeerGone within linkDownBound of the
// link going down (measured from the moment guest 2 sees guest 1's
// barrier, which is after it), the connection is down on both hosts,
// neither keeps a page pinned and guest 1 sends no connection manager
// message. Once the link is back (port ACTIVE, the GID back), guest 1
// sends the DREQ or DREP that ends the connection that went, and a new
// Dial over the same device makes a new connection within bounceDial
// that gets 8 MiB from the same token, every byte checked. The lab fails
// the run on any kernel report.
func TestTwoGuestsTransferLinkDown(t *testing.T) {
	s := open(t)
	dev := labenv.Device(t)
	needTwoGuests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const n = 32 << 20
	const getN = 8 << 20
	want := random(n, 5)
	if labenv.Role() == "server" {
		mem, reg := region(t, s, n, jbmt.Read|jbmt.Write)
		copy(mem, want)
		if err := labenv.Publish("lnk-token", reg.Token()); err != nil {
			t.Fatal(err)
		}
		await(t, ctx, "lnk-started")
		time.Sleep(300 * time.Millisecond)
		before := stats(t)
		sent0, _ := cmSent(t, dev)
		t0 := time.Now()
		ipLink(t, "set", "eth0", "down")
		signal(t, "lnk-down")
		var gone time.Duration
		for time.Since(t0) < linkDownHold {
			if st := stats(t); gone == 0 && st.Peers == 0 {
				gone = time.Since(t0)
			}
			time.Sleep(20 * time.Millisecond)
		}
		st := stats(t)
		t.Logf("guest 1: the connection went down %v after the link (disconnects %d→%d); link up after %v",
			gone.Round(time.Millisecond), before.Disconnects, st.Disconnects, time.Since(t0).Round(time.Millisecond))
		if st.Peers != 0 || sectionPinned(st) != 0 {
			t.Errorf("guest 1 with its link down %v: %+v, want no peer and no page pinned", linkDownHold, st)
		}
		sent1, end1 := cmSent(t, dev)
		if sent1 != sent0 {
			t.Errorf("guest 1 sent %d connection manager messages while its link was down, want none (rxe fails its QP1 on each)", sent1-sent0)
		}
		ipLink(t, "set", "eth0", "up")
		portReady(t, ctx, dev)
		t.Logf("guest 1: port ACTIVE with its GID %v after the link went up", time.Since(t0.Add(linkDownHold)).Round(time.Millisecond))
		signal(t, "lnk-back")
		// The id kept for the connection that went is destroyed once
		// the port is ACTIVE again (two ticks of 500 ms): its DREQ, or
		// the DREP to guest 2's if that arrived first. The new
		// connection stays up until lnk-done, so nothing else ends one.
		for {
			if _, end := cmSent(t, dev); end > end1 {
				t.Logf("guest 1: the connection that went ended (DREQ or DREP sent) %v after the link went up", time.Since(t0.Add(linkDownHold)).Round(time.Millisecond))
				break
			}
			if time.Since(t0) > linkDownHold+5*time.Second {
				t.Errorf("guest 1 sent no DREQ or DREP within 5 s of its link going up: the rdma_cm id of the connection that went is still kept")
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		await(t, ctx, "lnk-done")
		checkUnpinned(t)
		signal(t, "lnk-checked")
		return
	}
	tok := loadToken(t, ctx, "lnk-token")
	p := dialGuest1(t, ctx, s)
	server := p.Addr()

	type result struct {
		what string
		err  error
		at   time.Time
	}
	results := make(chan result, 8)
	var wg sync.WaitGroup
	run := func(what string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := f()
			results <- result{what, err, time.Now()}
		}()
	}
	for i := range 3 {
		buf := make([]byte, getN)
		off := uint64(i) * getN
		run("blocking get "+string(rune('1'+i)), func() error {
			for {
				if _, err := p.Get(ctx, buf, tok, off); err != nil {
					return err
				}
			}
		})
	}
	run("asynchronous gets", func() error { return asyncGetsUntilError(ctx, s, p, tok) })
	put := random(4<<20, 6)
	run("put", func() error {
		for {
			if _, err := p.Put(ctx, put, tok, 3*getN); err != nil {
				return err
			}
		}
	})
	signal(t, "lnk-started")
	await(t, ctx, "lnk-down")
	down := time.Now()
	go func() { wg.Wait(); close(results) }()
	var last time.Duration
	for r := range results {
		took := r.at.Sub(down)
		t.Logf("%s: %v, %v after guest 1's link went down", r.what, r.err, took.Round(time.Millisecond))
		last = max(last, took)
		if !errors.Is(r.err, jbmt.ErrPeerGone) {
			t.Errorf("%s while guest 1's link was down: %v, want ErrPeerGone", r.what, r.err)
		}
		if took > linkDownBound {
			t.Errorf("%s failed %v after the link went down, beyond %v", r.what, took.Round(time.Millisecond), linkDownBound)
		}
	}
	t.Logf("every operation in flight failed within %v of guest 1's link going down (bound %v)", last.Round(time.Millisecond), linkDownBound)
	if _, err := p.Get(ctx, make([]byte, 10), tok, 0); !errors.Is(err, jbmt.ErrPeerGone) {
		t.Errorf("Get on the lost connection: %v, want ErrPeerGone", err)
	}
	checkUnpinned(t)
	if st := stats(t); st.Peers != 0 {
		t.Errorf("guest 2 with guest 1's link down: %+v, want no peer", st)
	}
	await(t, ctx, "lnk-back")
	back := time.Now()
	try, cancelTry := context.WithTimeout(ctx, bounceDial)
	again, err := s.Dial(try, server)
	cancelTry()
	if err != nil {
		t.Fatalf("Dial over guest 1's device once its link was back: %v after %v; the device takes no rdma_cm connection (its QP1 failed: a connection manager message sent while its link was down, see bounceDial)",
			err, time.Since(back).Round(time.Millisecond))
	}
	t.Logf("connected again over the same device %v after guest 1's port was back", time.Since(back).Round(time.Millisecond))
	got := make([]byte, getN)
	if m, err := again.Get(ctx, got, tok, getN); err != nil || m != getN || !bytes.Equal(got, want[getN:2*getN]) {
		t.Fatalf("Get of 8 MiB over the new connection: %d, %v (bytes equal: %v)", m, err, bytes.Equal(got, want[getN:2*getN]))
	}
	checkUnpinned(t)
	signal(t, "lnk-done")
	await(t, ctx, "lnk-checked")
}
