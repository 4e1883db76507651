package activeaccess

import (
	"errors"
	"fmt"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// The source's send queue. On rxe every ibv_post_send is a system call
// that runs the requester inline, and every signaled completion is a
// completion-queue entry the cqLoop goroutine must be woken for, so a
// Source does not post each operation on its own: operations and markers
// are queued, and the queue is posted as one chain (one system call)
//
//   - at once when nothing signaled is in flight (an idle connection adds
//     no latency),
//   - when a chain's worth is queued,
//   - when a completion arrives (cqLoop posts what queued meanwhile), and
//   - when a caller is about to wait for a queued operation (Op.Wait,
//     Op.Done, Flush, FlushPlain, or a wait for credits).
//
// In a chain only the last work request and one in sigEvery are signaled.
// RC completes a send queue in order, so a signaled completion completes
// every work request posted before it; and RC reports a failed work
// request with an error completion whether or not it was signaled, so an
// error reaches the operation it belongs to. Because the last work
// request posted is always signaled, whatever is queued or in flight is
// covered by a completion still to come: nothing waits forever.

// chainMax is the longest chain posted at once (pkg/verbs posts up to 64
// without allocating).
const chainMax = 64

// sqEntry is a work request posted and not yet known to be complete.
type sqEntry struct {
	id uint64
	op *Op // nil for a marker
}

// sendQueue is the queued and in-flight work requests; guarded by the
// Source's mu.
type sendQueue struct {
	wrs []verbs.SendWR // queued, not posted; SGL set when posting
	sge []verbs.SGE    // each queued request's one SGE
	ops []*Op          // each queued request's operation (nil: a marker or a probe)

	flight     []sqEntry // ring of posted requests, oldest at head
	head, n    int
	sinceSig   int // requests posted since the last signaled one
	sigEvery   int
	postedSeq  uint64 // the newest operation posted
	posts      uint64 // chains posted
	signaled   uint64 // requests posted signaled
	unsignaled uint64
}

func newSendQueue(slots, sigEvery int) sendQueue {
	return sendQueue{
		wrs:      make([]verbs.SendWR, 0, slots),
		sge:      make([]verbs.SGE, 0, slots),
		ops:      make([]*Op, 0, slots),
		flight:   make([]sqEntry, slots),
		sigEvery: max(1, sigEvery),
	}
}

func (q *sendQueue) push(e sqEntry) {
	q.flight[(q.head+q.n)%len(q.flight)] = e
	q.n++
}

func (q *sendQueue) pop() sqEntry {
	e := q.flight[q.head]
	q.flight[q.head] = sqEntry{}
	q.head = (q.head + 1) % len(q.flight)
	q.n--
	return e
}

// find returns the position in flight of the request with id, or -1.
func (q *sendQueue) find(id uint64) int {
	for i := 0; i < q.n; i++ {
		if q.flight[(q.head+i)%len(q.flight)].id == id {
			return i
		}
	}
	return -1
}

// queueLocked adds a work request with exactly one SGE (one of length 0
// stands for none), for o (nil: a marker or a probe), to the queue; s.mu
// held, its send queue slot already taken from sqFree.
func (s *Source) queueLocked(wr verbs.SendWR, o *Op) {
	q := &s.sq
	q.sge = append(q.sge, wr.SGL[0])
	wr.SGL = nil
	q.wrs = append(q.wrs, wr)
	q.ops = append(q.ops, o)
}

// maybePostLocked posts the queue if no completion would come to post it
// (nothing in flight) or a chain's worth is queued; s.mu held. Errors as
// for postLocked.
func (s *Source) maybePostLocked() error {
	if len(s.sq.wrs) > 0 && (s.sq.n == 0 || len(s.sq.wrs) >= chainMax) {
		return s.postLocked()
	}
	return nil
}

// postLocked posts every queued work request, in chains of at most
// chainMax, signaling the last of each chain and one in sigEvery; s.mu
// held. A failure breaks the connection, moves the QP to the error state
// and fails every operation not yet complete; the error (ErrDisconnected
// wrapping the verbs error) is returned too.
func (s *Source) postLocked() error {
	q := &s.sq
	for len(q.wrs) > 0 {
		k := min(len(q.wrs), chainMax)
		for i := 0; i < k; i++ {
			w := &q.wrs[i]
			w.SGL = q.sge[i : i+1 : i+1]
			if q.sge[i].Length == 0 { // no data (a probe): no SGE
				w.SGL = nil
			}
			q.sinceSig++
			if i == k-1 || q.sinceSig >= q.sigEvery {
				w.Flags |= verbs.SendSignaled
				q.sinceSig = 0
				q.signaled++
			} else {
				q.unsignaled++
			}
		}
		err := s.qp.PostSend(q.wrs[:k]...)
		posted := k
		if err != nil {
			posted = 0
			var pe *verbs.PostError
			if errors.As(err, &pe) && pe.Index > 0 && pe.Index < k {
				posted = pe.Index
			}
		}
		q.posts++
		for i := 0; i < posted; i++ {
			q.push(sqEntry{id: q.wrs[i].ID, op: q.ops[i]})
			if o := q.ops[i]; o != nil {
				q.postedSeq = o.seq
			}
		}
		if err != nil {
			err = fmt.Errorf("%w: posting: %w", ErrDisconnected, err)
			s.breakLocked(err)
			s.qp.ToError() // what was posted is flushed
			s.failAllLocked(err)
			return err
		}
		nw := copy(q.wrs, q.wrs[k:])
		copy(q.sge, q.sge[k:])
		copy(q.ops, q.ops[k:])
		clear(q.ops[nw:])
		q.wrs, q.sge, q.ops = q.wrs[:nw], q.sge[:nw], q.ops[:nw]
	}
	return nil
}

// sendCompletedLocked takes the completion of a posted work request: it
// and every request posted before it are complete; an error fails the
// request it names and, as RC moved the QP to the error state, breaks the
// connection and fails everything after it. s.mu held.
func (s *Source) sendCompletedLocked(wc verbs.WC) {
	q := &s.sq
	werr := wc.Err()
	j := q.find(wc.ID)
	if j < 0 { // already failed: flushed after the connection broke
		if werr != nil {
			s.breakLocked(wcError(werr, s.broken))
		}
		return
	}
	for ; j > 0; j-- {
		e := q.pop()
		s.sqFree++
		s.probing = s.probing && e.id&wrProbe == 0
		if e.op != nil {
			s.sentLocked(e.op, nil)
		}
	}
	e := q.pop()
	s.sqFree++
	s.probing = s.probing && e.id&wrProbe == 0
	if werr == nil {
		if e.op != nil {
			s.sentLocked(e.op, nil)
		}
		return
	}
	err := wcError(werr, s.broken)
	if e.op == nil {
		s.breakLocked(err)
	} else {
		if s.broken == nil {
			s.breakLocked(fmt.Errorf("%w: the connection failed after: %w", ErrDisconnected, err))
		}
		s.sentLocked(e.op, err)
	}
	s.failAllLocked(s.broken)
}

// sentLocked records that o's work request completed (with err if it
// failed) and finishes o unless it still waits for a mediated target's
// answer; s.mu held.
func (s *Source) sentLocked(o *Op, err error) {
	o.sent = true
	if err != nil || !o.needAnswer || o.answered {
		s.finish(o, err)
	}
}

// kick posts the queue if o is still in it, because a caller is about to
// wait for o.
func (s *Source) kick(o *Op) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !o.finished && o.seq > s.sq.postedSeq && !s.closed.Load() && s.broken == nil {
		s.postLocked() // a failure fails o too
	}
}
