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
	case e.QPN != 0 || e.QP != nil:
		return fmt.Sprintf("%v on QP %d", e.Type, e.QPN)
	case e.Port != 0:
		return fmt.Sprintf("%v on port %d", e.Type, e.Port)
	}
	return e.Type.String()
}

// WaitAsyncEvent returns the device's next asynchronous event (port up or
// down, QP fatal, SRQ limit reached, device fatal, ...), parking the
// goroutine in the netpoller until one arrives. The event is acknowledged
// before it is returned. Errors: ErrClosed when the context is closed
// (before or during the wait), ctx's error, or the errno of
// ibv_get_async_event. Only one goroutine should wait at a time.
func (c *Context) WaitAsyncEvent(ctx context.Context) (AsyncEvent, error) {
	if err := c.n.use(); err != nil {
		return AsyncEvent{}, err
	}
	defer c.n.unuse()
	var raw C.struct_shim_async
	err := c.async.wait(ctx, func() error {
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
			return AsyncEvent{}, closedErr(c.n.kind)
		}
		return AsyncEvent{}, err
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
	if ev.QP != nil && (ev.Type == EventQPFatal || ev.Type == EventQPReqErr || ev.Type == EventQPAccessErr) {
		ev.QP.state.Store(int32(QPStateError))
	}
	return ev, nil
}
