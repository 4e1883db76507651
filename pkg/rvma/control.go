package rvma

import (
	"fmt"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// linkOf is the link whose stripe QP qpn is: a stripe in service, one
// being dialled, or one replaced lately (a message delivered just before
// its stripe was replaced may be polled after; its sender saw it
// delivered and does not send it again). The caller holds ep.mu.
func (ep *Endpoint) linkOf(qpn uint32) *link {
	if st := ep.byQPN[qpn]; st != nil {
		return st.l
	}
	if l := ep.dialing[qpn]; l != nil {
		return l
	}
	if st := ep.retired[qpn]; st != nil {
		return st.l
	}
	return nil
}

// ctrl handles a control message received on a link (engine callback).
func (ep *Endpoint) ctrl(wc verbs.WC, imm wire.Imm, msg []byte) {
	ep.mu.Lock()
	l := ep.linkOf(wc.QPN)
	ep.mu.Unlock()
	m, err := wire.ParseCtrl(msg)
	if l == nil || err != nil {
		ep.e.prog.unknown.Add(1)
		return
	}
	switch m.Type {
	case wire.CtrlResolve:
		// The accepting side learns a stripe's QP can send only when its
		// Accept returned, which may come after the dialer's first message:
		// answer once every stripe of the link is established.
		select {
		case <-l.ready:
			ep.answerResolve(l, m)
		default:
			ep.mu.Lock()
			ep.spawnLocked(func() {
				select {
				case <-l.ready:
				case <-ep.ctx.Done(): // Close waits for this goroutine
					return
				}
				select {
				case <-l.dead: // fail closes ready too
				default:
					ep.answerResolve(l, m)
				}
			})
			ep.mu.Unlock()
		}
	case wire.CtrlGet:
		if m.Seq&wire.GetSeqBit == 0 {
			ep.e.prog.unknown.Add(1)
			return
		}
		ep.serveGet(l, m)
	case wire.CtrlGetReply:
		ep.getAnswer(l, m)
	case wire.CtrlLate:
		ep.lateReport(l, m)
	case wire.CtrlRefused:
		ep.refusedReport(l, m)
	case wire.CtrlNack, wire.CtrlResolved:
		if m.Seq&wire.GetSeqBit != 0 {
			ep.getAnswer(l, m)
			return
		}
		v := ep.view(m.Seq % viewSlots)
		if v == nil || v.l != l || v.seq != m.Seq {
			ep.e.prog.unknown.Add(1)
			return
		}
		v.mu.Lock()
		select {
		case <-v.resolved:
			v.mu.Unlock()
			return // a duplicate
		default:
		}
		if m.Type == wire.CtrlNack {
			v.err = fmt.Errorf("%w (mailbox %v at %v)", nackErr(m.Reason), v.mb, l.peer)
		} else {
			v.slot = m.Slot
			v.sv = newSenderView(v.mb, m.Incarnation)
			ep.refreshView(v)
		}
		close(v.resolved)
		v.mu.Unlock()
	default:
		ep.e.prog.unknown.Add(1)
	}
}

// recvFailed handles a receive completed in error: the stripe it came on
// is in the error state (engine callback).
func (ep *Endpoint) recvFailed(wc verbs.WC) {
	ep.mu.Lock()
	st := ep.byQPN[wc.QPN]
	ep.mu.Unlock()
	if st != nil {
		st.broken(wc.Err())
	}
}
