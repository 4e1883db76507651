package sockets

import (
	"errors"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// errLimit is a registration over the user's cap.
var errLimit = errors.New("the user's cap of registrations is reached")

// reg is one registered connection: the client (a process on rvmad's
// Unix socket) that owns it, the inode of its socket when it proved so,
// and the epoch of an ATTACH_REQ handed to it and not yet
// answered (0: none).
type reg struct {
	tuple   sockwire.Tuple // as the owner sees it
	owner   *client
	inode   uint64
	pending uint32
}

// table is the pairing table: which client owns which connection, with
// the count of registrations of each user. Not safe for concurrent use:
// the broker's mutex guards it.
type table struct {
	maxPerUID int
	byTuple   map[sockwire.Tuple]*reg
	byClient  map[*client]map[sockwire.Tuple]*reg
	perUID    map[uint32]int
}

func newTable(maxPerUID int) *table {
	return &table{maxPerUID: maxPerUID, byTuple: map[sockwire.Tuple]*reg{},
		byClient: map[*client]map[sockwire.Tuple]*reg{}, perUID: map[uint32]int{}}
}

// register records that c owns t (socket inode). A connection another
// client registered moves to c: the latest process to prove ownership
// (after fork, exec or fd passing) gets its records. Registering a
// connection c already has refreshes its inode. It fails with errLimit
// when c's user has maxPerUID registrations and this would add one.
func (tb *table) register(c *client, t sockwire.Tuple, inode uint64) error {
	if r := tb.byTuple[key(t)]; r != nil {
		if r.owner == c {
			if r.inode != inode {
				r.inode, r.pending = inode, 0
			}
			return nil
		}
		if r.owner.uid != c.uid && tb.perUID[c.uid] >= tb.maxPerUID {
			return errLimit
		}
		tb.remove(r)
	} else if tb.perUID[c.uid] >= tb.maxPerUID {
		return errLimit
	}
	r := &reg{tuple: t, owner: c, inode: inode}
	tb.byTuple[key(t)] = r
	if tb.byClient[c] == nil {
		tb.byClient[c] = map[sockwire.Tuple]*reg{}
	}
	tb.byClient[c][key(t)] = r
	tb.perUID[c.uid]++
	return nil
}

// lookup returns the registration of t, or nil.
func (tb *table) lookup(t sockwire.Tuple) *reg { return tb.byTuple[key(t)] }

// owned returns c's registration of t, or nil when t is not c's.
func (tb *table) owned(c *client, t sockwire.Tuple) *reg {
	if r := tb.byTuple[key(t)]; r != nil && r.owner == c {
		return r
	}
	return nil
}

// remove forgets r.
func (tb *table) remove(r *reg) {
	k := key(r.tuple)
	if tb.byTuple[k] != r {
		return
	}
	delete(tb.byTuple, k)
	if m := tb.byClient[r.owner]; m != nil {
		delete(m, k)
		if len(m) == 0 {
			delete(tb.byClient, r.owner)
		}
	}
	if tb.perUID[r.owner.uid]--; tb.perUID[r.owner.uid] <= 0 {
		delete(tb.perUID, r.owner.uid)
	}
}

// dropClient forgets every registration of c and returns them.
func (tb *table) dropClient(c *client) []*reg {
	var out []*reg
	for _, r := range tb.byClient[c] {
		out = append(out, r)
	}
	for _, r := range out {
		tb.remove(r)
	}
	return out
}

// len is the number of registrations.
func (tb *table) len() int { return len(tb.byTuple) }
