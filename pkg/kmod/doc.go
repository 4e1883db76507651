// Package kmod is the userspace side of the rdmaplus kernel module
// (/dev/rdmaplus, kmod/include/uapi/rdmaplus.h). It has two interfaces,
// both on the module's hooks in rxe's data path: Active Access, the
// emulated IOMMU for rxe described in docs/activeaccess.md, and the
// counted mailboxes of RVMA (docs/kmod.md).
//
// A Device is an open /dev/rdmaplus whose ABI version was checked. It
// creates Domains (the paper's IUIDs, at most 1024 per host). Each Domain
// owns an access log, a ring buffer the kernel fills and this package maps
// into the process; Domain.Arm associates 4 KiB pages of one of the
// process's own rxe memory regions (by lkey or rkey) with the domain and
// the control bits W, R, WL, WLD, RL and RLD. Remote RDMA WRITEs, READs and
// atomics that touch an armed page are then steered and logged by the
// kernel; Domain.Read returns the logged entries, never half of one, and
// Domain.Wait parks the goroutine on an eventfd registered with Go's
// netpoller until the kernel notifies (a count threshold or a timer).
//
// Device.Mailboxes sets up the counted mailboxes (once per Device): window
// slots and 64-byte completion records mapped into the process. A buffer
// posted into a window (a byte range of the process's own rxe memory
// region, a generation, a threshold of bytes or of WRITE messages, a
// record) is filled by remote RDMA WRITEs that the kernel places and
// counts itself; at the threshold it closes the buffer's gate (later
// writes fail at their senders with a remote access error), publishes the
// record in generation order, advances the window's Done counter and
// signals Mailboxes.Wait. The application polls the record (LoadRecord,
// or the memory at Record) as an RDMA program polls a last byte.
//
// Closing a Device closes its Domains and Mailboxes; closing a Domain
// disarms its pages, closing Mailboxes forgets their windows' buffers.
// The kernel does the same when the process exits or is killed. Every
// Close is idempotent.
//
// Errors from the kernel are *Error values naming the operation and
// wrapping the errno; the sentinel errors below are what callers branch
// on (errors.Is).
package kmod
