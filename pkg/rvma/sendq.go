package rvma

import (
	"sync"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// putSignalEvery is how often a put is posted signaled while others are
// in flight on its stripe. Each completion costs the sender a completion
// event, a wake-up of the progress goroutine and a re-arm of the CQ (on
// rxe about as much CPU as the post of a 64 KiB put); a signaled
// completion also reports every put posted before it on the same queue,
// because an RC send queue completes in order.
const putSignalEvery = 16

// sendQueue tracks the work requests of one stripe's send queue so that
// puts posted unsignaled are still reported: a completion of work request
// s (signaled, or an error, which is always reported) means that every
// put posted before s on the queue was placed. A put is posted signaled
// when no signaled work request is outstanding (so a lone put, as in a
// ping-pong, costs no more than before) or after putSignalEvery-1
// unsignaled ones; when the last signaled one completes with unsignaled
// puts behind it, a zero-length RDMA WRITE (no memory touched, no key
// checked) is posted signaled to report them (tail).
//
// Completions must be handled in the order the CQ returned them
// (engine.handleMu): an error completion also reports the puts before it
// as placed, which is true only once their own error completions, if
// any, were handled.
type sendQueue struct {
	mu       sync.Mutex
	seq      uint64 // the sequence number of the last work request posted
	sigOut   int    // signaled work requests posted and not completed
	unsigRun int    // puts posted unsignaled since the last signaled one
	puts     []sqPut
}

// sqPut is a put posted on the queue and not yet known to be complete.
type sqPut struct {
	seq      uint64
	id       uint64
	op       *PutOp
	signaled bool
}

// postPut posts wr (a put whose ID is sendTag|id) with post (the
// stripe's QP.PostSend) and records it. reg is
// called under the queue's lock before the post, with the put's sequence
// number, so that the put is known before its completion can be handled.
func (q *sendQueue) postPut(post func(...verbs.SendWR) error, wr verbs.SendWR, id uint64, op *PutOp, reg func(seq uint64)) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	signaled := q.sigOut == 0 || q.unsigRun >= putSignalEvery-1
	wr.Flags &^= verbs.SendSignaled
	if signaled {
		wr.Flags |= verbs.SendSignaled
	}
	seq := q.seq + 1
	reg(seq)
	if err := post(wr); err != nil {
		return err
	}
	q.seq = seq
	q.puts = append(q.puts, sqPut{seq: seq, id: id, op: op, signaled: signaled})
	if signaled {
		q.sigOut++
		q.unsigRun = 0
	} else {
		q.unsigRun++
	}
	return nil
}

// postSignaled posts wr, signaled, with its sequence number in the low
// bits of its ID (under ctrlTag): control sends and the tail WRITE.
func (q *sendQueue) postSignaled(post func(...verbs.SendWR) error, wr verbs.SendWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	seq := q.seq + 1
	wr.ID = sendTag | ctrlTag | seq
	wr.Flags |= verbs.SendSignaled
	if err := post(wr); err != nil {
		return err
	}
	q.seq = seq
	q.sigOut++
	return nil
}

// completed records the completion of work request seq (of a put if put)
// and returns the puts posted before it, now known to be placed. The
// put's own entry is dropped; the caller handles its outcome.
func (q *sendQueue) completed(seq uint64, put bool) []sqPut {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := 0
	for i < len(q.puts) && q.puts[i].seq < seq {
		if q.puts[i].signaled && q.sigOut > 0 {
			q.sigOut-- // not with completions handled in order; kept consistent if so
		}
		i++
	}
	done := append([]sqPut(nil), q.puts[:i]...)
	signaled := !put
	if i < len(q.puts) && q.puts[i].seq == seq {
		signaled = q.puts[i].signaled
		i++
	}
	clear(q.puts[:i])
	q.puts = q.puts[i:]
	if signaled && q.sigOut > 0 {
		q.sigOut--
	}
	return done
}

// needsTail reports whether unsignaled puts wait with no signaled work
// request behind them.
func (q *sendQueue) needsTail() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.sigOut == 0 && len(q.puts) > 0
}
