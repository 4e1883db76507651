// Package sockproto lets programs outside pkg/sockets speak the wire
// protocol of sockets over RDMA: it re-exports, as aliases, what rvmad's
// broker (cmd/rvmad/internal/sockets) needs of pkg/sockets/internal/wire,
// the Go mirror of cmd/sockpreload/sockproto.h. Everything is defined and
// documented there; nothing is added here.
package sockproto

import "github.com/rdmaplus/rdmaplus/pkg/sockets/internal/wire"

// Records, their parts, and their errors.
type (
	Record     = wire.Record
	Header     = wire.Header
	Type       = wire.Type
	Reason     = wire.Reason
	Tuple      = wire.Tuple
	Endpoint   = wire.Endpoint
	Attach     = wire.Attach
	Nack       = wire.Nack
	Demote     = wire.Demote
	Reattach   = wire.Reattach
	Route      = wire.Route
	Register   = wire.Register
	Unregister = wire.Unregister
	Result     = wire.Result
	Error      = wire.Error
)

// Constants.
const (
	HeaderSize = wire.HeaderSize
	RouteSize  = wire.RouteSize
	RecordMax  = wire.RecordMax
	AFInet     = wire.AFInet
	AFInet6    = wire.AFInet6
	MessageMax = wire.RouteSize + wire.RecordMax // a ROUTE and the record it routes
	ReasonMax  = wire.ReasonMax
	TypeMax    = wire.TypeMax
)

// Record types.
const (
	TypeAttachReq  = wire.TypeAttachReq
	TypeAttachRep  = wire.TypeAttachRep
	TypeAttachNack = wire.TypeAttachNack
	TypeSwitch     = wire.TypeSwitch
	TypeFin        = wire.TypeFin
	TypeAbort      = wire.TypeAbort
	TypeDemote     = wire.TypeDemote
	TypeReattach   = wire.TypeReattach
	TypeRoute      = wire.TypeRoute
	TypeRegister   = wire.TypeRegister
	TypeUnregister = wire.TypeUnregister
	TypeResult     = wire.TypeResult
)

// Reasons.
const (
	ReasonVersion  = wire.ReasonVersion
	ReasonNoOwner  = wire.ReasonNoOwner
	ReasonNoDaemon = wire.ReasonNoDaemon
	ReasonDenied   = wire.ReasonDenied
	ReasonQPError  = wire.ReasonQPError
	ReasonApp      = wire.ReasonApp
	ReasonPeer     = wire.ReasonPeer
	ReasonProtocol = wire.ReasonProtocol
	ReasonLimit    = wire.ReasonLimit
)

// Decode is wire.Decode: exactly one record, which must fill b.
func Decode(b []byte) (Record, error) { return wire.Decode(b) }

// PeekHeader is wire.PeekHeader: the header of the record b starts with.
func PeekHeader(b []byte) (Header, error) { return wire.PeekHeader(b) }

// Append is wire.Append: the encoding of r appended to dst.
func Append(dst []byte, r Record) ([]byte, error) { return wire.Append(dst, r) }
