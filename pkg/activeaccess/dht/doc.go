// Package dht is the distributed hash table of the Active Access paper
// (Besta and Hoefler, ICS'15, section 4.1), with the paper's two
// baselines, over the same table layout:
//
//   - the AA table (ServeAA, DialAA): a target's memory holds the volume
//     (a table of cells and an overflow heap, Layout); the cells' pages are
//     intercepted (W=0, WL, WLD), so an insert is one 8-byte active put
//     of the element into its bucket's cell, and the target's handler
//     inserts it locally, chaining a collision into the heap (Listing 3).
//     Lookups are plain RDMA READs of the cells; a delete is an active put
//     of the key to the delete page. It runs in both activeaccess modes
//     (transparent, through the rdmaplus kernel module, and
//     library-mediated) and with both handler drivers (Event, Poll).
//   - the RMA table (ServeRMA, DialRMA): the paper's Listing 2, remote
//     compare-and-swap and fetch-and-add; the target's CPU takes no part.
//   - the AM table (ServeAM, DialAM): each insert is a SEND that a handler
//     at the target applies, with batched receive processing and replies
//     only for flow control and flushes.
//
// All three give a source a Table (Insert, Delete, Lookup, Flush) and a
// target a Target whose Volume checks what was stored; Serve and Dial
// choose the design by its Kind. Keys and values are 32 bits (key 0 is
// no key); Workload makes reproducible insert sets with a chosen
// collision rate.
//
// The conventions are pkg/activeaccess's: options are a pointer to
// TargetOptions or SourceOptions, nil meaning the defaults, and what a
// call cannot do without (the layout, the address) is an argument of its
// own. Every call that blocks or talks to the peer takes a context: one
// that is already done makes the call return its error, wrapped, before
// it does anything; one that ends while the call waits makes it return
// its error; the package's own time limits are never reported as
// context.DeadlineExceeded. Close takes no context, and a second Close
// returns nil; after Close a table's calls fail with an error that wraps
// ErrClosed and names the call.
//
// # What can go wrong
//
//   - A full overflow heap: the insert is not stored. RMA's Insert returns
//     ErrFull; AA and AM learn it from the target (a handler reply or a
//     status) and their next Flush returns ErrFull with the count.
//   - Malformed requests (a put of the wrong size or to a place that is
//     no bucket, a key that does not hash to the bucket it was put to)
//     are rejected by the handler, stored nowhere, and reported by Flush
//     as ErrRejected.
//   - The target closes or dies: every call fails with ErrDisconnected
//     (the kernel's disconnect request breaks the connection at once).
//   - Deleted cells become tombstones and are never reused (the heap is a
//     bump allocator, as in the paper), so a volume fills up under
//     inserts and deletes alike. Keys are not deduplicated: inserting a
//     key twice stores it twice.
//   - The table is loosely consistent, as in the paper: a lookup sees an
//     insert once the Flush that covers it returned (RMA: once Insert
//     returned).
package dht
