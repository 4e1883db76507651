package dht

import "errors"

// Sentinel errors; every error of this package wraps one of these, an
// error of pkg/activeaccess or pkg/verbs, or a context error (test with
// errors.Is), except Volume.Contents' description of a damaged volume.
var (
	// ErrInvalid: a bad argument (key 0, a bad layout or address).
	ErrInvalid = errors.New("dht: invalid argument")
	// ErrFull: the overflow heap had no free cell for an insert that
	// collided; the element was not stored. Tables report it from
	// Insert (RMA) or from the Flush that covers the insert (AA, AM).
	ErrFull = errors.New("dht: overflow heap full")
	// ErrRejected: the target refused an insert or delete it could not
	// parse (a put of the wrong size or at a place that is no cell, a
	// key that does not hash to the bucket it was put to).
	ErrRejected = errors.New("dht: target rejected a malformed request")
	// ErrDisconnected: the connection to the target ended (it closed or
	// died); every later call fails with it too.
	ErrDisconnected = errors.New("dht: disconnected from the target")
	// ErrProtocol: the peer is not a DHT target of this package.
	ErrProtocol = errors.New("dht: protocol error")
	// ErrClosed: the table or target was closed. A table's calls after
	// Close return an error that wraps it and names the call ("dht:
	// insert: dht: closed").
	ErrClosed = errors.New("dht: closed")
)
