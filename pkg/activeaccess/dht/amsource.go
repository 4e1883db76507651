package dht

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess/dht/internal/layout"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// AMTable is a source of the active-message table: Insert and Delete
// SEND one 16-byte request each (inline; one SEND in amSignalEvery asks
// for a completion), at most amWindow requests ahead of the target's
// last status; Flush sends a flush request and waits for its status;
// Lookup reads cells with RDMA READs like the other tables. Requests are
// queued and posted amBatch at a time, in one chain (one system call on
// rxe), or at the next Flush, Lookup or Close: the same batching the
// Active Access Source does, so that the comparison measures the
// designs, not the number of posts. Safe for concurrent use (calls are
// serialised).
type AMTable struct {
	mu     sync.Mutex
	k      *link
	closed bool
	pend   []verbs.SendWR // queued requests, in the MR at 128 + i*amReqLen
	sges   [amBatch]verbs.SGE

	posted   uint64 // requests posted
	reaped   uint64 // requests whose send completed (signalled ones cover the ones before)
	st       amStatus
	token    uint32
	reported amStatus // full and rejected already reported by Flush
}

// DialAM connects to an AM target. ctx bounds the connection set-up
// only. Errors wrap ctx's error (at once when ctx is already done),
// ErrProtocol (not an AM DHT target there), ErrInvalid (a bad address),
// or the verbs error of the failing step.
func DialAM(ctx context.Context, addr netip.AddrPort) (*AMTable, error) {
	k, err := dialLink(ctx, addr, linkConfig{kind: kindAM, sendWR: amSourceSQ, recvWR: amSourceRecv,
		buf: pageSize + amSourceRecv*amStatusLen})
	if err != nil {
		return nil, err
	}
	a := &AMTable{k: k}
	for i := 0; i < amSourceRecv; i++ {
		if err := a.postRecv(i); err != nil {
			k.close()
			return nil, fmt.Errorf("dht: %w", err)
		}
	}
	return a, nil
}

const amRecvID = 1 << 62

// amBatch requests are posted in one chain; their buffers (inline, so
// free again once posted) lie in the scratch page after offset 128.
const amBatch = 32

func (a *AMTable) postRecv(i int) error {
	o := pageSize + i*amStatusLen
	return a.k.qp.PostRecv(verbs.RecvWR{ID: amRecvID | uint64(i), SGL: []verbs.SGE{a.k.mr.SGE(o, amStatusLen)}})
}

// Layout returns the target's volume layout. It cannot fail.
func (a *AMTable) Layout() Layout { return a.k.l }

// completion takes a completion other than the one being waited for.
func (a *AMTable) completion(wc verbs.WC) error {
	if err := a.k.wcErr(wc); err != nil {
		return err
	}
	if wc.ID&amRecvID == 0 {
		a.reaped = max(a.reaped, wc.ID) // sends: the id is the count posted
		return nil
	}
	i := int(wc.ID &^ amRecvID)
	o := pageSize + i*amStatusLen
	st, ok := parseStatus(a.k.mr.Bytes()[o : o+min(int(wc.ByteLen), amStatusLen)])
	if !ok || st.handled > a.posted {
		a.k.fail(fmt.Errorf("%w: a malformed status from the target", ErrProtocol))
		a.k.qp.ToError()
		return a.k.err()
	}
	if st.handled >= a.st.handled {
		a.st = st
	}
	if err := a.postRecv(i); err != nil {
		a.k.fail(fmt.Errorf("%w: %w", ErrDisconnected, err))
		return a.k.err()
	}
	return nil
}

// poll takes completions, spinning for at least one if wait.
func (a *AMTable) poll(ctx context.Context, wait bool) error {
	var wcs [32]verbs.WC
	var n int
	var err error
	if wait {
		n, err = a.k.cq.Spin(ctx, wcs[:])
	} else {
		n, err = a.k.cq.Poll(wcs[:])
	}
	if err != nil {
		return fmt.Errorf("dht: %w", err)
	}
	for _, wc := range wcs[:n] {
		if err := a.completion(wc); err != nil {
			return err
		}
	}
	return nil
}

// send queues one request, waiting for receive credits and send queue
// room, and posts the queue when it holds amBatch requests or now is
// set; a.mu held.
func (a *AMTable) send(ctx context.Context, r amReq, now bool) error {
	if a.closed {
		return ErrClosed
	}
	if err := a.k.err(); err != nil {
		return err
	}
	for {
		ahead := a.posted + uint64(len(a.pend))
		if ahead-a.st.handled < amWindow && ahead-a.reaped < amSourceSQ-1 {
			break
		}
		if len(a.pend) > 0 { // what the target and the queue wait for
			if err := a.postQueued(ctx); err != nil {
				return err
			}
			continue
		}
		if err := a.poll(ctx, true); err != nil {
			return err
		}
	}
	i := len(a.pend)
	off := 128 + i*amReqLen
	r.put(a.k.mr.Bytes()[off : off+amReqLen])
	id := a.posted + uint64(i) + 1 // the count posted once this one is
	a.sges[i] = a.k.mr.SGE(off, amReqLen)
	wr := verbs.SendWR{ID: id, Op: verbs.OpSend, Flags: verbs.SendInline, SGL: a.sges[i : i+1]}
	if now || id%amSignalEvery == 0 {
		wr.Flags |= verbs.SendSignaled
	}
	a.pend = append(a.pend, wr)
	if now || len(a.pend) == amBatch {
		return a.postQueued(ctx)
	}
	return nil
}

// postQueued posts the queued requests in one chain; a.mu held. If the
// post fails the link has failed, and the requests are lost with it.
func (a *AMTable) postQueued(ctx context.Context) error {
	if len(a.pend) == 0 {
		return nil
	}
	before := a.posted
	err := a.k.post(a.pend...)
	if err == nil {
		a.posted += uint64(len(a.pend))
	}
	a.pend = a.pend[:0]
	if err != nil {
		return err
	}
	if a.posted/amSignalEvery != before/amSignalEvery {
		return a.poll(ctx, false)
	}
	return nil
}

// Insert sends key and value to the target, whose handler stores them
// (the paper's local_insert). It returns once the request is queued
// (posted with the next amBatch, or by Flush); Flush reports inserts the
// target could not store. Errors: ErrInvalid (key 0), ErrDisconnected,
// ErrClosed, ctx's (see Table).
func (a *AMTable) Insert(ctx context.Context, key, value uint32) error {
	if err := ctx.Err(); err != nil {
		return callErr("insert", err)
	}
	if err := checkKey(key); err != nil {
		return callErr("insert", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.send(ctx, amReq{op: amInsert, arg: layout.Elem(key, value)}, false); err != nil {
		return callErr("insert", err)
	}
	return nil
}

// Delete sends key to the target, whose handler tombstones its cell.
// Errors as for Insert.
func (a *AMTable) Delete(ctx context.Context, key uint32) error {
	if err := ctx.Err(); err != nil {
		return callErr("delete", err)
	}
	if err := checkKey(key); err != nil {
		return callErr("delete", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.send(ctx, amReq{op: amDelete, arg: uint64(key)}, false); err != nil {
		return callErr("delete", err)
	}
	return nil
}

// Flush returns once the target handled every earlier request. Errors:
// ErrFull (that many inserts since the last Flush were not stored: the
// heap was full), ErrRejected (requests the target could not parse),
// ErrDisconnected, ErrClosed, ctx's (see Table).
func (a *AMTable) Flush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return callErr("flush", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.token++
	if err := a.send(ctx, amReq{op: amFlush, token: a.token}, true); err != nil {
		return callErr("flush", err)
	}
	for a.st.flushed != a.token || a.st.handled < a.posted {
		if err := a.poll(ctx, true); err != nil {
			return callErr("flush", err)
		}
	}
	full, rejected := a.st.full-a.reported.full, a.st.rejected-a.reported.rejected
	a.reported = a.st
	return flushErr(uint64(full), uint64(rejected))
}

// Lookup returns key's value, reading cells with RDMA READs (after
// posting the queued requests). Errors as for RMATable.Lookup.
func (a *AMTable) Lookup(ctx context.Context, key uint32) (uint32, bool, error) {
	if err := ctx.Err(); err != nil {
		return 0, false, callErr("lookup", err)
	}
	if err := checkKey(key); err != nil {
		return 0, false, callErr("lookup", err)
	}
	v, ok, err := a.lookup(ctx, key)
	if err != nil {
		return 0, false, callErr("lookup", err)
	}
	return v, ok, nil
}

func (a *AMTable) lookup(ctx context.Context, key uint32) (uint32, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, false, ErrClosed
	}
	if err := a.k.err(); err != nil {
		return 0, false, err
	}
	if err := a.postQueued(ctx); err != nil {
		return 0, false, err
	}
	if a.posted-a.reaped >= amSourceSQ-1 {
		if err := a.poll(ctx, true); err != nil {
			return 0, false, err
		}
	}
	_, e, ok, err := findRemote(ctx, a.k.g, a.k.cellReader(a.completion), key)
	_, v := layout.Split(e)
	return v, ok, err
}

// Close posts what is queued and disconnects (waiting at most 2 s for
// the target's answer); requests since the last Flush may or may not
// have been handled. It returns nil, also the second time.
func (a *AMTable) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	a.postQueued(context.Background()) // best effort: the caller did not Flush
	return a.k.close()
}
