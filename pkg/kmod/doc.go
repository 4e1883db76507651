// Package kmod is the userspace side of the rdmaplus kernel module's Active
// Access interface (/dev/rdmaplus, kmod/include/uapi/rdmaplus.h): the
// emulated IOMMU for rxe described in docs/activeaccess.md.
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
// Closing a Device closes its Domains; closing a Domain disarms its pages.
// The kernel does the same when the process exits or is killed. Every
// Close is idempotent.
//
// Errors from the kernel are *Error values naming the operation and
// wrapping the errno; the sentinel errors below are what callers branch
// on (errors.Is).
package kmod
