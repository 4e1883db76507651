package sysfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// DeviceInfo is the device-wide attributes of an RDMA device. A field a
// driver does not offer is empty.
type DeviceInfo struct {
	Name         string `json:"name"`
	NodeType     string `json:"node_type,omitempty"`      // "1: CA"
	NodeGUID     string `json:"node_guid,omitempty"`      // "5054:00ff:fe12:3456"
	SysImageGUID string `json:"sys_image_guid,omitempty"` // as node_guid
	FWVersion    string `json:"fw_ver,omitempty"`
	NodeDesc     string `json:"node_desc,omitempty"`
	HCAType      string `json:"hca_type,omitempty"`
	BoardID      string `json:"board_id,omitempty"`
	// Parent is the network device a software device (rxe, siw) is bound
	// to; hardware devices have none.
	Parent string `json:"parent,omitempty"`
}

// Device reads dev's attributes. It fails with ErrNoDevice when dev does not
// exist and when an attribute exists but cannot be read.
func (f FS) Device(dev string) (DeviceInfo, error) {
	ok, err := f.HasDevice(dev)
	if err != nil {
		return DeviceInfo{}, err
	}
	if !ok {
		return DeviceInfo{}, fmt.Errorf("%s: %w", dev, ErrNoDevice)
	}
	d := DeviceInfo{Name: dev}
	dir := f.DeviceDir(dev)
	var errs []error
	for _, a := range []struct {
		file string
		dst  *string
	}{
		{"node_type", &d.NodeType}, {"node_guid", &d.NodeGUID}, {"sys_image_guid", &d.SysImageGUID},
		{"fw_ver", &d.FWVersion}, {"node_desc", &d.NodeDesc}, {"hca_type", &d.HCAType},
		{"board_id", &d.BoardID}, {"parent", &d.Parent},
	} {
		v, err := readOptional(filepath.Join(dir, a.file))
		if err != nil {
			errs = append(errs, fmt.Errorf("sysfs: %w", err))
		}
		*a.dst = v
	}
	return d, errors.Join(errs...)
}

// Port states as the kernel numbers them (enum ib_port_state).
const (
	PortDown        = 1
	PortInit        = 2
	PortArmed       = 3
	PortActive      = 4
	PortActiveDefer = 5
)

// PortInfo is the state of one port.
type PortInfo struct {
	Device string `json:"device"`
	Port   int    `json:"port"`
	// State is the numeric port state (PortDown ... PortActiveDefer),
	// StateName the kernel's word for it ("ACTIVE").
	State     int    `json:"state"`
	StateName string `json:"state_name"`
	// PhysState is the numeric physical state (5 = LinkUp).
	PhysState     int    `json:"phys_state"`
	PhysStateName string `json:"phys_state_name"`
	// Rate is the kernel's text ("10 Gb/sec (4X QDR)"), RateBytes the same in
	// bytes per second (0 when the text cannot be parsed). Port leaves them
	// empty: see PortRate.
	Rate      string  `json:"rate"`
	RateBytes float64 `json:"rate_bytes_per_second"`
	LinkLayer string  `json:"link_layer"` // "Ethernet" or "InfiniBand"
	// Netdev is the network device of a RoCE port (the netdev of its first
	// GID, else the device's parent); empty for InfiniBand.
	Netdev string `json:"netdev,omitempty"`
	// NetdevMTU is the MTU of Netdev in bytes, 0 when unknown.
	NetdevMTU int `json:"netdev_mtu,omitempty"`
	// ActiveMTU is the RDMA path MTU of a SoftRoCE (rxe) port, derived from
	// NetdevMTU with rxe's own rule; 0 for other drivers, whose rule differs.
	ActiveMTU int `json:"active_mtu,omitempty"`
}

// Active reports whether the port is ACTIVE (or ACTIVE_DEFER).
func (p PortInfo) Active() bool { return p.State == PortActive || p.State == PortActiveDefer }

// Port reads the state of dev's port, without its rate (see PortRate). It
// fails when the port does not exist or its state files are unreadable or
// malformed.
func (f FS) Port(dev string, port int) (PortInfo, error) {
	dir := f.PortDir(dev, port)
	p := PortInfo{Device: dev, Port: port}
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if ok, _ := f.HasDevice(dev); !ok {
				return p, fmt.Errorf("%s: %w", dev, ErrNoDevice)
			}
			return p, fmt.Errorf("%s has no port %d", dev, port)
		}
		return p, fmt.Errorf("sysfs: %w", err)
	}
	var err error
	if p.State, p.StateName, err = readNumbered(filepath.Join(dir, "state")); err != nil {
		return p, err
	}
	if p.PhysState, p.PhysStateName, err = readNumbered(filepath.Join(dir, "phys_state")); err != nil {
		return p, err
	}
	if p.LinkLayer, err = readOptional(filepath.Join(dir, "link_layer")); err != nil {
		return p, fmt.Errorf("sysfs: %w", err)
	}
	if p.LinkLayer == "Ethernet" {
		p.Netdev = f.portNetdev(dev, port)
		if p.Netdev != "" {
			if mtu, err := f.NetdevMTU(p.Netdev); err == nil {
				p.NetdevMTU = mtu
				if parent, _ := readOptional(filepath.Join(f.DeviceDir(dev), "parent")); parent != "" {
					p.ActiveMTU = RXEActiveMTU(mtu)
				}
			}
		}
	}
	return p, nil
}

// PortRate reads the rate of dev's port: the kernel's text and bytes per
// second. Reading it makes the kernel query the netdev of a RoCE port, and
// a netdev of unknown speed (virtio-net) logs "speed is unknown" in the
// kernel log each time: do not read it at every scrape. It fails when the
// file cannot be read, or its text is not "<N> Gb/sec ...".
func (f FS) PortRate(dev string, port int) (string, float64, error) {
	s, err := readAttr(filepath.Join(f.PortDir(dev, port), "rate"))
	if err != nil {
		return "", 0, fmt.Errorf("sysfs: %w", err)
	}
	b, err := ParseRate(s)
	return s, b, err
}

// portNetdev finds a RoCE port's netdev: that of GID 0, else of the lowest
// GID that has one, else the device's parent.
func (f FS) portNetdev(dev string, port int) string {
	ndevs := filepath.Join(f.PortDir(dev, port), "gid_attrs", "ndevs")
	if s, err := readAttr(filepath.Join(ndevs, "0")); err == nil && s != "" {
		return s
	}
	if ents, err := os.ReadDir(ndevs); err == nil {
		idx := make([]int, 0, len(ents))
		for _, e := range ents {
			if n, err := strconv.Atoi(e.Name()); err == nil {
				idx = append(idx, n)
			}
		}
		sort.Ints(idx)
		for _, i := range idx {
			if s, err := readAttr(filepath.Join(ndevs, strconv.Itoa(i))); err == nil && s != "" {
				return s
			}
		}
	}
	s, _ := readOptional(filepath.Join(f.DeviceDir(dev), "parent"))
	return s
}

// NetdevMTU reads <root>/class/net/<netdev>/mtu. It fails with ErrNoNetdev
// when the netdev does not exist.
func (f FS) NetdevMTU(netdev string) (int, error) {
	s, err := readAttr(filepath.Join(f.Root, "class", "net", netdev, "mtu"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("%s: %w", netdev, ErrNoNetdev)
	}
	if err != nil {
		return 0, fmt.Errorf("sysfs: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("sysfs: mtu of %s: %w", netdev, err)
	}
	return n, nil
}

// NetdevSpeedKnown reports whether the netdev reports a link speed
// (<root>/class/net/<netdev>/speed is a non-negative number). virtio-net
// does not unless given one (ethtool -s DEV speed N duplex full, or qemu's
// virtio-net-pci speed=N,duplex=full); the kernel then logs "speed is
// unknown" at every query of an RoCE port over it.
func (f FS) NetdevSpeedKnown(netdev string) bool {
	s, err := readAttr(filepath.Join(f.Root, "class", "net", netdev, "speed"))
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	return err == nil && n >= 0
}

// HasNetdev reports whether the network device exists under <root>/class/net.
func (f FS) HasNetdev(netdev string) bool {
	_, err := os.Stat(filepath.Join(f.Root, "class", "net", netdev))
	return err == nil
}

// rxeMaxHdrLength is RXE_MAX_HDR_LENGTH (rxe_param.h): what rxe subtracts
// from the netdev MTU before choosing its path MTU; 1500 gives 1024.
const rxeMaxHdrLength = 80

// RXEActiveMTU returns the IB path MTU (256 ... 4096) rxe runs at over a
// netdev of the given MTU (rxe_set_mtu: never below 256).
func RXEActiveMTU(netdevMTU int) int {
	avail := netdevMTU - rxeMaxHdrLength
	for _, m := range []int{4096, 2048, 1024, 512} {
		if avail >= m {
			return m
		}
	}
	return 256
}

// readNumbered parses attributes of the form "4: ACTIVE".
func readNumbered(path string) (int, string, error) {
	s, err := readAttr(path)
	if err != nil {
		return 0, "", fmt.Errorf("sysfs: %w", err)
	}
	num, name, _ := strings.Cut(s, ":")
	n, err := strconv.Atoi(strings.TrimSpace(num))
	if err != nil {
		return 0, "", fmt.Errorf("sysfs: %s: %q is not \"<number>: <NAME>\"", path, s)
	}
	return n, strings.TrimSpace(name), nil
}

// ParseRate converts the kernel's rate text ("100 Gb/sec (4X EDR)",
// "2.5 Gb/sec (1X SDR)") into bytes per second. It fails on any other form.
func ParseRate(s string) (float64, error) {
	f := strings.Fields(s)
	if len(f) < 2 || f[1] != "Gb/sec" {
		return 0, fmt.Errorf("rate %q is not \"<N> Gb/sec ...\"", s)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("rate %q: bad number", s)
	}
	return v * 1e9 / 8, nil
}
