// Package jbmt is the application's interface to JBMT, an RDMA service
// over memory that is never pinned for long (docs/jbmt.md): a process
// registers any range of its memory, of any size and whatever its
// RLIMIT_MEMLOCK, and hands the region's token to peers.
//
// What the kernel module does today: Register pins nothing and takes the
// same time at any size, and a region's token is revoked when the Region
// or the Service is closed; Dial makes (or finds) this host's connection
// to another host's service. The transfers over it (a peer's get and put,
// served by the module with pages pinned just in time under a host
// budget) are being built; until then a token names a region no peer can
// reach yet.
//
// Memory to register must stay mapped while it is registered: Alloc gives
// such memory outside the Go heap. Memory of the Go heap must not be
// registered (the collector may free it and reuse it for another object).
//
// Errors a caller must branch on wrap the sentinel errors below (errors.Is).
package jbmt
