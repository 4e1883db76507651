package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// When a guest's kernel reports its NIC stalled (nicStall), the lab looks
// at everything that could hold the frames (qemu's virtio device and its
// netdev, the hub, the host's sockets), twice a few seconds apart, and
// keeps what it saw in the guest's nicstall.txt:
//   - qemu's virtio transmit queue (the monitor's info virtio-queue-status):
//     whether the guest made buffers available that qemu did not take
//     (last_avail_idx behind avail), took without completing (inuse), or
//     completed without telling the guest (used_idx against signalled);
//   - qemu's stream netdev (info network);
//   - the hub (hub.report): whether it still reads the guest's frames, and
//     whether a write to any guest is blocked;
//   - the host's Unix sockets of the boot (ss), with their queues.
// docs/lab.md, "A guest NIC that stops sending, and its retry", says what
// the runs have shown.

// monitorAddr is where guest i's qemu monitor listens in the boot's
// socket directory.
func monitorAddr(dir string, i int) string {
	return filepath.Join(dir, fmt.Sprintf("mon%d.sock", i))
}

// nicID is the qemu id of every guest's NIC; its virtio device is at
// nicPath in qemu's object tree.
const (
	nicID   = "nic0"
	nicPath = "/machine/peripheral/" + nicID + "/virtio-backend"
)

// probeGap is the time between the two looks at a stalled NIC.
const probeGap = 3 * time.Second

// probeNICStall looks at guest i's stalled NIC twice, probeGap apart, and
// writes what it saw to path. It returns a one-line summary for the run's
// output.
func probeNICStall(sockDir string, i int, h *hub, path string) string {
	var b strings.Builder
	var tx [2]string
	for round := range 2 {
		if round > 0 {
			time.Sleep(probeGap)
		}
		now := time.Now()
		fmt.Fprintf(&b, "=== look %d at %s\n", round+1, now.Format(time.RFC3339Nano))
		out, err := hmp(monitorAddr(sockDir, i), []string{
			"info virtio-queue-status " + nicPath + " 1", // transmit
			"info virtio-queue-status " + nicPath + " 0", // receive
			"info network",
		}, 5*time.Second)
		if err != nil {
			fmt.Fprintf(&b, "monitor: %v\n", err)
		}
		b.WriteString(out)
		tx[round] = queueIndices(out)
		if cmds := ringReads(out); cmds != nil {
			out, err := hmp(monitorAddr(sockDir, i), cmds, 5*time.Second)
			if err != nil {
				fmt.Fprintf(&b, "monitor: %v\n", err)
			}
			b.WriteString(out)
		}
		b.WriteString(h.report(now))
		b.WriteString(unixSockets(sockDir))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Sprintf("writing %s: %v", path, err)
	}
	return fmt.Sprintf("transmit queue %s, then %s (all of it in %s)", tx[0], tx[1], path)
}

// probeSet runs the looks at stalled NICs of one boot, each on its own
// goroutine, until wait: the boot then waits for those under way, and
// starts no more (its qemus and hub are going away).
type probeSet struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (p *probeSet) run(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
}

func (p *probeSet) wait() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
}

// hmp runs commands on a qemu human monitor at addr and returns what it
// printed (echoes, prompts and terminal escapes removed).
func hmp(addr string, cmds []string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("unix", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	if _, err := readPrompt(r); err != nil { // the banner
		return "", fmt.Errorf("monitor banner: %w", err)
	}
	var out strings.Builder
	for _, cmd := range cmds {
		if _, err := fmt.Fprintf(c, "%s\n", cmd); err != nil {
			return out.String(), err
		}
		text, err := readPrompt(r)
		fmt.Fprintf(&out, "(qemu) %s\n%s", cmd, cleanMonitor(text, cmd))
		if err != nil {
			return out.String(), fmt.Errorf("%s: %w", cmd, err)
		}
	}
	return out.String(), nil
}

const monitorPrompt = "(qemu) "

// readPrompt reads up to and without the monitor's next prompt.
func readPrompt(r *bufio.Reader) (string, error) {
	var buf bytes.Buffer
	for {
		c, err := r.ReadByte()
		if err != nil {
			return buf.String(), err
		}
		buf.WriteByte(c)
		if bytes.HasSuffix(buf.Bytes(), []byte(monitorPrompt)) {
			return strings.TrimSuffix(buf.String(), monitorPrompt), nil
		}
	}
}

// terminalEscape matches the cursor movements qemu's readline sends.
var terminalEscape = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// cleanMonitor removes terminal escapes, carriage returns and the echo of
// cmd from a monitor reply. The echo is one line: readline redraws the
// command as it takes each character ("iininf...info network").
func cleanMonitor(text, cmd string) string {
	text = strings.ReplaceAll(terminalEscape.ReplaceAllString(text, ""), "\r", "")
	var b strings.Builder
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimRight(l, " "); l == "" || strings.HasSuffix(l, cmd) {
			continue
		}
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// ringReads returns the monitor commands that read the transmit ring's
// shared words from guest memory, given info virtio-queue-status's reply
// (the transmit queue's first): the avail ring's flags and index (what
// the guest made available, and whether it wants interrupts), the used
// ring's flags and index (what qemu completed, and whether it wants
// kicks), and with event indices the guest's used_event and qemu's
// avail_event.
func ringReads(out string) []string {
	var num, avail, used uint64
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		var dst *uint64
		switch f[0] {
		case "num:":
			dst = &num
		case "avail:":
			dst = &avail
		case "used:":
			dst = &used
		}
		if dst != nil && *dst == 0 {
			fmt.Sscan(f[1], dst)
		}
	}
	if num == 0 || avail == 0 || used == 0 {
		return nil
	}
	return []string{
		fmt.Sprintf("xp /2hx %#x", avail),         // avail flags, idx
		fmt.Sprintf("xp /2hx %#x", used),          // used flags, idx
		fmt.Sprintf("xp /1hx %#x", avail+4+2*num), // used_event
		fmt.Sprintf("xp /1hx %#x", used+4+8*num),  // avail_event
	}
}

// queueIndices picks the indices out of info virtio-queue-status's reply
// for one queue (the first in out), for a one-line summary.
func queueIndices(out string) string {
	var parts []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && (strings.HasSuffix(f[0], "_idx:") || f[0] == "inuse:") {
			parts = append(parts, strings.TrimSuffix(f[0], ":")+"="+f[1])
		}
		if strings.HasPrefix(l, "(qemu) info virtio-queue-status") && len(parts) > 0 {
			break // the next queue's
		}
	}
	if len(parts) == 0 {
		return "unknown"
	}
	return strings.Join(parts, " ")
}

// unixSockets lists the host's Unix sockets of the boot (those of its
// socket directory and of qemu), with their queues, as ss shows them.
func unixSockets(sockDir string) string {
	out, err := exec.Command("ss", "-xap").Output()
	if err != nil {
		return fmt.Sprintf("ss: %v\n", err)
	}
	var b strings.Builder
	b.WriteString("ss -xap (the boot's sockets):\n")
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, sockDir) || strings.Contains(l, "qemu-system") || strings.Contains(l, "Recv-Q") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
