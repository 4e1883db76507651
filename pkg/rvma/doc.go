// Package rvma implements Remote Virtual Memory Access (Grant et al., IPDPS
// 2021) on real one-sided RDMA verbs: a sender puts bytes to (endpoint,
// 64-bit mailbox address, offset) and the receiver alone posts, rotates and
// retires the buffers behind the mailbox. Completion is counted in bytes or
// operations, independently of arrival order, and published through a
// per-buffer completion pointer that the application can poll or wait on.
//
// The design, the wire protocol and the reasons for them are in
// docs/rvma.md. This package currently holds the pure-logic core the
// verbs-backed endpoint is built on:
//
//   - the window/epoch state machine (windowState): thresholds in bytes or
//     operations, the queue of posted buffers, in-order hand-over of
//     epochs whose counts may complete out of order, IncEpoch with the true
//     partial length, the rewind ring of completed records, one-time
//     buffers, Close with NACK or silent drop;
//   - completion records and their non-torn publication (Completion,
//     Record);
//   - the wire formats: the 32-bit immediate (Imm), the descriptor table
//     entry (Entry), the eager header and the control messages, with
//     parsers that reject malformed input;
//   - the sender's view of a remote window (senderView), which chooses the
//     epoch a put targets without a round trip;
//   - the mailbox address table (mailboxTable).
//
// Every error this package returns wraps one of the sentinel errors
// (ErrClosed, ErrNoBuffer, ErrTooLarge, ErrStale, ...); test with errors.Is.
package rvma
