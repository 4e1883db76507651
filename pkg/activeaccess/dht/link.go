package dht

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht/internal/layout"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// The RMA and AM tables connect with rdma_cm. The connect request
// carries hello (magic, table kind); the accept carries the target's
// memory (address, rkey, length), so no key exchange is visible.
const (
	kindRMA   = 1
	kindAM    = 2
	helloLen  = 8
	acceptLen = 24
	linkMagic = 0x54484430 // "0DHT"
	idRead    = 1 << 63    // the work request id of link.read
)

func marshalHello(kind byte) []byte {
	b := make([]byte, helloLen)
	binary.LittleEndian.PutUint32(b, linkMagic)
	b[4] = kind
	return b
}

func parseHello(b []byte) (byte, bool) {
	if len(b) < helloLen || binary.LittleEndian.Uint32(b) != linkMagic {
		return 0, false
	}
	return b[4], true
}

// remoteMem is the target's registered memory, as a source sees it.
type remoteMem struct {
	Addr uint64
	RKey uint32
	Len  uint32
}

func (r remoteMem) marshal() []byte {
	b := make([]byte, acceptLen)
	binary.LittleEndian.PutUint32(b, linkMagic)
	binary.LittleEndian.PutUint64(b[8:], r.Addr)
	binary.LittleEndian.PutUint32(b[16:], r.RKey)
	binary.LittleEndian.PutUint32(b[20:], r.Len)
	return b
}

func parseRemote(b []byte) (remoteMem, error) {
	if len(b) < acceptLen || binary.LittleEndian.Uint32(b) != linkMagic {
		return remoteMem{}, fmt.Errorf("%w: the target's accept carries no DHT memory description", ErrProtocol)
	}
	return remoteMem{binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint32(b[16:]), binary.LittleEndian.Uint32(b[20:])}, nil
}

// link is a source's connection for the RMA and AM tables: one RC QP
// whose send and receive completions the caller polls on one CQ (with
// CQ.Spin: the lowest latency, one CPU while waiting), a registered
// scratch buffer, and a goroutine that breaks the QP when the target
// disconnects, so nothing waits on a dead target.
type link struct {
	id     *verbs.CMID
	pd     *verbs.PD
	cq     *verbs.CQ
	qp     *verbs.QP
	mr     *verbs.MR
	rem    remoteMem
	l      Layout
	g      layout.Layout // l's geometry
	broken atomic.Pointer[error]
	stop   context.CancelFunc
	done   chan struct{}
}

type linkConfig struct {
	kind           byte
	sendWR, recvWR int
	buf            int // scratch bytes
}

func dialLink(ctx context.Context, addr netip.AddrPort, c linkConfig) (*link, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dht: dial: %w", err)
	}
	if !addr.IsValid() {
		return nil, fmt.Errorf("%w: target address %v", ErrInvalid, addr)
	}
	k := &link{done: make(chan struct{})}
	if err := k.dial(ctx, addr, c); err != nil {
		k.release()
		return nil, err
	}
	wctx, stop := context.WithCancel(context.Background())
	k.stop = stop
	go k.watch(wctx)
	// The volume's layout is in the header page.
	b := k.mr.Bytes()[:layout.HeaderLen]
	if err := k.read(ctx, 0, layout.HeaderLen, 0, nil); err != nil {
		k.close()
		return nil, fmt.Errorf("dht: reading the volume header: %w", err)
	}
	var err error
	if k.l, err = parseHeader(b, int(k.rem.Len)); err != nil {
		k.close()
		return nil, err
	}
	k.g = k.l.geo()
	return k, nil
}

func (k *link) dial(ctx context.Context, addr netip.AddrPort, c linkConfig) error {
	var err error
	if k.id, err = verbs.NewCMID(verbs.PSTCP); err != nil {
		return fmt.Errorf("dht: dial: %w", err)
	}
	if err := k.id.ResolveAddr(ctx, netip.AddrPort{}, addr); err != nil {
		return fmt.Errorf("dht: dial %v: %w", addr, err)
	}
	if err := k.id.ResolveRoute(ctx); err != nil {
		return fmt.Errorf("dht: dial %v: %w", addr, err)
	}
	vc, err := k.id.Context()
	if err != nil {
		return fmt.Errorf("dht: dial %v: %w", addr, err)
	}
	if k.pd, err = vc.AllocPD(); err != nil {
		return fmt.Errorf("dht: dial: %w", err)
	}
	if k.cq, err = vc.NewCQ(c.sendWR+c.recvWR, nil); err != nil {
		return fmt.Errorf("dht: dial: %w", err)
	}
	if k.qp, err = k.id.NewQP(k.pd, &verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: k.cq, RecvCQ: k.cq,
		Cap: verbs.QPCap{MaxSendWR: c.sendWR, MaxRecvWR: max(c.recvWR, 1), MaxInlineData: 64}}); err != nil {
		return fmt.Errorf("dht: dial: %w", err)
	}
	if k.mr, err = k.pd.AllocMR(max(c.buf, pageSize), verbs.AccessLocalWrite); err != nil {
		return fmt.Errorf("dht: dial: %w", err)
	}
	err = k.id.Connect(ctx, &verbs.ConnParam{PrivateData: marshalHello(c.kind), ResponderResources: 16, InitiatorDepth: 16})
	var rej *verbs.RejectError
	if errors.As(err, &rej) {
		return fmt.Errorf("%w: the target at %v rejected the connection (status %d): no DHT target of this kind listens there", ErrProtocol, addr, rej.Status)
	}
	if err != nil {
		return fmt.Errorf("dht: connect to %v: %w", addr, err)
	}
	k.rem, err = parseRemote(k.id.AcceptData())
	return err
}

// watch breaks the link when the target disconnects: the QP goes to the
// error state, so every posted request completes (flushed).
func (k *link) watch(ctx context.Context) {
	defer close(k.done)
	for {
		ev, err := k.id.WaitEvent(ctx)
		if err != nil {
			return
		}
		if ev.Type == verbs.CMDisconnected || ev.Type == verbs.CMDeviceRemoval {
			k.fail(fmt.Errorf("%w: the target closed the connection (%v)", ErrDisconnected, ev.Type))
			k.qp.ToError()
			return
		}
	}
}

func (k *link) fail(err error) {
	k.broken.CompareAndSwap(nil, &err)
}

// err is the error that broke the link, or nil.
func (k *link) err() error {
	if p := k.broken.Load(); p != nil {
		return *p
	}
	return nil
}

// wcErr turns a failed completion into the link's error and breaks it.
func (k *link) wcErr(wc verbs.WC) error {
	err := wc.Err()
	if err == nil {
		return nil
	}
	if prev := k.err(); prev != nil {
		return prev
	}
	if errors.Is(err, verbs.WCRemAccessErr) || errors.Is(err, verbs.WCRemInvReqErr) {
		k.fail(fmt.Errorf("%w: the target refused an access: %w", ErrRejected, err))
	} else {
		k.fail(fmt.Errorf("%w: %w", ErrDisconnected, err))
	}
	return k.err()
}

// post posts wr, mapping a failure onto the link's error.
func (k *link) post(wrs ...verbs.SendWR) error {
	if err := k.err(); err != nil {
		return err
	}
	if err := k.qp.PostSend(wrs...); err != nil {
		if e := k.err(); e != nil {
			return e
		}
		k.fail(fmt.Errorf("%w: posting: %w", ErrDisconnected, err))
		return k.err()
	}
	return nil
}

// read posts an RDMA READ of n bytes at the target's offset off into the
// scratch buffer at local and waits for it; other completions on the
// way go to other (see waitID).
func (k *link) read(ctx context.Context, off, n, local int, other func(verbs.WC) error) error {
	wr := verbs.SendWR{ID: idRead, Op: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{k.mr.SGE(local, n)},
		RemoteAddr: k.rem.Addr + uint64(off), RKey: k.rem.RKey}
	if err := k.post(wr); err != nil {
		return err
	}
	_, err := k.waitID(ctx, idRead, other)
	return err
}

// waitID spins until the completion with work request id arrives;
// the other completions on the way are passed to other (nil: dropped),
// which may fail the wait.
func (k *link) waitID(ctx context.Context, id uint64, other func(verbs.WC) error) (verbs.WC, error) {
	var wcs [16]verbs.WC
	for {
		n, err := k.cq.Spin(ctx, wcs[:])
		if err != nil {
			return verbs.WC{}, fmt.Errorf("dht: waiting for a completion: %w", err)
		}
		for _, wc := range wcs[:n] {
			if err := k.wcErr(wc); err != nil {
				return wc, err
			}
			if wc.ID == id {
				return wc, nil
			}
			if other != nil {
				if err := other(wc); err != nil {
					return wc, err
				}
			}
		}
	}
}

// cellReader reads cells into scratch bytes [0, 16), passing other
// completions to other.
func (k *link) cellReader(other func(verbs.WC) error) cellReader {
	return func(ctx context.Context, i int, b []byte) error {
		if err := k.read(ctx, k.g.CellOff(i), cellSize, 0, other); err != nil {
			return err
		}
		copy(b, k.mr.Bytes()[:cellSize])
		return nil
	}
}

// close disconnects (briefly waiting for the target's answer) and frees
// the verbs objects.
func (k *link) close() error {
	k.stop() // the watcher would take the disconnect's answer
	<-k.done
	if k.err() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		k.id.Disconnect(ctx)
		cancel()
		k.fail(ErrClosed)
	}
	k.release()
	return nil
}

func (k *link) release() {
	if k.id != nil {
		k.id.Close() // and the QP
	}
	if k.cq != nil {
		k.cq.Close()
	}
	if k.pd != nil {
		k.pd.Close() // and the MR
	}
}
