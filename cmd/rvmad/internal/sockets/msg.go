package sockets

import (
	"errors"
	"fmt"
	"io"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// errMessage is a message that is not one the broker speaks.
var errMessage = errors.New("malformed message")

// messageMax is the longest message: a ROUTE and the record it routes.
const messageMax = sockwire.RouteSize + sockwire.RecordMax

// message is what the broker reads and writes, on its Unix socket (one
// SOCK_SEQPACKET message each) and on the pairing port (back to back):
// REGISTER, UNREGISTER or RESULT alone, or a ROUTE (route set) followed
// by an ATTACH_REQ, ATTACH_REP, ATTACH_NACK or DEMOTE of the same epoch;
// on the pairing port, also a ROUTE followed by a RESULT about a DEMOTE
// (the peer's broker found no owner for it).
type message struct {
	route *sockwire.Route
	rec   sockwire.Record
}

// routed reports whether records of type t travel behind a ROUTE.
func routed(t sockwire.Type) bool {
	switch t {
	case sockwire.TypeAttachReq, sockwire.TypeAttachRep, sockwire.TypeAttachNack,
		sockwire.TypeDemote:
		return true
	}
	return false
}

// tuple is the connection the message is about.
func (m message) tuple() sockwire.Tuple {
	if m.route != nil {
		return m.route.Tuple
	}
	switch r := m.rec.(type) {
	case sockwire.Register:
		return r.Tuple
	case sockwire.Unregister:
		return r.Tuple
	case sockwire.Result:
		return r.Tuple
	}
	return sockwire.Tuple{}
}

// check enforces the pairing of a ROUTE and its record: the same epoch,
// and for records that carry a tuple, the same tuple (both are the
// sending host's view). standalone lists the types allowed alone.
func (m message) check(standalone ...sockwire.Type) error {
	return m.checkRouted(false, standalone...)
}

// checkPeer is check for a message of the peer's broker, which may also
// be a ROUTE and a RESULT about a DEMOTE, and nothing alone.
func (m message) checkPeer() error { return m.checkRouted(true) }

func (m message) checkRouted(peer bool, standalone ...sockwire.Type) error {
	t := m.rec.Type()
	if res, ok := m.rec.(sockwire.Result); ok && peer && m.route != nil {
		if res.Request != sockwire.TypeDemote || res.Reason == 0 {
			return fmt.Errorf("%w: a routed RESULT about %v, reason %v", errMessage, res.Request, res.Reason)
		}
		if m.route.Epoch != res.Epoch || m.route.Tuple != res.Tuple {
			return fmt.Errorf("%w: a routed RESULT of another epoch or connection than its ROUTE", errMessage)
		}
		return nil
	}
	if m.route == nil {
		for _, s := range standalone {
			if t == s {
				return nil
			}
		}
		return fmt.Errorf("%w: %v without a ROUTE", errMessage, t)
	}
	if !routed(t) {
		return fmt.Errorf("%w: %v behind a ROUTE", errMessage, t)
	}
	if m.route.Epoch != m.rec.RecordEpoch() {
		return fmt.Errorf("%w: ROUTE of epoch %d before %v of epoch %d", errMessage, m.route.Epoch, t, m.rec.RecordEpoch())
	}
	var inner *sockwire.Tuple
	switch r := m.rec.(type) {
	case sockwire.Attach:
		inner = &r.Tuple
	}
	if inner != nil && *inner != m.route.Tuple {
		return fmt.Errorf("%w: %v names another connection than its ROUTE", errMessage, t)
	}
	return nil
}

// parseMessage decodes one message of b, which it must fill.
func parseMessage(b []byte) (message, error) {
	h, err := sockwire.PeekHeader(b)
	if err != nil {
		return message{}, err
	}
	if h.Type != sockwire.TypeRoute {
		rec, err := sockwire.Decode(b)
		return message{rec: rec}, err
	}
	if len(b) < h.Length {
		return message{}, fmt.Errorf("%w: a ROUTE alone", errMessage)
	}
	r, err := sockwire.Decode(b[:h.Length])
	if err != nil {
		return message{}, err
	}
	if len(b) == h.Length {
		return message{}, fmt.Errorf("%w: a ROUTE alone", errMessage)
	}
	rec, err := sockwire.Decode(b[h.Length:])
	if err != nil {
		return message{}, err
	}
	route := r.(sockwire.Route)
	return message{route: &route, rec: rec}, nil
}

// readRecord reads one record from a stream into buf (at least
// RecordMax bytes) and returns its bytes.
func readRecord(r io.Reader, buf []byte) ([]byte, error) {
	if _, err := io.ReadFull(r, buf[:sockwire.HeaderSize]); err != nil {
		return nil, err
	}
	h, err := sockwire.PeekHeader(buf[:sockwire.HeaderSize])
	if err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(r, buf[sockwire.HeaderSize:h.Length]); err != nil {
		return nil, noEOF(err)
	}
	return buf[:h.Length], nil
}

// readMessage reads one message from a stream (the pairing port).
func readMessage(r io.Reader, buf []byte) (message, error) {
	b, err := readRecord(r, buf)
	if err != nil {
		return message{}, err
	}
	rec, err := sockwire.Decode(b)
	if err != nil {
		return message{}, err
	}
	route, ok := rec.(sockwire.Route)
	if !ok {
		return message{rec: rec}, nil
	}
	b, err = readRecord(r, buf)
	if err != nil {
		return message{}, noEOF(err)
	}
	if rec, err = sockwire.Decode(b); err != nil {
		return message{}, err
	}
	return message{route: &route, rec: rec}, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// encode appends the message's bytes to dst.
func (m message) encode(dst []byte) ([]byte, error) {
	var err error
	if m.route != nil {
		if dst, err = sockwire.Append(dst, *m.route); err != nil {
			return dst, err
		}
	}
	return sockwire.Append(dst, m.rec)
}

// routedMsg is the message ROUTE{t} then rec.
func routedMsg(t sockwire.Tuple, rec sockwire.Record) message {
	return message{route: &sockwire.Route{Epoch: rec.RecordEpoch(), Tuple: t}, rec: rec}
}
