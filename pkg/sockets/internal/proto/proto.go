// Package proto is the upgrade and demote protocol of sockets over RDMA
// (docs/sockets.md) as a pure state machine: one Machine per side of a
// connection takes events (the program's writes, reads and shutdown,
// records from the peer by the QP or through rvmad, credits, a QP error, a
// demote request) and returns what to do (bytes and a shutdown for the
// anchor, records for the QP or for rvmad). It does no I/O and keeps no
// clock, so the C shim and pkg/sockets implement the same transitions and
// its model checker (proto's tests) can explore every interleaving.
//
// The anchor is the connection's kernel TCP socket; it always carries the
// bytes the ring does not. Each direction switches to the ring at a byte
// offset (SWITCH) and back (DEMOTE) without losing, duplicating or
// reordering a byte: the receiver reads the anchor up to the switch
// offset, then the ring; a sender keeps what it wrote into the ring until
// credits say it was consumed, and after a DEMOTE(consumed) sends again on
// the anchor from max(consumed, its switch offset).
package proto

import (
	"errors"
	"fmt"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// Role says which side starts attachments: the side that connected.
type Role uint8

// Roles.
const (
	Client Role = iota // connect side: sends ATTACH_REQ
	Server             // accept side: answers ATTACH_REP or ATTACH_NACK
)

func (r Role) String() string {
	if r == Client {
		return "client"
	}
	return "server"
}

// Config is one side's parameters.
type Config struct {
	Role Role
	// RingSize is the size of the ring this side receives into, a power
	// of two; ATTACH_REQ and ATTACH_REP carry it to the peer.
	RingSize int
	// CreditBatch: the receiver writes a credit once this many bytes were
	// consumed since the last one (default RingSize/4); also at once when
	// the sender said it is blocked, and at the FIN offset.
	CreditBatch int
	// SendBuf bounds the bytes the program may have written that the peer
	// has not consumed while they are not on the anchor (SO_SNDBUF); at
	// least the peer's ring size to fill it (default 2*RingSize).
	SendBuf int
	// Refuse makes a server answer every ATTACH_REQ with ATTACH_NACK for
	// this reason (0: accept).
	Refuse sockwire.Reason
}

// ErrProtocol is a peer (or the transport under it) breaking the
// protocol: a record out of order, a ring overrun, the anchor ending
// before a switch offset. The connection must be reset (ABORT, then RST).
var ErrProtocol = errors.New("sockets: protocol violation")

// ErrClosed is a write after shutdown.
var ErrClosed = errors.New("sockets: write after shutdown")

// Phase is the connection's attachment phase on one side.
type Phase uint8

// Phases.
const (
	Plain     Phase = iota // no attachment: TCP only
	Attaching              // client: ATTACH_REQ sent, no answer yet
	Attached               // an attachment is live; directions switch on their own
	Demoting               // DEMOTE sent, the peer's DEMOTE not received yet
)

var phaseNames = [...]string{"plain", "attaching", "attached", "demoting"}

func (p Phase) String() string { return phaseNames[p] }

// OutMode is where the outgoing direction puts new bytes.
type OutMode uint8

// Outgoing modes.
const (
	OutTCP  OutMode = iota // on the anchor
	OutRing                // into the peer's ring, after SWITCH
	OutHeld                // demoting: kept until the peer's DEMOTE says where to resume
)

var outNames = [...]string{"tcp", "ring", "held"}

func (m OutMode) String() string { return outNames[m] }

// InMode is where the incoming direction reads next.
type InMode uint8

// Incoming modes.
const (
	InTCP       InMode = iota // the anchor, to its end
	InSwitching               // the anchor up to the peer's switch offset, then the ring
	InRing                    // the ring, to the FIN offset
)

var inNames = [...]string{"tcp", "switching", "ring"}

func (m InMode) String() string { return inNames[m] }

// Kind is the kind of a message between the two sides.
type Kind uint8

// Message kinds. The record kinds have a sockwire.Record; Data is a ring write
// with immediate, Credit and Blocked are RDMA WRITEs into the peer's
// control block.
const (
	MsgAttachReq  Kind = iota + 1 // rvmad
	MsgAttachRep                  // rvmad
	MsgAttachNack                 // rvmad
	MsgDemote                     // rvmad
	MsgSwitch                     // QP
	MsgFin                        // QP
	MsgData                       // QP: Data at stream offset Off
	MsgCredit                     // QP: the sender of the credit consumed Off
	MsgBlocked                    // QP: the sender is blocked at ring offset Off
)

var kindNames = [...]string{"", "ATTACH_REQ", "ATTACH_REP", "ATTACH_NACK", "DEMOTE", "SWITCH", "FIN", "DATA", "CREDIT", "BLOCKED"}

func (k Kind) String() string { return kindNames[k] }

// Msg is one message to the peer.
type Msg struct {
	Kind   Kind
	Epoch  uint32
	Off    uint64 // SWITCH, FIN: offset; DEMOTE: consumed; DATA: stream offset; CREDIT, BLOCKED: value
	Data   []byte // DATA
	Ring   int    // ATTACH_REQ, ATTACH_REP: the sender's ring size
	Reason sockwire.Reason
}

func (m Msg) String() string {
	switch m.Kind {
	case MsgData:
		return fmt.Sprintf("%v/%d@%d+%d", m.Kind, m.Epoch, m.Off, len(m.Data))
	case MsgAttachNack:
		return fmt.Sprintf("%v/%d(%v)", m.Kind, m.Epoch, m.Reason)
	case MsgAttachReq, MsgAttachRep:
		return fmt.Sprintf("%v/%d", m.Kind, m.Epoch)
	}
	return fmt.Sprintf("%v/%d(%d)", m.Kind, m.Epoch, m.Off)
}

// Record is the wire record of a record message (SWITCH, FIN, DEMOTE,
// ATTACH_NACK); nil for the others, whose wire form is a ring write, a
// control-block write or an attach record carrying RDMA resources.
func (m Msg) Record() sockwire.Record {
	switch m.Kind {
	case MsgSwitch:
		return sockwire.Switch{Epoch: m.Epoch, Offset: m.Off}
	case MsgFin:
		return sockwire.Fin{Epoch: m.Epoch, Offset: m.Off}
	case MsgDemote:
		return sockwire.Demote{Epoch: m.Epoch, Consumed: m.Off, Reason: m.Reason}
	case MsgAttachNack:
		return sockwire.Nack{Epoch: m.Epoch, Reason: m.Reason}
	}
	return nil
}

// Via is where an output goes.
type Via uint8

// Outputs.
const (
	ViaTCP    Via = iota // write Data to the anchor, or shut its writing (Shut)
	ViaQP                // post Msg on the attachment's QP
	ViaBroker            // send Msg to the peer through rvmad
)

// Output is one thing the side must do, in order.
type Output struct {
	Via  Via
	Data []byte // ViaTCP
	Shut bool   // ViaTCP: shutdown(SHUT_WR) of the anchor, after Data
	Msg  Msg    // ViaQP, ViaBroker
}

type outDir struct {
	mode      OutMode
	sent      uint64 // bytes the program wrote
	tcpEnd    uint64 // bytes written to the anchor (the TCP stream's length)
	switchOff uint64 // this attachment's SWITCH offset
	ringEnd   uint64 // bytes written into the peer's ring (stream offset)
	acked     uint64 // the peer's last credit, this attachment
	keepBase  uint64 // stream offset of keep[0]
	keep      []byte // bytes [keepBase, sent): not on the anchor, not consumed
	blocked   uint64 // the last BLOCKED sent, +1 (0: none)
	shut      bool   // the program shut writing
	finSent   bool   // FIN sent this attachment
	tcpShut   bool   // the anchor's writing shut
	switched  bool   // SWITCH sent this attachment
}

type inDir struct {
	mode      InMode
	consumed  uint64 // bytes the program read
	switchAt  uint64 // the peer's SWITCH offset
	ring      []byte // ring bytes arrived and not consumed, from ringStart
	ringStart uint64
	ringProd  uint64 // the next ring byte expected
	fin       uint64
	finKnown  bool
	credited  uint64 // the last credit written, this attachment
	blocked   bool   // the peer is blocked: credit at the next consumption
	eof       bool   // end of file given to the program
}

// Machine is one side of a connection. It is not safe for concurrent use;
// the shim and pkg/sockets hold a lock around every call.
type Machine struct {
	cfg       Config
	phase     Phase
	epoch     uint32 // the current (or last) attachment
	peerRing  int
	peerReady bool // server: the client's first QP record arrived
	sentDem   bool // DEMOTE sent this attachment
	gotDem    bool // the peer's DEMOTE received this attachment
	qpDead    bool
	attaches  int
	out       outDir
	in        inDir
	outbox    []Output
	err       error
	demotes   []sockwire.Reason // why this side demoted, each attachment
}

// New returns a side in phase Plain. It panics on a Config that is not
// usable (a ring size that is not a power of two): a programming error.
func New(cfg Config) *Machine {
	if cfg.RingSize <= 0 || cfg.RingSize&(cfg.RingSize-1) != 0 {
		panic(fmt.Sprintf("proto: ring size %d is not a power of two", cfg.RingSize))
	}
	if cfg.CreditBatch <= 0 {
		cfg.CreditBatch = max(cfg.RingSize/4, 1)
	}
	if cfg.SendBuf <= 0 {
		cfg.SendBuf = 2 * cfg.RingSize
	}
	return &Machine{cfg: cfg}
}

// Clone is a deep copy (for the model checker).
func (m *Machine) Clone() *Machine {
	c := *m
	c.out.keep = append([]byte(nil), m.out.keep...)
	c.in.ring = append([]byte(nil), m.in.ring...)
	c.outbox = append([]Output(nil), m.outbox...)
	c.demotes = append([]sockwire.Reason(nil), m.demotes...)
	return &c
}

// Outputs returns and forgets what the side must do, in order.
func (m *Machine) Outputs() []Output {
	o := m.outbox
	m.outbox = nil
	return o
}

// Err is the protocol violation that stopped the side, if any.
func (m *Machine) Err() error { return m.err }

// Phase is the attachment phase.
func (m *Machine) Phase() Phase { return m.phase }

// Epoch is the current (or last) attachment, 0 before any.
func (m *Machine) Epoch() uint32 { return m.epoch }

// Modes are the two directions' modes.
func (m *Machine) Modes() (OutMode, InMode) { return m.out.mode, m.in.mode }

// Demotes lists why this side demoted, one reason per demote.
func (m *Machine) Demotes() []sockwire.Reason { return m.demotes }

// Done reports whether both directions ended: the program read end of
// file and the anchor's writing is shut. A side may be released (its QP
// destroyed) once Done and its QP operations completed: the peer then
// needs nothing more from it.
func (m *Machine) Done() bool { return m.in.eof && m.out.tcpShut }

func (m *Machine) fail(format string, args ...any) {
	if m.err == nil {
		m.err = fmt.Errorf("%v side, %w: "+format, append([]any{m.cfg.Role, ErrProtocol}, args...)...)
	}
}

func (m *Machine) emit(o Output) { m.outbox = append(m.outbox, o) }

func (m *Machine) qp(msg Msg) {
	msg.Epoch = m.epoch
	m.emit(Output{Via: ViaQP, Msg: msg})
}

func (m *Machine) broker(msg Msg) {
	msg.Epoch = m.epoch
	m.emit(Output{Via: ViaBroker, Msg: msg})
}

// live reports whether records of epoch e concern the live attachment.
func (m *Machine) live(e uint32) bool {
	return e == m.epoch && (m.phase == Attached || m.phase == Attaching) && !m.sentDem
}

func (m *Machine) newEpoch(e uint32) {
	m.epoch = e
	m.peerReady, m.sentDem, m.gotDem, m.qpDead = false, false, false, false
	m.out.acked, m.out.blocked, m.out.finSent, m.out.switched = 0, 0, false, false
	m.in.credited, m.in.blocked = 0, false
}

// Attach starts an attachment (client, phase Plain, writing not shut); it
// reports whether it did. The peer answers through rvmad.
func (m *Machine) Attach() bool {
	if m.err != nil || m.cfg.Role != Client || m.phase != Plain || m.out.shut {
		return false
	}
	m.newEpoch(m.epoch + 1)
	m.attaches++
	m.phase = Attaching
	m.broker(Msg{Kind: MsgAttachReq, Ring: m.cfg.RingSize})
	return true
}

// Write offers p from the program and returns how much was taken: all of
// it while the outgoing direction is on the anchor, up to SendBuf bytes
// not yet consumed otherwise (0: would block). It fails with ErrClosed
// after ShutdownWrite.
func (m *Machine) Write(p []byte) (int, error) {
	if m.out.shut {
		return 0, ErrClosed
	}
	if m.err != nil {
		return 0, m.err
	}
	if m.out.mode == OutTCP {
		m.out.sent += uint64(len(p))
		m.out.tcpEnd = m.out.sent
		m.out.keepBase = m.out.sent
		m.emit(Output{Via: ViaTCP, Data: append([]byte(nil), p...)})
		return len(p), nil
	}
	room := m.cfg.SendBuf - len(m.out.keep)
	n := min(max(room, 0), len(p))
	m.out.keep = append(m.out.keep, p[:n]...)
	m.out.sent += uint64(n)
	m.pump()
	return n, nil
}

// ShutdownWrite is the program's shutdown(SHUT_WR) (or close): FIN after
// the bytes written, on the anchor or as a FIN record after the ring.
func (m *Machine) ShutdownWrite() {
	if m.out.shut {
		return
	}
	m.out.shut = true
	m.pump()
}

// TCPWant is how many bytes a read may take from the anchor now: 0 while
// the ring is next, -1 for no limit.
func (m *Machine) TCPWant() int {
	switch m.in.mode {
	case InTCP:
		return -1
	case InSwitching:
		return int(m.in.switchAt - m.in.consumed)
	}
	return 0
}

// Read is the program's read of up to max bytes. tcp reads up to n bytes
// from the anchor (n > 0), reporting its end of file; Read calls it only
// for bytes the anchor carries. Read returns the bytes, or eof, or
// neither (would block). It fails with an error wrapping ErrProtocol when
// the anchor ends before the peer's switch offset.
func (m *Machine) Read(maxn int, tcp func(n int) ([]byte, bool)) ([]byte, bool, error) {
	if m.err != nil {
		return nil, false, m.err
	}
	if m.in.eof {
		return nil, true, nil
	}
	switch m.in.mode {
	case InTCP, InSwitching:
		want := maxn
		if m.in.mode == InSwitching {
			want = min(want, int(m.in.switchAt-m.in.consumed))
		}
		if want > 0 {
			p, eof := tcp(want)
			if len(p) > want {
				m.fail("the anchor gave %d bytes for %d", len(p), want)
				return nil, false, m.err
			}
			if len(p) > 0 {
				m.in.consumed += uint64(len(p))
				m.afterConsume()
				return p, false, nil
			}
			if eof {
				if m.in.mode == InSwitching {
					m.fail("the anchor ended at %d, before the switch offset %d", m.in.consumed, m.in.switchAt)
					return nil, false, m.err
				}
				m.in.eof = true
				m.pump()
				return nil, true, nil
			}
			return nil, false, nil
		}
		if m.in.mode == InTCP {
			return nil, false, nil
		}
		m.afterConsume() // at the switch offset: on to the ring
	}
	if m.in.mode != InRing {
		return nil, false, nil
	}
	if len(m.in.ring) == 0 {
		if m.in.finKnown && m.in.consumed == m.in.fin {
			m.in.eof = true
			m.pump()
			return nil, true, nil
		}
		return nil, false, nil
	}
	n := min(maxn, len(m.in.ring))
	p := append([]byte(nil), m.in.ring[:n]...)
	m.in.ring = m.in.ring[n:]
	m.in.ringStart += uint64(n)
	m.in.consumed += uint64(n)
	m.afterConsume()
	return p, false, nil
}

func (m *Machine) afterConsume() {
	if m.in.mode == InSwitching && m.in.consumed == m.in.switchAt {
		m.in.mode = InRing
	}
	m.credit()
}

// credit writes the consumed offset into the peer's control block when a
// batch was consumed, when the peer said it is blocked, or at FIN.
func (m *Machine) credit() {
	if m.in.mode != InRing || !m.live(m.epoch) || m.phase != Attached {
		return
	}
	c := m.in.consumed
	if c <= m.in.credited || c <= m.in.switchAt {
		return
	}
	if c-m.in.credited >= uint64(m.cfg.CreditBatch) || m.in.blocked || (m.in.finKnown && c == m.in.fin) {
		m.in.credited = c
		m.in.blocked = false
		m.qp(Msg{Kind: MsgCredit, Off: c})
	}
}

// pump moves the outgoing direction on: ring writes as credits allow,
// BLOCKED when the ring is full, FIN, and the anchor's shutdown.
func (m *Machine) pump() {
	o := &m.out
	switch o.mode {
	case OutTCP:
		if o.shut && !o.tcpShut {
			o.tcpShut = true
			m.emit(Output{Via: ViaTCP, Shut: true})
		}
	case OutRing:
		base := max(o.acked, o.switchOff)
		for o.ringEnd < o.sent {
			room := int64(m.peerRing) - int64(o.ringEnd-base)
			if room <= 0 {
				if o.blocked != o.ringEnd+1 {
					o.blocked = o.ringEnd + 1
					m.qp(Msg{Kind: MsgBlocked, Off: o.ringEnd})
				}
				break
			}
			n := min(uint64(room), o.sent-o.ringEnd)
			i := o.ringEnd - o.keepBase
			m.qp(Msg{Kind: MsgData, Off: o.ringEnd, Data: append([]byte(nil), o.keep[i:i+n]...)})
			o.ringEnd += n
		}
		if o.shut && o.ringEnd == o.sent && !o.finSent {
			o.finSent = true
			m.qp(Msg{Kind: MsgFin, Off: o.sent})
		}
		// The anchor shuts once no byte off it awaits consumption: a
		// later DEMOTE cannot ask for any of them again.
		if o.shut && o.finSent && o.sent == max(o.acked, o.tcpEnd) && !o.tcpShut {
			o.tcpShut = true
			m.emit(Output{Via: ViaTCP, Shut: true})
		}
	}
}

// switchOut moves the outgoing direction to the ring: SWITCH at the
// anchor's length, then ring writes.
func (m *Machine) switchOut() {
	o := &m.out
	if o.switched || !m.live(m.epoch) || m.phase != Attached {
		return
	}
	o.switched = true
	m.qp(Msg{Kind: MsgSwitch, Off: o.tcpEnd})
	o.switchOff, o.ringEnd = o.tcpEnd, o.tcpEnd
	o.keepBase, o.keep = o.tcpEnd, o.keep[:0]
	if o.tcpShut {
		// Nothing follows on the ring: FIN at the same offset.
		o.finSent = true
		m.qp(Msg{Kind: MsgFin, Off: o.sent})
		return
	}
	o.mode = OutRing
	m.pump()
}

// trim forgets kept bytes the peer consumed.
func (m *Machine) trim() {
	o := &m.out
	if o.acked > o.keepBase {
		n := min(o.acked-o.keepBase, uint64(len(o.keep)))
		o.keep = o.keep[n:]
		o.keepBase += n
	}
}

// Demote moves the connection back to TCP for reason r: DEMOTE through
// rvmad with the bytes consumed, the ring left, the outgoing bytes kept
// until the peer's DEMOTE says where the anchor resumes. It reports
// whether there was an attachment to demote.
func (m *Machine) Demote(r sockwire.Reason) bool {
	if m.err != nil || m.sentDem || (m.phase != Attached && m.phase != Attaching) {
		return false
	}
	m.sentDem = true
	m.demotes = append(m.demotes, r)
	m.broker(Msg{Kind: MsgDemote, Off: m.in.consumed, Reason: r})
	m.in.mode = InTCP
	m.in.ring, m.in.finKnown, m.in.blocked = nil, false, false
	o := &m.out
	if o.switched {
		if o.tcpShut {
			// Everything was consumed and the anchor is shut:
			// nothing will follow.
			o.mode = OutTCP
			o.tcpEnd, o.keepBase, o.keep = o.sent, o.sent, o.keep[:0]
		} else {
			// Whatever was consumed, the peer may still act on our
			// SWITCH until it demotes: the anchor must not go
			// beyond the switch offset before its DEMOTE.
			o.mode = OutHeld
		}
	}
	// Attaching too: ATTACH_NACK ends it, ATTACH_REP leads to the
	// peer's DEMOTE.
	m.phase = Demoting
	if m.gotDem {
		m.phase = Plain
	}
	m.pump()
	return true
}

// QPError is the attachment's QP failing (or its peer gone); stale epochs
// are ignored. The connection demotes if the attachment was live.
func (m *Machine) QPError(epoch uint32) {
	if epoch != m.epoch {
		return
	}
	m.qpDead = true
	m.Demote(sockwire.ReasonQPError)
}

// FromBroker takes a record the peer sent through rvmad.
func (m *Machine) FromBroker(msg Msg) {
	if m.err != nil {
		return
	}
	switch msg.Kind {
	case MsgAttachReq:
		if m.cfg.Role != Server {
			m.fail("ATTACH_REQ to a client")
			return
		}
		if msg.Epoch <= m.epoch && m.epoch != 0 || m.phase != Plain {
			m.fail("ATTACH_REQ for epoch %d in phase %v of epoch %d", msg.Epoch, m.phase, m.epoch)
			return
		}
		m.newEpoch(msg.Epoch)
		switch {
		case m.cfg.Refuse != 0:
			m.broker(Msg{Kind: MsgAttachNack, Reason: m.cfg.Refuse})
		case m.out.shut:
			m.broker(Msg{Kind: MsgAttachNack, Reason: sockwire.ReasonShutdown})
		default:
			m.peerRing = msg.Ring
			m.phase = Attached
			m.attaches++
			m.broker(Msg{Kind: MsgAttachRep, Ring: m.cfg.RingSize})
		}
	case MsgAttachRep:
		if m.cfg.Role != Client || msg.Epoch != m.epoch {
			m.fail("ATTACH_REP for epoch %d at epoch %d", msg.Epoch, m.epoch)
			return
		}
		switch m.phase {
		case Attaching:
			m.peerRing = msg.Ring
			m.phase = Attached
			m.switchOut()
		case Demoting:
			// Demoted before the answer: the server attached and
			// will answer our DEMOTE with its own.
		default:
			m.fail("ATTACH_REP in phase %v", m.phase)
		}
	case MsgAttachNack:
		if m.cfg.Role != Client || msg.Epoch != m.epoch {
			m.fail("ATTACH_NACK for epoch %d at epoch %d", msg.Epoch, m.epoch)
			return
		}
		switch m.phase {
		case Attaching, Demoting:
			// The server never attached: no DEMOTE will come.
			if m.out.mode != OutTCP {
				m.fail("ATTACH_NACK with the outgoing direction %v", m.out.mode)
				return
			}
			m.phase = Plain
		default:
			m.fail("ATTACH_NACK in phase %v", m.phase)
		}
	case MsgDemote:
		if msg.Epoch != m.epoch || m.gotDem || (m.phase != Attached && m.phase != Demoting) {
			// A DEMOTE for an attachment this side refused, or
			// stale: nothing to do.
			if msg.Epoch > m.epoch {
				m.fail("DEMOTE for epoch %d at epoch %d", msg.Epoch, m.epoch)
			}
			return
		}
		m.gotDem = true
		if !m.sentDem {
			m.Demote(sockwire.ReasonPeer)
		}
		o := &m.out
		if msg.Off > o.sent || msg.Off < o.acked {
			m.fail("DEMOTE(%d) with %d sent, %d credited", msg.Off, o.sent, o.acked)
			return
		}
		if o.mode == OutHeld {
			from := max(msg.Off, o.tcpEnd)
			if from < o.keepBase {
				m.fail("DEMOTE(%d): bytes from %d forgotten", msg.Off, o.keepBase)
				return
			}
			p := o.keep[from-o.keepBase:]
			if len(p) > 0 {
				m.emit(Output{Via: ViaTCP, Data: append([]byte(nil), p...)})
			}
			o.mode = OutTCP
			o.tcpEnd, o.keepBase, o.keep = o.sent, o.sent, o.keep[:0]
		}
		m.phase = Plain
		m.pump()
	default:
		m.fail("%v through rvmad", msg.Kind)
	}
}

// FromQP takes a record, ring write or control-block write the peer
// posted on the attachment's QP. Those of another attachment, or arriving
// after this side demoted, are ignored.
func (m *Machine) FromQP(msg Msg) {
	if m.err != nil {
		return
	}
	if msg.Kind == MsgCredit && msg.Epoch == m.epoch && m.out.mode == OutHeld {
		// Demoting, but credits still say what the peer consumed:
		// once it consumed all, a shut direction shuts its anchor
		// without waiting for a DEMOTE the peer, finished and gone,
		// may never send.
		o := &m.out
		if msg.Off > o.ringEnd {
			m.fail("CREDIT(%d) with %d in the ring", msg.Off, o.ringEnd)
			return
		}
		o.acked = max(o.acked, msg.Off)
		m.trim()
		if o.shut && !o.tcpShut && o.sent == max(o.acked, o.tcpEnd) {
			o.tcpShut = true
			m.emit(Output{Via: ViaTCP, Shut: true})
		}
		return
	}
	if !m.live(msg.Epoch) || m.phase != Attached {
		return
	}
	in := &m.in
	switch msg.Kind {
	case MsgSwitch:
		if in.mode != InTCP || msg.Off < in.consumed {
			m.fail("SWITCH(%d) in mode %v at %d", msg.Off, in.mode, in.consumed)
			return
		}
		in.mode, in.switchAt = InSwitching, msg.Off
		in.ringStart, in.ringProd, in.ring = msg.Off, msg.Off, nil
		if m.cfg.Role == Server && !m.peerReady {
			m.peerReady = true
			m.switchOut()
		}
		m.afterConsume()
	case MsgData:
		if in.mode == InTCP || msg.Off != in.ringProd || in.finKnown {
			m.fail("DATA at %d in mode %v, expecting %d", msg.Off, in.mode, in.ringProd)
			return
		}
		base := max(in.consumed, in.switchAt)
		if in.ringProd+uint64(len(msg.Data))-base > uint64(m.cfg.RingSize) {
			m.fail("ring overrun: %d bytes beyond %d", in.ringProd+uint64(len(msg.Data))-base, m.cfg.RingSize)
			return
		}
		in.ring = append(in.ring, msg.Data...)
		in.ringProd += uint64(len(msg.Data))
	case MsgFin:
		if in.mode == InTCP || msg.Off != in.ringProd || in.finKnown {
			m.fail("FIN(%d) in mode %v, ring at %d", msg.Off, in.mode, in.ringProd)
			return
		}
		in.fin, in.finKnown = msg.Off, true
		m.credit()
	case MsgCredit:
		o := &m.out
		if o.mode != OutRing || msg.Off > o.ringEnd {
			m.fail("CREDIT(%d) in mode %v with %d in the ring", msg.Off, o.mode, o.ringEnd)
			return
		}
		o.acked = max(o.acked, msg.Off)
		m.trim()
		m.pump()
	case MsgBlocked:
		if in.mode == InTCP {
			m.fail("BLOCKED before SWITCH")
			return
		}
		in.blocked = true
		m.credit()
	default:
		m.fail("%v on the QP", msg.Kind)
	}
}

// Refuse answers the ATTACH_REQ msg with ATTACH_NACK for reason r (a
// valid reason), exactly as a server configured with Config.Refuse = r
// would: for this one request (the server could not allocate its side of
// the attachment, or has no device). Other messages go to FromBroker.
func (m *Machine) Refuse(msg Msg, r sockwire.Reason) {
	if msg.Kind != MsgAttachReq || !r.Valid() {
		m.FromBroker(msg)
		return
	}
	old := m.cfg.Refuse
	m.cfg.Refuse = r
	m.FromBroker(msg)
	m.cfg.Refuse = old
}
