package sockets

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// The data plane's constants (docs/sockets.md, "Data plane").
const (
	recvSlots   = 64 // receives kept posted, each of recvSlot bytes
	recvSlot    = 64
	ctrlOff     = 0                            // the control block in the small region
	recvOff     = 64                           // the receive buffers
	scratchOff  = recvOff + recvSlots*recvSlot // inline sources (records, credits)
	smallSize   = 8192
	sqDepth     = 128
	chunkMax    = 64 << 10 // the largest ring write
	port        = 1
	recvBase    = 1 << 32 // receive work request IDs; a send's is the posts it completes
	signalEvery = 16
)

// device is one RDMA device the process holds open while attachments
// use it: opened by the first, closed after the last, so that a process
// with no attachment holds no device (rxe's removal waits for every
// process that has it open). The fields but refs and gone are set once.
type device struct {
	name string
	ctx  *verbs.Context
	pd   *verbs.PD
	ch   *verbs.CompChannel
	gids []verbs.GIDEntry
	mtu  verbs.MTU
	refs int  // attachments holding it, under devMu
	gone bool // being removed (rvmad's DEVICE): no new attachment, under devMu
}

var (
	devMu   sync.Mutex
	devices = map[string]*device{}
)

// errNoDevice is no RDMA device with a RoCE v2 GID for the address.
var errNoDevice = errors.New("sockets: no RDMA device with a RoCE v2 GID for the connection's address")

// deviceFor returns the device (named, or any) whose port 1 has a RoCE
// v2 GID for ip, and that GID's index, with a reference the caller gives
// back with putDevice. Devices no attachment holds are closed again.
func deviceFor(name string, ip netip.Addr) (*device, int, error) {
	devMu.Lock()
	defer devMu.Unlock()
	defer closeUnused()
	var names []string
	if name != "" {
		names = []string{name}
	} else {
		infos, err := verbs.Devices()
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %w", errNoDevice, err)
		}
		for _, i := range infos {
			names = append(names, i.Name)
		}
	}
	want := net.IP(ip.Unmap().AsSlice())
	for _, n := range names {
		d, err := openDevice(n)
		if err != nil || d.gone {
			continue
		}
		for refresh := 0; refresh < 2; refresh++ {
			if e, err := verbs.PickRoCEv2GID(d.gids, port, want); err == nil {
				d.refs++
				return d, e.Index, nil
			}
			if g, err := d.ctx.GIDs(); err == nil {
				d.gids = g
			}
		}
	}
	return nil, 0, fmt.Errorf("%w %v (devices %v)", errNoDevice, ip, names)
}

func openDevice(name string) (*device, error) {
	if d := devices[name]; d != nil {
		return d, nil
	}
	ctx, err := verbs.Open(name)
	if err != nil {
		return nil, err
	}
	d := &device{name: name, ctx: ctx}
	fail := func(err error) (*device, error) { ctx.Close(); return nil, err }
	if d.pd, err = ctx.AllocPD(); err != nil {
		return fail(err)
	}
	if d.ch, err = ctx.NewCompChannel(); err != nil {
		return fail(err)
	}
	if d.gids, err = ctx.GIDs(); err != nil {
		return fail(err)
	}
	pa, err := ctx.QueryPort(port)
	if err != nil {
		return fail(err)
	}
	d.mtu = pa.ActiveMTU
	if d.mtu < verbs.MTU256 || d.mtu > verbs.MTU4096 {
		d.mtu = verbs.MTU1024
	}
	devices[name] = d
	return d, nil
}

// closeUnused closes the devices no attachment holds (under devMu).
func closeUnused() {
	for name, d := range devices {
		if d.refs == 0 {
			delete(devices, name)
			_ = d.ctx.Close() // its PD and channel with it
		}
	}
}

// putDevice gives back an attachment's reference to d; the last closes
// the device.
func putDevice(d *device) {
	devMu.Lock()
	defer devMu.Unlock()
	if d.refs--; d.refs == 0 {
		closeUnused()
	}
}

// deviceGone marks the device name as being removed: no attachment takes
// it from now on. It reports whether the process holds it.
func deviceGone(name string) bool {
	devMu.Lock()
	defer devMu.Unlock()
	d := devices[name]
	if d != nil {
		d.gone = true
	}
	return d != nil
}

// opKind is a queued post on the attachment's QP.
type opKind uint8

const (
	opData opKind = iota // ring bytes [off, off+n) from the staging region
	opSend               // a record, inline SEND
	opCtrl               // an 8-byte control-block write with IMM(CTRL, 8)
)

type op struct {
	kind  opKind
	off   uint64 // opData: stream offset; opCtrl: field offset
	n     uint64 // opData: length
	value uint64 // opCtrl
	rec   [sockwire.OffsetSize]byte
	recN  int
}

// attachment is one RDMA attachment of a connection: its QP, CQ, the
// ring it receives into, its control block, receive buffers and the
// staging region its ring writes come from. All its fields are guarded
// by the connection's mutex; the progress goroutine waits on the CQ
// without it.
type attachment struct {
	dev      *device
	gidIndex int
	cq       *verbs.CQ
	qp       *verbs.QP
	small    *verbs.MR // control block, receive buffers, inline scratch
	ring     *verbs.MR
	stage    *verbs.MR // the peer's ring size, once connected
	local    sockwire.Endpoint
	peer     sockwire.Endpoint
	psn      uint32

	connected  bool
	released   bool
	dead       bool   // the QP failed: nothing more is posted
	prod       uint64 // the next ring byte expected, from the peer's SWITCH on
	credit     uint64 // the largest credit seen in my control block
	blocked    uint64 // the largest blocked value seen
	lastCredit uint64 // the last credit written to the peer

	ops         []op
	outstanding int // posts not yet completed, up to the last signaled one
	unsignaled  int // posts since the last signaled one

	cancel context.CancelFunc
	done   chan struct{}
}

func random24() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:]) & 0xffffff
}

// newAttachment allocates this side's resources: a CQ, an RC QP in INIT
// with its receives posted, the ring of ringSize bytes and the control
// block. Errors wrap the verbs error; nothing is left allocated.
func newAttachment(d *device, gidIndex, ringSize int, gid verbs.GID) (a *attachment, err error) {
	a = &attachment{dev: d, gidIndex: gidIndex, psn: random24()}
	defer func() {
		if err != nil {
			a.closeObjects()
			a = nil
		}
	}()
	if a.cq, err = d.ctx.NewCQ(2*sqDepth+2*recvSlots, &verbs.CQOptions{Channel: d.ch}); err != nil {
		return nil, err
	}
	if a.qp, err = d.pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: a.cq, RecvCQ: a.cq,
		Cap: verbs.QPCap{MaxSendWR: sqDepth, MaxRecvWR: recvSlots, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}}); err != nil {
		return nil, err
	}
	access := verbs.AccessLocalWrite | verbs.AccessRemoteWrite
	if err = a.qp.ToInit(&verbs.InitAttr{Port: port, Access: access}); err != nil {
		return nil, err
	}
	if a.small, err = d.pd.AllocMR(smallSize, access); err != nil {
		return nil, err
	}
	if a.ring, err = d.pd.AllocMR(ringSize, access); err != nil {
		return nil, err
	}
	for i := range recvSlots {
		if err = a.postRecv(i); err != nil {
			return nil, err
		}
	}
	log2 := uint8(0)
	for 1<<log2 < ringSize {
		log2++
	}
	a.local = sockwire.Endpoint{GID: gid, QPN: a.qp.QPN(), PSN: a.psn, RingAddr: a.ring.Addr(),
		RingRKey: a.ring.RKey(), RingLog2: log2, MTU: uint8(d.mtu),
		CtrlAddr: a.small.Addr() + ctrlOff, CtrlRKey: a.small.RKey()}
	return a, nil
}

func (a *attachment) postRecv(i int) error {
	return a.qp.PostRecv(verbs.RecvWR{ID: recvBase + uint64(i), SGL: []verbs.SGE{a.small.SGE(recvOff+i*recvSlot, recvSlot)}})
}

// connect moves the QP to RTS towards the peer's endpoint and allocates
// the staging region of the peer's ring size.
func (a *attachment) connect(peer sockwire.Endpoint) error {
	if a.connected {
		return nil
	}
	mtu := min(verbs.MTU(peer.MTU), a.dev.mtu)
	if err := a.qp.ToRTR(&verbs.RTRAttr{PathMTU: mtu, DestQPN: peer.QPN, RQPSN: peer.PSN, MinRNRTimer: 12,
		AH: verbs.AHAttr{Port: port, IsGlobal: true, DGID: verbs.GID(peer.GID), SGIDIndex: a.gidIndex, HopLimit: 64}}); err != nil {
		return err
	}
	// timeout 17 (0.54 s a try, about 4 s in all: a busy host is not a
	// dead one) and retry_cnt 6, as docs/sockets.md says: rxe resends
	// forever with 7 (it never counts a retry count of 7 down), so a QP
	// whose peer was killed would never fail and never demote.
	if err := a.qp.ToRTS(&verbs.RTSAttr{SQPSN: a.psn, Timeout: 17, RetryCount: 6, RNRRetry: 7}); err != nil {
		return err
	}
	stage, err := a.dev.pd.AllocMR(int(peer.RingSize()), verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	a.stage = stage
	a.peer = peer
	a.connected = true
	return nil
}

// closeObjects destroys the QP and frees the memory; once.
func (a *attachment) closeObjects() {
	for _, c := range []interface{ Close() error }{a.qp, a.cq, a.stage, a.ring, a.small} {
		if c != nil && !isNil(c) {
			_ = c.Close()
		}
	}
}

func isNil(c interface{ Close() error }) bool {
	switch v := c.(type) {
	case *verbs.QP:
		return v == nil
	case *verbs.CQ:
		return v == nil
	case *verbs.MR:
		return v == nil
	}
	return false
}

// release stops the progress goroutine and frees everything; the
// device's reference goes once that goroutine ended (it may still be
// inside a wait on the device's channel). The caller holds the
// connection's mutex; the progress goroutine checks released under it
// before touching the memory.
func (a *attachment) release() {
	if a.released {
		return
	}
	a.released = true
	if a.cancel != nil {
		a.cancel()
	}
	a.closeObjects()
	if done, d := a.done, a.dev; done != nil {
		go func() { <-done; putDevice(d) }()
	} else {
		putDevice(d)
	}
}

// stageData copies p, the stream's bytes from off, into the staging
// region at off mod its size, and queues their ring write.
func (a *attachment) stageData(off uint64, p []byte) {
	st := a.stage.Bytes()
	size := uint64(len(st))
	for done := 0; done < len(p); {
		pos := (off + uint64(done)) & (size - 1)
		done += copy(st[pos:], p[done:])
	}
	if n := len(a.ops); n > 0 && a.ops[n-1].kind == opData && a.ops[n-1].off+a.ops[n-1].n == off {
		a.ops[n-1].n += uint64(len(p))
		return
	}
	a.ops = append(a.ops, op{kind: opData, off: off, n: uint64(len(p))})
}

// queueRecord queues a record as an inline SEND.
func (a *attachment) queueRecord(b []byte) {
	o := op{kind: opSend, recN: len(b)}
	copy(o.rec[:], b)
	a.ops = append(a.ops, o)
}

// queueCtrl queues an 8-byte write of v into the peer's control block at
// field (sockwire.CtrlCreditOff or CtrlBlockedOff).
func (a *attachment) queueCtrl(field, v uint64) {
	a.ops = append(a.ops, op{kind: opCtrl, off: field, value: v})
}

// pump posts queued operations while the send queue has room. It reports
// the ring writes posted, and an error when a post failed (the QP is
// then dead).
func (a *attachment) pump() (writes int, err error) {
	if a.dead || a.released || !a.connected {
		return 0, nil
	}
	scratch := a.small.Bytes()[scratchOff : scratchOff+64]
	for len(a.ops) > 0 && a.outstanding < sqDepth {
		o := &a.ops[0]
		var wr verbs.SendWR
		switch o.kind {
		case opData:
			size := uint64(a.stage.Len())
			pos := o.off & (size - 1)
			n := min(o.n, size-pos, chunkMax)
			wr = verbs.SendWR{Op: verbs.OpWriteImm, SGL: []verbs.SGE{a.stage.SGE(int(pos), int(n))},
				RemoteAddr: a.peer.RingAddr + pos, RKey: a.peer.RingRKey, Imm: sockwire.Imm(sockwire.ImmData, uint32(n))}
			o.off += n
			o.n -= n
			writes++
		case opSend:
			copy(scratch, o.rec[:o.recN])
			wr = verbs.SendWR{Op: verbs.OpSend, Flags: verbs.SendInline,
				SGL: []verbs.SGE{a.small.SGE(scratchOff, o.recN)}}
			o.n = 0
		case opCtrl:
			binary.LittleEndian.PutUint64(scratch, o.value)
			wr = verbs.SendWR{Op: verbs.OpWriteImm, Flags: verbs.SendInline,
				SGL:        []verbs.SGE{a.small.SGE(scratchOff, 8)},
				RemoteAddr: a.peer.CtrlAddr + o.off, RKey: a.peer.CtrlRKey, Imm: sockwire.Imm(sockwire.ImmCtrl, 8)}
			o.n = 0
		}
		if o.n == 0 {
			a.ops = a.ops[1:]
		}
		// Every signalEvery-th post, and the last one queued, asks
		// for a completion that accounts for all posts since the
		// previous one: the queue never fills with unsignaled posts,
		// and the last post of a burst always completes visibly.
		a.unsignaled++
		if a.unsignaled >= signalEvery || len(a.ops) == 0 || a.outstanding+a.unsignaled >= sqDepth {
			wr.Flags |= verbs.SendSignaled
			wr.ID = uint64(a.unsignaled)
		}
		if err := a.qp.PostSend(wr); err != nil {
			a.dead = true
			return writes, err
		}
		if wr.Flags&verbs.SendSignaled != 0 {
			a.outstanding += a.unsignaled
			a.unsignaled = 0
		}
	}
	return writes, nil
}

// readCtrl reads my control block's credit and blocked values (8-byte
// aligned words the peer writes with RDMA).
func (a *attachment) readCtrl() (credit, blocked uint64) {
	b := a.small.Bytes()
	credit = atomic.LoadUint64((*uint64)(unsafe.Pointer(&b[ctrlOff+sockwire.CtrlCreditOff])))
	blocked = atomic.LoadUint64((*uint64)(unsafe.Pointer(&b[ctrlOff+sockwire.CtrlBlockedOff])))
	return credit, blocked
}

// ringView is the n ring bytes from stream offset off, as one or two
// slices of the ring's memory (split at the wrap).
func (a *attachment) ringView(off uint64, n int) [][]byte {
	r := a.ring.Bytes()
	pos := int(off & uint64(len(r)-1))
	if pos+n <= len(r) {
		return [][]byte{r[pos : pos+n]}
	}
	return [][]byte{r[pos:], r[:n-(len(r)-pos)]}
}

// recvRecord is the record received in slot i.
func (a *attachment) recvRecord(i int, n int) (sockwire.Record, error) {
	if i < 0 || i >= recvSlots || n > recvSlot {
		return nil, fmt.Errorf("receive slot %d of %d bytes", i, n)
	}
	b := a.small.Bytes()[recvOff+i*recvSlot : recvOff+i*recvSlot+n]
	return sockwire.Decode(append([]byte(nil), b...))
}
