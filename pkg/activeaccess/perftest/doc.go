// Package perftest lets unmodified perftest programs (ib_write_bw,
// ib_read_bw) be sources of an Active Access target: it answers
// perftest's TCP side channel as a perftest server would, and connects
// each of the client's queue pairs to a plain queue pair of the target
// (activeaccess.Target.ConnectPlain). The client's RDMA WRITEs and READs
// then land in the target's memory, where the kernel module makes them
// active: they are logged, the domains' handlers see them, and W=0, R=0
// and a full log apply to them as to any source. This is the
// transparent mode (activeaccess.ModeTransparent) with a source that
// knows nothing of Active Access.
//
// Run the client against the target's address as against a perftest
// server:
//
//	ib_write_bw -d rxe0 -x 1 -s 4096 -n 1000 <target address>
//
// What is supported, and what the client must not ask for:
//   - the bandwidth tests of RDMA WRITE and READ over RC, one or more
//     queue pairs (-q, at most MaxQPs), any message size that fits the
//     target's memory from Options.Offset (perftest cycles through its
//     page size, 4 KiB on x86-64, for smaller sizes);
//   - the default TCP side channel (not -R, rdma_cm), on RoCE (a GID is
//     exchanged; the client picks it itself or takes -x);
//   - no bidirectional test (-b): the server issues no traffic, so the
//     client measures only its own direction; no latency tests (they need
//     the server to answer each message); no SEND tests (the target posts
//     no receives) and no atomics (the module refuses atomics on logging
//     pages).
//
// The side channel is a sequence of fixed-size messages, each answered
// before the next is sent (the client writes first). The server answers
// the client's queue-pair descriptions with the target's (its QPN, a PSN,
// the target memory's rkey and address, its GID), the MTU with the lower
// of the two, and echoes everything else (version, buffer and cache-line
// sizes, the final reports), so that the client takes the server to be
// configured as itself; after the reports it sends "done" as a perftest
// server does. A plain source has no credits: see
// activeaccess.Target.ConnectPlain for what that means for a target that
// also has Sources of that package. The message layout is perftest 4.5's (version string
// "6.06", Debian 12's perftest package), which the lab checks.
package perftest
