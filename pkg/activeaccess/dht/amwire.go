package dht

import "encoding/binary"

// The active-message table's messages. A request (source to target,
// one SEND of 16 bytes) carries an element to insert, a key to delete, or
// a flush token; a status (target to source, 32 bytes) says how many of
// the source's requests the target handled, how many inserts found the
// heap full or were malformed, and the last flush token it handled.
const (
	amInsert = 1
	amDelete = 2
	amFlush  = 3

	amReqLen    = 16
	amStatusLen = 32
)

type amReq struct {
	op    byte
	arg   uint64 // the element (insert) or key (delete)
	token uint32 // flush
}

func (r amReq) put(b []byte) {
	binary.LittleEndian.PutUint64(b, r.arg)
	b[8] = r.op
	b[9], b[10], b[11] = 0, 0, 0
	binary.LittleEndian.PutUint32(b[12:], r.token)
}

func parseReq(b []byte) (amReq, bool) {
	if len(b) != amReqLen || b[8] < amInsert || b[8] > amFlush {
		return amReq{}, false
	}
	return amReq{op: b[8], arg: binary.LittleEndian.Uint64(b), token: binary.LittleEndian.Uint32(b[12:])}, true
}

type amStatus struct {
	handled  uint64 // requests handled, cumulative
	full     uint32 // inserts that found the heap full, cumulative
	rejected uint32 // malformed requests, cumulative
	flushed  uint32 // the last flush token handled
}

func (s amStatus) put(b []byte) {
	binary.LittleEndian.PutUint64(b, s.handled)
	binary.LittleEndian.PutUint32(b[8:], s.full)
	binary.LittleEndian.PutUint32(b[12:], s.rejected)
	binary.LittleEndian.PutUint32(b[16:], s.flushed)
	clear(b[20:amStatusLen])
}

func parseStatus(b []byte) (amStatus, bool) {
	if len(b) != amStatusLen {
		return amStatus{}, false
	}
	return amStatus{binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint32(b[8:]),
		binary.LittleEndian.Uint32(b[12:]), binary.LittleEndian.Uint32(b[16:])}, true
}
