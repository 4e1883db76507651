package sockets

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// RDMA devices being removed.
//
// rxe, like every driver without disassociate_ucontext, cannot take a
// device away from a process that holds it open: the kernel's removal
// (`rdma link delete`, a driver unbound) waits in the uverbs client until
// every process closed its /dev/infiniband/uverbsN. That client first
// deletes the character device, and its uevent (action remove, subsystem
// infiniband_verbs) is the first sign userspace gets. The broker listens
// for it and tells every process (DEVICE), which demotes the connections
// attached through the device and closes it, so that the removal ends
// and the bytes go on over TCP.

// sysVerbs is where the uverbs character devices name their RDMA device.
const sysVerbs = "/sys/class/infiniband_verbs"

// devWatch reads the kernel's uevents.
type devWatch struct {
	f     *os.File
	root  string            // sysVerbs, or a test's
	names map[string]string // uverbsN to its RDMA device, for removals to come
}

// openDevWatch subscribes to the kernel's uevents (no privilege needed)
// and notes the uverbs devices there are now.
func openDevWatch(root string) (*devWatch, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK,
		unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, fmt.Errorf("uevent socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("uevent socket: bind: %w", err)
	}
	w := &devWatch{f: os.NewFile(uintptr(fd), "uevents"), root: root, names: map[string]string{}}
	if ents, err := os.ReadDir(root); err == nil {
		for _, e := range ents {
			w.note(e.Name())
		}
	}
	return w, nil
}

// note remembers which RDMA device the uverbs device node belongs to.
func (w *devWatch) note(node string) {
	b, err := os.ReadFile(filepath.Join(w.root, node, "ibdev"))
	if name := strings.TrimSpace(string(b)); err == nil && name != "" {
		w.names[node] = name
	}
}

// next blocks until an RDMA device is being removed and returns its
// name; an error once the watch is closed.
func (w *devWatch) next() (string, error) {
	buf := make([]byte, 16<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) { // events were lost: look again
				continue
			}
			return "", err
		}
		action, subsystem, devpath := parseUevent(buf[:n])
		if subsystem != "infiniband_verbs" || devpath == "" {
			continue
		}
		node := path.Base(devpath)
		switch action {
		case "add":
			w.note(node)
		case "remove":
			name := w.names[node]
			delete(w.names, node)
			if name != "" {
				return name, nil
			}
		}
	}
}

// Close ends the watch; next returns an error.
func (w *devWatch) Close() error { return w.f.Close() }

// parseUevent reads a kernel uevent: "action@devpath" then KEY=VALUE
// strings, each ending in a NUL. Anything else (udev's re-broadcasts
// start "libudev") gives empty strings.
func parseUevent(b []byte) (action, subsystem, devpath string) {
	fields := bytes.Split(b, []byte{0})
	if len(fields) == 0 || !bytes.Contains(fields[0], []byte{'@'}) {
		return "", "", ""
	}
	for _, f := range fields[1:] {
		k, v, ok := bytes.Cut(f, []byte{'='})
		if !ok {
			continue
		}
		switch string(k) {
		case "ACTION":
			action = string(v)
		case "SUBSYSTEM":
			subsystem = string(v)
		case "DEVPATH":
			devpath = string(v)
		}
	}
	return action, subsystem, devpath
}

// watchDevices tells the broker's processes of every RDMA device being
// removed until the broker closes. Without uevents (a sandbox without
// netlink) it logs once: removals then wait for the processes to end.
func (b *Broker) watchDevices(root string) {
	w, err := openDevWatch(root)
	if err != nil {
		b.log.Warn("sockets: cannot watch for RDMA devices being removed; their removal will wait for the processes that use them", "err", err)
		return
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		w.Close()
		return
	}
	b.devWatch = w
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		for {
			name, err := w.next()
			if err != nil {
				return
			}
			b.deviceGone(name)
		}
	}()
}

// deviceGone tells every connected process but `rvmad sockets` listings
// that the RDMA device name is being removed.
func (b *Broker) deviceGone(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rec := sockwire.Device{Epoch: b.devNotices + 1, Name: name}
	if _, err := sockwire.Append(nil, rec); err != nil {
		b.log.Warn("sockets: an RDMA device being removed has a name the protocol cannot carry", "device", name)
		return
	}
	b.devNotices++
	n := 0
	for c := range b.clients {
		if !c.listing {
			c.send(message{rec: rec})
			n++
		}
	}
	b.log.Info("sockets: RDMA device being removed; its connections demote to TCP", "device", name, "processes", n)
}
