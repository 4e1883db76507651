package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
)

// EventType is the type of an asynchronous event (enum ibv_event_type).
type EventType int

// Asynchronous event types.
const (
	EventCQErr            EventType = 0
	EventQPFatal          EventType = 1
	EventQPReqErr         EventType = 2
	EventQPAccessErr      EventType = 3
	EventCommEst          EventType = 4
	EventSQDrained        EventType = 5
	EventPathMig          EventType = 6
	EventPathMigErr       EventType = 7
	EventDeviceFatal      EventType = 8
	EventPortActive       EventType = 9
	EventPortErr          EventType = 10
	EventLIDChange        EventType = 11
	EventPKeyChange       EventType = 12
	EventSMChange         EventType = 13
	EventSRQErr           EventType = 14
	EventSRQLimitReached  EventType = 15
	EventQPLastWQEReached EventType = 16
	EventClientReregister EventType = 17
	EventGIDChange        EventType = 18
	EventWQFatal          EventType = 19
)

var eventNames = [...]string{"IBV_EVENT_CQ_ERR", "IBV_EVENT_QP_FATAL", "IBV_EVENT_QP_REQ_ERR",
	"IBV_EVENT_QP_ACCESS_ERR", "IBV_EVENT_COMM_EST", "IBV_EVENT_SQ_DRAINED", "IBV_EVENT_PATH_MIG",
	"IBV_EVENT_PATH_MIG_ERR", "IBV_EVENT_DEVICE_FATAL", "IBV_EVENT_PORT_ACTIVE", "IBV_EVENT_PORT_ERR",
	"IBV_EVENT_LID_CHANGE", "IBV_EVENT_PKEY_CHANGE", "IBV_EVENT_SM_CHANGE", "IBV_EVENT_SRQ_ERR",
	"IBV_EVENT_SRQ_LIMIT_REACHED", "IBV_EVENT_QP_LAST_WQE_REACHED", "IBV_EVENT_CLIENT_REREGISTER",
	"IBV_EVENT_GID_CHANGE", "IBV_EVENT_WQ_FATAL"}

func (t EventType) String() string {
	if t >= 0 && int(t) < len(eventNames) {
		return eventNames[t]
	}
	return fmt.Sprintf("IBV_EVENT(%d)", int(t))
}

// EventNone is the Type of the AsyncEvent a failed WaitAsyncEvent returns.
const EventNone EventType = -1

// AsyncEvent is an asynchronous event of a device. Depending on Type it
// names a QP (QPN, and QP), a CQ, an SRQ or a Port; a device-wide event
// (EventDeviceFatal) names none. QP, CQ and SRQ are nil when the object
// was not created by this package or is already closed (QPN is still
// set for a QP).
type AsyncEvent struct {
	Type EventType
	Port int
	QPN  uint32
	QP   *QP
	CQ   *CQ
	SRQ  *SRQ
}

func (e AsyncEvent) String() string {
	switch {
	case e.Type == EventNone:
		return "no event"
	case e.QPN != 0 || e.QP != nil:
		return fmt.Sprintf("%v on QP %d", e.Type, e.QPN)
	case e.Port != 0:
		return fmt.Sprintf("%v on port %d", e.Type, e.Port)
	}
	return e.Type.String()
}

// asyncQueueMax bounds the events kept for WaitAsyncEvent; beyond it the
// oldest go (AsyncEventsDropped counts them).
const asyncQueueMax = 256

// readAsync reads the device's asynchronous events from the moment the
// Context opens until it closes, acts on those the package must (a QP's
// error, a CQ's overrun) and queues them for WaitAsyncEvent.
func (c *Context) readAsync() {
	defer close(c.asyncDone)
	for {
		ev, err := c.readAsyncEvent()
		if err != nil {
			c.asyncMu.Lock()
			c.asyncErr = err
			c.asyncMu.Unlock()
			return
		}
		c.actOn(ev)
		c.asyncMu.Lock()
		if len(c.asyncQ) == asyncQueueMax {
			c.asyncQ = append(c.asyncQ[:0], c.asyncQ[1:]...)
			c.asyncDropped++
		}
		c.asyncQ = append(c.asyncQ, ev)
		c.asyncMu.Unlock()
		select {
		case c.asyncWake <- struct{}{}:
		default:
		}
	}
}

// readAsyncEvent waits for and acknowledges the device's next event.
func (c *Context) readAsyncEvent() (AsyncEvent, error) {
	if err := c.n.use("Context.WaitAsyncEvent"); err != nil {
		return AsyncEvent{Type: EventNone}, err
	}
	defer c.n.unuse()
	var raw C.struct_shim_async
	err := c.async.wait(context.Background(), func() error {
		rc := C.shim_get_async_event(c.c, &raw)
		if rc == C.EAGAIN {
			return errAgain
		}
		if rc != 0 {
			return opErr("ibv_get_async_event", int(rc))
		}
		return nil
	})
	if err != nil {
		if err == ErrClosed {
			return AsyncEvent{Type: EventNone}, closedErr(c.n.kind)
		}
		return AsyncEvent{Type: EventNone}, err
	}
	ev := AsyncEvent{Type: EventType(raw._type), Port: int(raw.port), QPN: uint32(raw.qp_num)}
	key := uintptr(raw.obj)
	c.regMu.Lock()
	switch ev.Type {
	case EventQPFatal, EventQPReqErr, EventQPAccessErr, EventCommEst, EventSQDrained,
		EventPathMig, EventPathMigErr, EventQPLastWQEReached:
		ev.QP = c.qps[key]
	case EventCQErr:
		ev.CQ = c.cqs[key]
	case EventSRQErr, EventSRQLimitReached:
		ev.SRQ = c.srqs[key]
	}
	c.regMu.Unlock()
	return ev, nil
}

// actOn does what the package does on an event: a QP's fatal error is
// its error state; a CQ's overrun fails the CQ's later polls and moves the
// QPs using it to the error state, so that their peers see it too.
func (c *Context) actOn(ev AsyncEvent) {
	switch {
	case ev.QP != nil && (ev.Type == EventQPFatal || ev.Type == EventQPReqErr || ev.Type == EventQPAccessErr):
		ev.QP.state.Store(int32(QPStateError))
	case ev.CQ != nil && ev.Type == EventCQErr:
		ev.CQ.overrun.Store(true)
		var qps []*QP
		c.regMu.Lock()
		for _, qp := range c.qps {
			if qp.scq == ev.CQ || qp.rcq == ev.CQ {
				qps = append(qps, qp)
			}
		}
		c.regMu.Unlock()
		for _, qp := range qps {
			_ = qp.ToError() // a QP closing meanwhile: nothing to do
		}
		ev.CQ.signal()
	}
}

// WaitAsyncEvent returns the device's next asynchronous event (port up or
// down, QP fatal, CQ overrun, SRQ limit reached, device fatal, ...),
// parking the goroutine until one arrives. The package reads and
// acknowledges the events itself from the moment the Context opens (it
// acts on some: see CQ and ErrCQOverrun) and keeps the last 256 not yet
// returned here, oldest first (AsyncEventsDropped counts those it had to
// drop). Errors: ctx's error (at once when ctx is already done), ErrClosed
// when the context is closed (before or during the wait), or the errno of
// ibv_get_async_event; the event is then of Type EventNone. Only one
// goroutine should wait at a time.
func (c *Context) WaitAsyncEvent(ctx context.Context) (AsyncEvent, error) {
	none := AsyncEvent{Type: EventNone}
	if err := ctx.Err(); err != nil {
		return none, err
	}
	for {
		c.asyncMu.Lock()
		if len(c.asyncQ) > 0 {
			ev := c.asyncQ[0]
			c.asyncQ = append(c.asyncQ[:0], c.asyncQ[1:]...)
			c.asyncMu.Unlock()
			return ev, nil
		}
		c.asyncMu.Unlock()
		select {
		case <-c.asyncWake:
		case <-c.asyncDone:
			c.asyncMu.Lock()
			left, err := len(c.asyncQ), c.asyncErr
			c.asyncMu.Unlock()
			if left == 0 {
				return none, fmt.Errorf("verbs: wait for async event: %w", err)
			}
		case <-ctx.Done():
			return none, ctx.Err()
		}
	}
}

// AsyncEventsDropped returns how many events WaitAsyncEvent never returned
// because more than 256 were waiting.
func (c *Context) AsyncEventsDropped() uint64 {
	c.asyncMu.Lock()
	defer c.asyncMu.Unlock()
	return c.asyncDropped
}
