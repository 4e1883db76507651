package dht

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht/internal/layout"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// RMATarget is the target of the RMA-only table (the paper's Listing 2):
// the volume in registered memory and nothing else; its CPU takes no part
// in inserts, lookups or deletes. Create it with ServeRMA.
type RMATarget struct{ s server }

// ServeRMA lays a volume of layout l out and accepts RMA sources on addr
// (a specific IP address of an RDMA device, and a port). The RMA target
// has no options. ctx bounds the set-up only: once ServeRMA returned, the
// target serves until Close. Errors wrap ctx's error (at once when ctx is
// already done), ErrInvalid (a bad layout or address) or the verbs error
// of the failing step (EADDRINUSE for a port in use; an address of no
// RDMA device fails too).
func ServeRMA(ctx context.Context, addr netip.AddrPort, l Layout) (*RMATarget, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dht: serve: %w", err)
	}
	t := &RMATarget{}
	t.s.setup = func(c *sconn) error {
		vc, err := c.id.Context()
		if err != nil {
			return err
		}
		cq, err := vc.NewCQ(4, nil)
		if err != nil {
			return err
		}
		c.qp, err = c.id.NewQP(t.s.pd, &verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
		if err != nil {
			cq.Close()
			return err
		}
		c.rcq = cq
		return nil
	}
	t.s.drop = func(c *sconn) {
		c.id.Close() // the QP first
		if c.rcq != nil {
			c.rcq.Close()
		}
	}
	if err := listenServer(addr, kindRMA, l, &t.s); err != nil {
		return nil, err
	}
	return t, nil
}

// Volume is the target's view of the table (valid until Close). It
// cannot fail.
func (t *RMATarget) Volume() *Volume { return t.s.v }

// Err reports failures while accepting sources (sources that could not
// be set up; errors.Join of the first 16), or nil when all went well.
func (t *RMATarget) Err() error { return t.s.err() }

// Close disconnects every source and frees the volume (the Volume is
// unusable after it). It always returns nil, also the second time.
func (t *RMATarget) Close() error {
	t.s.close()
	return nil
}

// RMATable is a source of the RMA-only table: inserts with remote
// compare-and-swap and fetch-and-add as in the paper's Listing 2,
// lookups with RDMA READs, deletes by compare-and-swap of a tombstone.
// Every operation waits for its atomics (the paper assumes blocking
// atomics), busy-polling the completion queue. Safe for concurrent use
// (calls are serialised).
type RMATable struct {
	mu     sync.Mutex
	k      *link
	nextID uint64
	closed bool
}

// DialRMA connects to an RMA target. ctx bounds the connection set-up
// only. Errors wrap ctx's error (at once when ctx is already done),
// ErrProtocol (not an RMA DHT target there), ErrInvalid (a bad address),
// or the verbs error of the failing step.
func DialRMA(ctx context.Context, addr netip.AddrPort) (*RMATable, error) {
	k, err := dialLink(ctx, addr, linkConfig{kind: kindRMA, sendWR: 16, recvWR: 1, buf: pageSize})
	if err != nil {
		return nil, err
	}
	return &RMATable{k: k}, nil
}

// Layout returns the target's volume layout. It cannot fail.
func (r *RMATable) Layout() Layout { return r.k.l }

func (r *RMATable) usable() error {
	if r.closed {
		return ErrClosed
	}
	return r.k.err()
}

// atomic runs one compare-and-swap (cas) or fetch-and-add at the
// target's offset off and returns the value found there.
func (r *RMATable) atomic(ctx context.Context, cas bool, off int, cmpAdd, swap uint64) (uint64, error) {
	r.nextID++
	wr := verbs.SendWR{ID: r.nextID, Op: verbs.OpAtomicFAA, Flags: verbs.SendSignaled, SGL: []verbs.SGE{r.k.mr.SGE(0, 8)},
		RemoteAddr: r.k.rem.Addr + uint64(off), RKey: r.k.rem.RKey, CompareAdd: cmpAdd, Swap: swap}
	if cas {
		wr.Op = verbs.OpAtomicCAS
	}
	if err := r.k.post(wr); err != nil {
		return 0, err
	}
	if _, err := r.k.waitID(ctx, r.nextID, nil); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(r.k.mr.Bytes()), nil
}

// write puts the 8-byte v at the target's offset off (inline, signaled;
// its completion is collected by the next wait).
func (r *RMATable) write(off int, v uint64) error {
	b := r.k.mr.Bytes()[64:72]
	binary.LittleEndian.PutUint64(b, v)
	r.nextID++
	return r.k.post(verbs.SendWR{ID: r.nextID, Op: verbs.OpWrite, Flags: verbs.SendSignaled | verbs.SendInline,
		SGL: []verbs.SGE{r.k.mr.SGE(64, 8)}, RemoteAddr: r.k.rem.Addr + uint64(off), RKey: r.k.rem.RKey})
}

// Insert stores key with value (Listing 2): a compare-and-swap claims the
// bucket's cell; on a collision a fetch-and-add takes a heap cell, a put
// fills it, a swap (a compare-and-swap loop: the verbs have no atomic
// swap) makes it the bucket's newest chain cell, and a put links it
// behind the previous one. RC executes one QP's requests in order, so no
// flush is needed between the puts and the atomics. Errors: ErrInvalid
// (key 0), ErrFull (the heap is full: the element is not stored; the
// heap's counter stays past its end), ErrDisconnected, ErrClosed, ctx's
// (see Table).
func (r *RMATable) Insert(ctx context.Context, key, value uint32) error {
	if err := r.insert(ctx, key, value); err != nil {
		return callErr("insert", err)
	}
	return nil
}

func (r *RMATable) insert(ctx context.Context, key, value uint32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkKey(key); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return err
	}
	l, e := r.k.g, layout.Elem(key, value)
	pos := l.Bucket(key)
	old, err := r.atomic(ctx, true, l.CellOff(pos), 0, e)
	if err != nil || old == 0 {
		return err
	}
	free, err := r.atomic(ctx, false, l.NextFreeOff(), 1, 0)
	if err != nil {
		return err
	}
	if free >= uint64(l.Heap) {
		return fmt.Errorf("%w: key %d collided in bucket %d and all %d heap cells are taken", ErrFull, key, pos, l.Heap)
	}
	c := uint64(l.Buckets) + free
	if err := r.write(l.CellOff(int(c)), e); err != nil {
		return err
	}
	var prev uint64
	for {
		got, err := r.atomic(ctx, true, l.LastOff(pos), prev, c)
		if err != nil {
			return err
		}
		if got == prev {
			break
		}
		prev = got
	}
	link := l.CellOff(pos) + 8
	if prev != 0 {
		link = l.CellOff(int(prev)) + 8
	}
	return r.write(link, c)
}

// Lookup returns key's value: an RDMA READ of the bucket's cell, then
// one per chain cell. Errors: ErrInvalid, ErrProtocol (a corrupt chain),
// ErrDisconnected, ErrClosed, ctx's (see Table).
func (r *RMATable) Lookup(ctx context.Context, key uint32) (uint32, bool, error) {
	if err := ctx.Err(); err != nil {
		return 0, false, callErr("lookup", err)
	}
	if err := checkKey(key); err != nil {
		return 0, false, callErr("lookup", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return 0, false, callErr("lookup", err)
	}
	_, e, ok, err := findRemote(ctx, r.k.g, r.k.cellReader(nil), key)
	if err != nil {
		return 0, false, callErr("lookup", err)
	}
	_, v := layout.Split(e)
	return v, ok, nil
}

// Delete tombstones key's cell with a compare-and-swap (found with
// reads; retried when the cell changed meanwhile); a key that is not
// there is no error. Errors as for Lookup.
func (r *RMATable) Delete(ctx context.Context, key uint32) error {
	if err := r.delete(ctx, key); err != nil {
		return callErr("delete", err)
	}
	return nil
}

func (r *RMATable) delete(ctx context.Context, key uint32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkKey(key); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return err
	}
	for {
		i, e, ok, err := findRemote(ctx, r.k.g, r.k.cellReader(nil), key)
		if err != nil || !ok {
			return err
		}
		got, err := r.atomic(ctx, true, r.k.g.CellOff(i), e, layout.Tombstone)
		if err != nil || got == e {
			return err
		}
	}
}

// Flush returns once every put of earlier inserts completed at the
// target (the atomics are complete when their calls return): one RDMA
// READ, which RC completes after the writes before it. Errors:
// ErrDisconnected, ErrClosed, ctx's (see Table).
func (r *RMATable) Flush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return callErr("flush", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return callErr("flush", err)
	}
	if err := r.k.read(ctx, 0, 8, 128, nil); err != nil { // RC: completes after the writes
		return callErr("flush", err)
	}
	return nil
}

// Close disconnects (waiting at most 2 s for the target's answer) and
// frees the connection. It returns nil, also the second time.
func (r *RMATable) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	return r.k.close()
}
