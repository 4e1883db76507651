package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// DeviceInfo describes an RDMA device found by Devices.
type DeviceInfo struct {
	Name     string // kernel name, e.g. "rxe0"
	GUID     uint64 // node GUID (host byte order)
	NodeType int    // enum ibv_node_type (1 = CA, 4 = RNIC)
}

// Devices lists the RDMA devices of the host. It returns an empty list and
// no error when there are none, also when the kernel has no RDMA support
// (ENOSYS); otherwise an error is an *OpError with the errno of
// ibv_get_device_list.
func Devices() ([]DeviceInfo, error) {
	var n C.int
	list, errno := C.ibv_get_device_list(&n)
	if list == nil {
		if errno == syscall.ENOSYS {
			return nil, nil
		}
		return nil, &OpError{Op: "ibv_get_device_list", Err: errno}
	}
	defer C.ibv_free_device_list(list)
	devs := unsafe.Slice(list, int(n))
	out := make([]DeviceInfo, 0, len(devs))
	for _, d := range devs {
		out = append(out, DeviceInfo{
			Name:     C.GoString(C.ibv_get_device_name(d)),
			GUID:     be64(uint64(C.ibv_get_device_guid(d))),
			NodeType: int(d.node_type),
		})
	}
	return out, nil
}

// be64 converts a __be64 value read as a host integer into its numeric value.
func be64(v uint64) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	return binary.BigEndian.Uint64(b[:])
}

// Context is an open RDMA device (struct ibv_context). It is the root of
// the object tree: Close closes every PD, CQ, completion channel and
// everything below them first (each object after its children, siblings
// newest first; so every QP before its CQs and PD), then the device.
type Context struct {
	n     node
	c     *C.struct_ibv_context
	name  string
	owned bool // false for contexts owned by librdmacm

	regMu sync.Mutex
	qps   map[uintptr]*QP
	cqs   map[uintptr]*CQ
	srqs  map[uintptr]*SRQ

	async *pollFD // the async event fd on the netpoller

	// events read by readAsync for WaitAsyncEvent
	asyncMu      sync.Mutex
	asyncQ       []AsyncEvent
	asyncDropped uint64
	asyncErr     error         // why readAsync stopped
	asyncWake    chan struct{} // an event was queued
	asyncDone    chan struct{} // readAsync stopped

	chainOnce sync.Once
	chains    bool // ChainsType1Binds
}

// Open opens the device with the given name ("" opens the first device).
// It fails with an error wrapping ErrNoDevice when there is no such device,
// or an *OpError from ibv_open_device.
func Open(name string) (*Context, error) {
	var n C.int
	list, errno := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, fmt.Errorf("%w: %w", ErrNoDevice, &OpError{Op: "ibv_get_device_list", Err: errno})
	}
	defer C.ibv_free_device_list(list)
	for _, d := range unsafe.Slice(list, int(n)) {
		dn := C.GoString(C.ibv_get_device_name(d))
		if name != "" && dn != name {
			continue
		}
		c, errno := C.ibv_open_device(d)
		if c == nil {
			return nil, &OpError{Op: "ibv_open_device " + dn, Err: errno}
		}
		ctx, err := newContext(c, dn, true)
		if err != nil {
			C.ibv_close_device(c)
			return nil, err
		}
		return ctx, nil
	}
	if name == "" {
		return nil, fmt.Errorf("%w: the host has no RDMA device", ErrNoDevice)
	}
	return nil, fmt.Errorf("%w: %q", ErrNoDevice, name)
}

func newContext(c *C.struct_ibv_context, name string, owned bool) (*Context, error) {
	ctx := &Context{c: c, name: name, owned: owned,
		qps: map[uintptr]*QP{}, cqs: map[uintptr]*CQ{}, srqs: map[uintptr]*SRQ{}}
	p, err := newPollFD(int(c.async_fd), name+" async events")
	if err != nil {
		return nil, err
	}
	ctx.async = p
	ctx.asyncWake = make(chan struct{}, 1)
	ctx.asyncDone = make(chan struct{})
	ctx.n.init("device context", ctx.destroy)
	ctx.n.preclose = func() { p.close() }
	go ctx.readAsync()
	return ctx, nil
}

func (c *Context) destroy() error {
	if !c.owned {
		return nil
	}
	if rc := C.ibv_close_device(c.c); rc != 0 {
		return opErr("ibv_close_device", int(C.shim_errno()))
	}
	return nil
}

// Close closes every object created from the context and then the device.
// It is idempotent; errors from destroying children are joined.
func (c *Context) Close() error { return c.n.close() }

// Name returns the device name.
func (c *Context) Name() string { return c.name }

// ChainsType1Binds reports whether QP.BindMWs may post type 1 memory
// window binds as a chain of work requests on this device: true for
// rdma_rxe (SoftRoCE), whose provider implements ibv_bind_mw as exactly
// such a post, told by the "parent" attribute only rxe gives its devices
// in sysfs. Devices it cannot recognise report false.
func (c *Context) ChainsType1Binds() bool {
	c.chainOnce.Do(func() {
		_, err := os.Stat(filepath.Join("/sys/class/infiniband", c.name, "parent"))
		c.chains = err == nil && c.name != "" && !strings.ContainsRune(c.name, '/')
	})
	return c.chains
}

// CPtr returns the underlying struct ibv_context pointer for code that
// calls libibverbs directly. It stays valid until Close.
func (c *Context) CPtr() unsafe.Pointer { return unsafe.Pointer(c.c) }

// AtomicCap is the device's atomic operations capability.
type AtomicCap int

// Atomic capabilities (enum ibv_atomic_cap).
const (
	AtomicNone AtomicCap = 0
	AtomicHCA  AtomicCap = 1
	AtomicGlob AtomicCap = 2
)

// Device capability flags (a subset of enum ibv_device_cap_flags).
const (
	DevCapMemWindow        = 1 << 17
	DevCapMemWindowType2A  = 1 << 23
	DevCapMemWindowType2B  = 1 << 24
	DevCapMemMgtExtensions = 1 << 21
)

// DeviceAttr is what QueryDevice reports (struct ibv_device_attr_ex).
type DeviceAttr struct {
	FirmwareVersion  string
	NodeGUID         uint64
	SysImageGUID     uint64
	MaxMRSize        uint64
	PageSizeCap      uint64
	VendorID         uint32
	VendorPartID     uint32
	HWVersion        uint32
	MaxQP            int
	MaxQPWR          int
	CapFlags         uint64 // device_cap_flags | device_cap_flags_ex
	MaxSGE           int
	MaxSGERd         int
	MaxCQ            int
	MaxCQE           int
	MaxMR            int
	MaxPD            int
	MaxQPRdAtom      int
	MaxQPInitRdAtom  int
	AtomicCap        AtomicCap
	MaxMW            int
	MaxAH            int
	MaxSRQ           int
	MaxSRQWR         int
	MaxSRQSGE        int
	MaxPkeys         int
	LocalCAAckDelay  int
	PhysPortCount    int
	ODPGeneralCaps   uint64 // bit 0: ODP supported
	ODPRCCaps        uint32
	ODPUDCaps        uint32
	CompletionTSMask uint64
	HCACoreClock     uint64
}

// HasODP reports whether the device supports on-demand paging.
func (a *DeviceAttr) HasODP() bool { return a.ODPGeneralCaps&1 != 0 }

// HasMemoryWindows reports whether the device supports memory windows
// (type 1; type 2 when DevCapMemWindowType2A or 2B is also set).
func (a *DeviceAttr) HasMemoryWindows() bool { return a.CapFlags&DevCapMemWindow != 0 }

// HasAtomics reports whether remote atomics are available.
func (a *DeviceAttr) HasAtomics() bool { return a.AtomicCap != AtomicNone }

// QueryDevice returns the device attributes, extended ones included when the
// provider reports them. Errors wrap ErrClosed or the errno of
// ibv_query_device_ex.
func (c *Context) QueryDevice() (*DeviceAttr, error) {
	if err := c.n.use("Context.QueryDevice"); err != nil {
		return nil, err
	}
	defer c.n.unuse()
	var x C.struct_ibv_device_attr_ex
	if rc := C.shim_query_device_ex(c.c, &x); rc != 0 {
		return nil, opErr("ibv_query_device_ex", int(rc))
	}
	o := &x.orig_attr
	return &DeviceAttr{
		FirmwareVersion:  C.GoString(&o.fw_ver[0]),
		NodeGUID:         be64(uint64(o.node_guid)),
		SysImageGUID:     be64(uint64(o.sys_image_guid)),
		MaxMRSize:        uint64(o.max_mr_size),
		PageSizeCap:      uint64(o.page_size_cap),
		VendorID:         uint32(o.vendor_id),
		VendorPartID:     uint32(o.vendor_part_id),
		HWVersion:        uint32(o.hw_ver),
		MaxQP:            int(o.max_qp),
		MaxQPWR:          int(o.max_qp_wr),
		CapFlags:         uint64(o.device_cap_flags) | uint64(x.device_cap_flags_ex),
		MaxSGE:           int(o.max_sge),
		MaxSGERd:         int(o.max_sge_rd),
		MaxCQ:            int(o.max_cq),
		MaxCQE:           int(o.max_cqe),
		MaxMR:            int(o.max_mr),
		MaxPD:            int(o.max_pd),
		MaxQPRdAtom:      int(o.max_qp_rd_atom),
		MaxQPInitRdAtom:  int(o.max_qp_init_rd_atom),
		AtomicCap:        AtomicCap(o.atomic_cap),
		MaxMW:            int(o.max_mw),
		MaxAH:            int(o.max_ah),
		MaxSRQ:           int(o.max_srq),
		MaxSRQWR:         int(o.max_srq_wr),
		MaxSRQSGE:        int(o.max_srq_sge),
		MaxPkeys:         int(o.max_pkeys),
		LocalCAAckDelay:  int(o.local_ca_ack_delay),
		PhysPortCount:    int(o.phys_port_cnt),
		ODPGeneralCaps:   uint64(x.odp_caps.general_caps),
		ODPRCCaps:        uint32(x.odp_caps.per_transport_caps.rc_odp_caps),
		ODPUDCaps:        uint32(x.odp_caps.per_transport_caps.ud_odp_caps),
		CompletionTSMask: uint64(x.completion_timestamp_mask),
		HCACoreClock:     uint64(x.hca_core_clock),
	}, nil
}

// PortState is the logical state of a port (enum ibv_port_state).
type PortState int

// Port states.
const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortNop:
		return "NOP"
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	case PortActiveDefer:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("PortState(%d)", int(s))
}

// Link layers reported in PortAttr.LinkLayer.
const (
	LinkLayerUnspecified = 0
	LinkLayerInfiniBand  = 1
	LinkLayerEthernet    = 2
)

// PortAttr is what QueryPort reports (struct ibv_port_attr).
type PortAttr struct {
	State       PortState
	MaxMTU      MTU
	ActiveMTU   MTU
	GIDTableLen int
	CapFlags    uint32
	MaxMsgSize  uint32
	LID         uint16
	SMLID       uint16
	LMC         uint8
	ActiveWidth uint8 // encoded as in verbs: 1=1x, 2=4x, 4=8x, 8=12x, 16=2x
	ActiveSpeed uint8 // encoded as in verbs: 1=SDR ... 128=NDR
	PhysState   uint8
	LinkLayer   uint8
}

// Gbps returns the port's signalling rate in Gb/s computed from the active
// width and speed, or 0 when they are unknown.
func (p *PortAttr) Gbps() float64 { return LinkGbps(p.ActiveWidth, p.ActiveSpeed) }

// LinkGbps converts the verbs encodings of link width and speed into Gb/s
// (0 for unknown encodings).
func LinkGbps(width, speed uint8) float64 {
	lanes := map[uint8]float64{1: 1, 2: 4, 4: 8, 8: 12, 16: 2}[width]
	perLane := map[uint8]float64{1: 2.5, 2: 5, 4: 10, 8: 10.3125, 16: 14.0625, 32: 25.78125, 64: 53.125, 128: 106.25}[speed]
	return lanes * perLane
}

// QueryPort returns the attributes of port (ports count from 1). Errors wrap
// ErrClosed or the errno of ibv_query_port (EINVAL for a bad port).
func (c *Context) QueryPort(port int) (*PortAttr, error) {
	if err := c.n.use("Context.QueryPort"); err != nil {
		return nil, err
	}
	defer c.n.unuse()
	var a C.struct_ibv_port_attr
	if rc := C.shim_query_port(c.c, C.uint8_t(port), &a); rc != 0 {
		return nil, opErr(fmt.Sprintf("ibv_query_port %d", port), int(rc))
	}
	return &PortAttr{
		State: PortState(a.state), MaxMTU: MTU(a.max_mtu), ActiveMTU: MTU(a.active_mtu),
		GIDTableLen: int(a.gid_tbl_len), CapFlags: uint32(a.port_cap_flags),
		MaxMsgSize: uint32(a.max_msg_sz), LID: uint16(a.lid), SMLID: uint16(a.sm_lid),
		LMC: uint8(a.lmc), ActiveWidth: uint8(a.active_width), ActiveSpeed: uint8(a.active_speed),
		PhysState: uint8(a.phys_state), LinkLayer: uint8(a.link_layer),
	}, nil
}

// GIDType is the type of a GID table entry.
type GIDType int

// GID types (enum ibv_gid_type).
const (
	GIDTypeIB     GIDType = 0
	GIDTypeRoCEv1 GIDType = 1
	GIDTypeRoCEv2 GIDType = 2
)

func (t GIDType) String() string {
	switch t {
	case GIDTypeIB:
		return "IB"
	case GIDTypeRoCEv1:
		return "RoCE v1"
	case GIDTypeRoCEv2:
		return "RoCE v2"
	}
	return fmt.Sprintf("GIDType(%d)", int(t))
}

// GID is a 128-bit global identifier, in network byte order.
type GID [16]byte

// IP returns the GID as an IP address (IPv4-mapped GIDs give an IPv4 address).
func (g GID) IP() net.IP { return net.IP(g[:]) }

func (g GID) String() string { return g.IP().String() }

// IsZero reports whether the GID is all zeros (an empty table slot).
func (g GID) IsZero() bool { return g == GID{} }

// GIDFromIP returns the GID that RoCE v2 uses for ip: IPv4 addresses are
// IPv4-mapped (::ffff:a.b.c.d). It returns false for an invalid address.
func GIDFromIP(ip net.IP) (GID, bool) {
	var g GID
	ip16 := ip.To16()
	if ip16 == nil {
		return g, false
	}
	copy(g[:], ip16)
	return g, true
}

// GIDEntry is one valid entry of a port's GID table.
type GIDEntry struct {
	GID     GID
	Index   int
	Port    int
	Type    GIDType
	IfIndex int    // network interface index (0 for IB)
	Netdev  string // network interface name ("" if unknown)
}

// GIDs returns every valid GID table entry of every port, with its type and
// network device. Errors wrap ErrClosed or the errno of ibv_query_gid_table.
func (c *Context) GIDs() ([]GIDEntry, error) {
	if err := c.n.use("Context.GIDs"); err != nil {
		return nil, err
	}
	defer c.n.unuse()
	const max = 1024
	buf := (*[max]C.struct_ibv_gid_entry)(C.calloc(max, C.size_t(unsafe.Sizeof(C.struct_ibv_gid_entry{}))))
	if buf == nil {
		return nil, opErr("calloc", int(syscall.ENOMEM))
	}
	defer C.free(unsafe.Pointer(buf))
	rc := C.shim_query_gid_table(c.c, &buf[0], max)
	if rc < 0 {
		return nil, opErr("ibv_query_gid_table", int(-rc))
	}
	out := make([]GIDEntry, 0, int(rc))
	for _, e := range buf[:int(rc)] {
		g := GIDEntry{Index: int(e.gid_index), Port: int(e.port_num), Type: GIDType(e.gid_type), IfIndex: int(e.ndev_ifindex)}
		copy(g.GID[:], C.GoBytes(unsafe.Pointer(&e.gid), 16))
		if g.IfIndex != 0 {
			if ifc, err := net.InterfaceByIndex(g.IfIndex); err == nil {
				g.Netdev = ifc.Name
			}
		}
		out = append(out, g)
	}
	return out, nil
}

// RoCEv2GID returns the RoCE v2 GID entry of port for the IP address ip.
// With a nil ip it returns the first RoCE v2 entry that carries an IPv4
// address, else the first RoCE v2 entry. It fails with ErrNoDevice when no
// entry matches.
func (c *Context) RoCEv2GID(port int, ip net.IP) (GIDEntry, error) {
	all, err := c.GIDs()
	if err != nil {
		return GIDEntry{}, err
	}
	return PickRoCEv2GID(all, port, ip)
}

// PickRoCEv2GID chooses from entries the RoCE v2 GID of port for ip, as
// Context.RoCEv2GID does.
func PickRoCEv2GID(entries []GIDEntry, port int, ip net.IP) (GIDEntry, error) {
	var want GID
	if ip != nil {
		var ok bool
		if want, ok = GIDFromIP(ip); !ok {
			return GIDEntry{}, invalid("bad IP address %v", ip)
		}
	}
	var first *GIDEntry
	for i := range entries {
		e := &entries[i]
		if e.Port != port || e.Type != GIDTypeRoCEv2 || e.GID.IsZero() {
			continue
		}
		if ip != nil {
			if e.GID == want {
				return *e, nil
			}
			continue
		}
		if e.GID.IP().To4() != nil {
			return *e, nil
		}
		if first == nil {
			first = e
		}
	}
	if first != nil {
		return *first, nil
	}
	if ip != nil {
		return GIDEntry{}, fmt.Errorf("%w: no RoCE v2 GID for %v on port %d", ErrNoDevice, ip, port)
	}
	return GIDEntry{}, fmt.Errorf("%w: no RoCE v2 GID on port %d", ErrNoDevice, port)
}

// MTU is a path MTU in the verbs encoding (enum ibv_mtu).
type MTU int

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes (0 for an invalid value).
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << int(m)
}

func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return fmt.Sprint(b)
	}
	return fmt.Sprintf("MTU(%d)", int(m))
}

// MTUFromBytes returns the largest verbs MTU not above n bytes, or 0 if n is
// below 256.
func MTUFromBytes(n int) MTU {
	for m := MTU4096; m >= MTU256; m-- {
		if m.Bytes() <= n {
			return m
		}
	}
	return 0
}
