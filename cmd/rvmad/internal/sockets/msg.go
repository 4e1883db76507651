package sockets

import (
	"errors"
	"fmt"
	"io"

	"github.com/rdmaplus/rdmaplus/pkg/sockets/sockproto"
)

// errMessage is a message that is not one the broker speaks.
var errMessage = errors.New("malformed message")

// message is what the broker reads and writes, on its Unix socket (one
// SOCK_SEQPACKET message each) and on the pairing port (back to back):
// REGISTER, UNREGISTER or RESULT alone, or a ROUTE (route set) followed
// by an ATTACH_REQ, ATTACH_REP, ATTACH_NACK, DEMOTE or REATTACH of the
// same epoch.
type message struct {
	route *sockproto.Route
	rec   sockproto.Record
}

// routed reports whether records of type t travel behind a ROUTE.
func routed(t sockproto.Type) bool {
	switch t {
	case sockproto.TypeAttachReq, sockproto.TypeAttachRep, sockproto.TypeAttachNack,
		sockproto.TypeDemote, sockproto.TypeReattach:
		return true
	}
	return false
}

// tuple is the connection the message is about.
func (m message) tuple() sockproto.Tuple {
	if m.route != nil {
		return m.route.Tuple
	}
	switch r := m.rec.(type) {
	case sockproto.Register:
		return r.Tuple
	case sockproto.Unregister:
		return r.Tuple
	case sockproto.Result:
		return r.Tuple
	}
	return sockproto.Tuple{}
}

// check enforces the pairing of a ROUTE and its record: the same epoch,
// and for records that carry a tuple, the same tuple (both are the
// sending host's view). standalone lists the types allowed alone.
func (m message) check(standalone ...sockproto.Type) error {
	t := m.rec.Type()
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
	var inner *sockproto.Tuple
	switch r := m.rec.(type) {
	case sockproto.Attach:
		inner = &r.Tuple
	case sockproto.Reattach:
		inner = &r.Tuple
	}
	if inner != nil && *inner != m.route.Tuple {
		return fmt.Errorf("%w: %v names another connection than its ROUTE", errMessage, t)
	}
	return nil
}

// parseMessage decodes one message of b, which it must fill.
func parseMessage(b []byte) (message, error) {
	h, err := sockproto.PeekHeader(b)
	if err != nil {
		return message{}, err
	}
	if h.Type != sockproto.TypeRoute {
		rec, err := sockproto.Decode(b)
		return message{rec: rec}, err
	}
	if len(b) < h.Length {
		return message{}, fmt.Errorf("%w: a ROUTE alone", errMessage)
	}
	r, err := sockproto.Decode(b[:h.Length])
	if err != nil {
		return message{}, err
	}
	if len(b) == h.Length {
		return message{}, fmt.Errorf("%w: a ROUTE alone", errMessage)
	}
	rec, err := sockproto.Decode(b[h.Length:])
	if err != nil {
		return message{}, err
	}
	route := r.(sockproto.Route)
	return message{route: &route, rec: rec}, nil
}

// readRecord reads one record from a stream into buf (at least
// RecordMax bytes) and returns its bytes.
func readRecord(r io.Reader, buf []byte) ([]byte, error) {
	if _, err := io.ReadFull(r, buf[:sockproto.HeaderSize]); err != nil {
		return nil, err
	}
	h, err := sockproto.PeekHeader(buf[:sockproto.HeaderSize])
	if err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(r, buf[sockproto.HeaderSize:h.Length]); err != nil {
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
	rec, err := sockproto.Decode(b)
	if err != nil {
		return message{}, err
	}
	route, ok := rec.(sockproto.Route)
	if !ok {
		return message{rec: rec}, nil
	}
	b, err = readRecord(r, buf)
	if err != nil {
		return message{}, noEOF(err)
	}
	if rec, err = sockproto.Decode(b); err != nil {
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
		if dst, err = sockproto.Append(dst, *m.route); err != nil {
			return dst, err
		}
	}
	return sockproto.Append(dst, m.rec)
}

// routedMsg is the message ROUTE{t} then rec.
func routedMsg(t sockproto.Tuple, rec sockproto.Record) message {
	return message{route: &sockproto.Route{Epoch: rec.RecordEpoch(), Tuple: t}, rec: rec}
}
