package activeaccess

import (
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// PlainQP is the target's end of a connection from a source that does not
// use this package (perftest, a program of its own on plain verbs): an RC
// queue pair in the target's protection domain, connected to the queue
// pair the source described out of band. Create it with
// Target.ConnectPlain and give the source Info and Target.Region.
//
// The source's RDMA WRITEs and READs into the target's memory are active
// like a Source's: the module logs them into the domains' logs, the
// handlers see them (with a nil Access.Source), W=0 and R=0 apply, and a
// write that does not fit a log is refused, so the source sees
// IBV_WC_REM_ACCESS_ERR and its QP breaks, instead of the access going
// unlogged. Such a source has no credits and no flush: nothing keeps it
// within the log, and it cannot learn when its accesses were handled.
// Nor does it take a share of the log: a plain source that fills a
// domain's log gets the credited Sources writing to that domain refused
// too, so give plain sources pages of their own domain when Sources of
// this package use the same target.
type PlainQP struct {
	t    *Target
	cq   *verbs.CQ
	qp   *verbs.QP
	info verbs.QPInfo
	rd   int
	once sync.Once
}

// PlainOptions tune Target.ConnectPlain. A nil *PlainOptions, like the
// zero value, suits a perftest client on RoCE.
type PlainOptions struct {
	// MaxRdAtomic is how many RDMA READs and atomics the source may have
	// outstanding at the target (the QP's responder resources, at most
	// 255); 0 means 16, and more than the device allows
	// (max_qp_rd_atom and max_qp_init_rd_atom: the value sets both
	// directions) is lowered to that. PlainQP.MaxRdAtomic tells what was
	// set; the source must not initiate more.
	MaxRdAtomic int
	// PathMTU is the connection's path MTU; 0 or a larger value than
	// Target.PathMTU means Target.PathMTU. It must equal the source's.
	PathMTU verbs.MTU
}

// ConnectPlain creates a queue pair for a plain verbs source and connects
// it to remote (the source's QPN, its first PSN and its GID). It returns
// the target's end, whose Info the source needs to connect its side.
// opts may be nil (see PlainOptions). It takes no context: it only
// creates and moves a local queue pair and sends nothing.
//
// Errors wrap ErrInvalid (a library-mediated target, whose handlers only
// see what its Sources send through the library, bad options, a QPN of
// 0 or beyond 24 bits), ErrClosed (the Target was closed, also while the
// queue pair was being created), or the verbs error of the failing step
// (an unreachable GID fails the move to RTR).
func (t *Target) ConnectPlain(remote verbs.QPInfo, opts *PlainOptions) (*PlainQP, error) {
	var o PlainOptions
	if opts != nil {
		o = *opts
	}
	if o.MaxRdAtomic == 0 {
		o.MaxRdAtomic = rdDepth
	}
	switch {
	case t.cfg.Mode != ModeTransparent:
		return nil, fmt.Errorf("%w: plain sources need ModeTransparent (the module makes their accesses active)", ErrInvalid)
	case o.MaxRdAtomic < 1 || o.MaxRdAtomic > 255:
		return nil, fmt.Errorf("%w: %d outstanding reads", ErrInvalid, o.MaxRdAtomic)
	case remote.QPN == 0 || remote.QPN > 0xffffff:
		return nil, fmt.Errorf("%w: remote QPN %#x", ErrInvalid, remote.QPN)
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("activeaccess: connect plain source: %w", ErrClosed)
	}
	vc, err := t.l.Context()
	if err != nil {
		return nil, fmt.Errorf("activeaccess: plain source: %w", err)
	}
	la, err := t.l.LocalAddr()
	if err != nil {
		return nil, fmt.Errorf("activeaccess: plain source: %w", err)
	}
	gid, err := vc.RoCEv2GID(1, la.Addr().AsSlice())
	if err != nil {
		return nil, fmt.Errorf("activeaccess: plain source: the GID of %v: %w", la.Addr(), err)
	}
	mtu, err := t.PathMTU()
	if err != nil {
		return nil, err
	}
	da, err := vc.QueryDevice()
	if err != nil {
		return nil, fmt.Errorf("activeaccess: plain source: %w", err)
	}
	for _, lim := range []int{da.MaxQPRdAtom, da.MaxQPInitRdAtom} {
		if lim > 0 && o.MaxRdAtomic > lim {
			o.MaxRdAtomic = lim
		}
	}
	if o.PathMTU == 0 || o.PathMTU > mtu {
		o.PathMTU = mtu
	}
	p := &PlainQP{t: t, rd: o.MaxRdAtomic}
	fail := func(err error) (*PlainQP, error) {
		p.release()
		t.mu.Lock()
		closed := t.closed
		t.mu.Unlock()
		if closed { // Close raced the creation: report it as such
			return nil, fmt.Errorf("activeaccess: connect plain source: %w", ErrClosed)
		}
		return nil, fmt.Errorf("activeaccess: plain source: %w", err)
	}
	if p.cq, err = vc.NewCQ(1, nil); err != nil {
		return fail(err)
	}
	if p.qp, err = t.pd.NewQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: p.cq, RecvCQ: p.cq,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return fail(err)
	}
	p.info = verbs.QPInfo{QPN: p.qp.QPN(), PSN: rand.Uint32() & 0xffffff, GID: gid.GID}
	if err := p.qp.Connect(p.info, remote, &verbs.ConnectOptions{GIDIndex: gid.Index, PathMTU: o.PathMTU,
		MaxRdAtomic: o.MaxRdAtomic}); err != nil {
		return fail(err)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return fail(ErrClosed)
	}
	t.plains[p] = struct{}{}
	t.mu.Unlock()
	return p, nil
}

// Info returns the target's end of the connection: what the source needs
// to move its QP to RTR (QPN, PSN, GID). It cannot fail; after Close it
// describes a queue pair that no longer exists.
func (p *PlainQP) Info() verbs.QPInfo { return p.info }

// MaxRdAtomic returns how many RDMA READs and atomics the source may have
// outstanding at the target. It cannot fail.
func (p *PlainQP) MaxRdAtomic() int { return p.rd }

// Close destroys the queue pair; the source's later accesses fail (RC
// retries, then IBV_WC_RETRY_EXC_ERR). Closing the Target closes it too.
// Only the call that released the queue pair (this one or the Target's
// Close) returns an error of the release (a verbs error); a second Close
// returns nil.
func (p *PlainQP) Close() error {
	p.t.mu.Lock()
	delete(p.t.plains, p)
	p.t.mu.Unlock()
	return p.release()
}

func (p *PlainQP) release() (err error) {
	p.once.Do(func() {
		if p.qp != nil {
			err = p.qp.Close()
		}
		if p.cq != nil {
			if e := p.cq.Close(); err == nil {
				err = e
			}
		}
	})
	return err
}

// PathMTU returns the active MTU of the target's port (port 1 of the
// listen address's device, as for every connection): the largest path
// MTU a plain source can use. Errors wrap ErrClosed or the verbs error of
// the port query.
func (t *Target) PathMTU() (verbs.MTU, error) {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("activeaccess: path MTU: %w", ErrClosed)
	}
	vc, err := t.l.Context()
	if err != nil {
		return 0, fmt.Errorf("activeaccess: path MTU: %w", err)
	}
	pa, err := vc.QueryPort(1)
	if err != nil {
		return 0, fmt.Errorf("activeaccess: path MTU: %w", err)
	}
	return pa.ActiveMTU, nil
}

// Region describes the target's memory for a plain verbs source: its
// address, rkey and length. (Sources of this package receive it when they
// connect.) It cannot fail; after Close it describes memory that no
// longer exists.
func (t *Target) Region() verbs.Remote { return t.mr.Remote() }
