package verbs

import (
	"errors"
	"sync"
)

// node implements the object tree shared by every verbs object: the
// parent/child rule, idempotent Close and use-after-Close detection.
//
// use() takes a read lock for the duration of a call into C and fails with
// ErrClosed once Close has started; Close closes the children (newest first),
// then destroys the C object under the write lock, so a verb never runs on a
// destroyed handle, and finally detaches from its parents. A second Close
// waits for the first to finish and returns nil.
type node struct {
	kind string

	mu     sync.RWMutex // R: using the C handle; W: destroying it
	closed bool         // under mu

	kidsMu  sync.Mutex
	closing bool // under kidsMu
	kids    []*node
	parents []*node
	done    chan struct{}
	destroy func() error
	// preclose, if set, runs after the children are closed and before the
	// write lock is taken: it wakes goroutines parked in a wait.
	preclose func()
}

func (n *node) init(kind string, destroy func() error) {
	n.kind = kind
	n.destroy = destroy
	n.done = make(chan struct{})
}

// use locks the node for a call into C; op names the call for the error.
// It returns an error wrapping ErrClosed when the object is closed;
// otherwise the caller must call n.unuse.
func (n *node) use(op string) error {
	n.mu.RLock()
	if n.closed {
		n.mu.RUnlock()
		return &closedError{op: op, kind: n.kind}
	}
	return nil
}

func (n *node) unuse() { n.mu.RUnlock() }

// attach makes n a child of every parent. It fails with ErrClosed when a
// parent is closing; the caller must then call n.close(), which destroys the
// C object and detaches n from the parents it did join.
func (n *node) attach(parents ...*node) error {
	for _, p := range parents {
		p.kidsMu.Lock()
		if p.closing {
			p.kidsMu.Unlock()
			return &closedError{op: "attach to " + p.kind, kind: p.kind}
		}
		p.kids = append(p.kids, n)
		p.kidsMu.Unlock()
		n.kidsMu.Lock()
		n.parents = append(n.parents, p)
		n.kidsMu.Unlock()
	}
	return nil
}

func (p *node) detach(kid *node) {
	p.kidsMu.Lock()
	for i, k := range p.kids {
		if k == kid {
			p.kids = append(p.kids[:i], p.kids[i+1:]...)
			break
		}
	}
	p.kidsMu.Unlock()
}

func (n *node) isClosed() bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.closed
}

// close runs the parent/child rule. It is safe to call any number of times
// from any goroutine.
func (n *node) close() error {
	n.kidsMu.Lock()
	if n.closing {
		n.kidsMu.Unlock()
		<-n.done
		return nil
	}
	n.closing = true
	kids := append([]*node(nil), n.kids...)
	parents := append([]*node(nil), n.parents...)
	n.kidsMu.Unlock()

	var errs []error
	for i := len(kids) - 1; i >= 0; i-- {
		if err := kids[i].close(); err != nil {
			errs = append(errs, err)
		}
	}
	if n.preclose != nil {
		n.preclose()
	}
	n.mu.Lock()
	n.closed = true
	if n.destroy != nil {
		if err := n.destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	n.mu.Unlock()
	for _, p := range parents {
		p.detach(n)
	}
	close(n.done)
	return errors.Join(errs...)
}

// children returns how many live children the node has (for tests).
func (n *node) children() int {
	n.kidsMu.Lock()
	defer n.kidsMu.Unlock()
	return len(n.kids)
}
