// Package checkpoint takes incremental checkpoints of an Active Access
// target's memory (Besta and Hoefler, ICS'15, section 4.3). Pages changed
// by remote writes are found in the access log: the range gets W|R|WL, so
// writes reach memory as usual and the module (or, in the mediated mode,
// the target's runtime) logs a metadata-only entry for each, which a
// handler turns into a dirty page. Pages the process changes itself are
// found through the kernel's soft-dirty bits (/proc/self/clear_refs and
// /proc/self/pagemap; the target's memory is a shared mapping so that the
// bits of its registered, pinned pages can be cleared). A checkpoint saves
// only the pages changed since the previous one; Restore rebuilds the
// memory from a full image and the incremental ones after it.
//
// A checkpoint is consistent when it is taken at a synchronisation point,
// as in the paper ("all the processes synchronize and process the access
// logs"): every source flushed its writes (activeaccess.Source.Flush; plain
// writes FlushPlain then Flush) and the process's own writers paused.
// Writes during Checkpoint are not lost in general (they make their page
// dirty for the next checkpoint), with two exceptions: a local store in
// the moment between reading the soft-dirty bits and clearing them, and,
// in the transparent mode, a remote write whose log entry is handled just
// before Checkpoint starts but whose data lands just after its page was
// copied (the module logs a packet before rxe copies it).
//
// Clearing soft-dirty bits is process-wide: it write-protects every page
// of the process, so each first store to a page after a checkpoint takes
// a minor fault. Trackers in one process cooperate (each clear first
// harvests every tracker's bits). Other users of /proc/self/clear_refs in
// the same process would make a Tracker miss local writes.
package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
)

// Page is the granularity of tracking and of the images: one IOMMU page.
const Page = 4096

// Sentinel errors. Every error of this package wraps one of these, an
// error of pkg/activeaccess (activeaccess.ErrRange, ErrClosed, ...), a
// context error, or the error of a file or writer (test with errors.Is).
var (
	// ErrNotSupported: the kernel does not track soft-dirty pages
	// (CONFIG_MEM_SOFT_DIRTY), or /proc is not usable.
	ErrNotSupported = errors.New("checkpoint: soft-dirty tracking not supported")
	// ErrCorrupt: an image is damaged, truncated or not an image.
	ErrCorrupt = errors.New("checkpoint: corrupt image")
	// ErrSequence: images given to Restore do not form one chain (the
	// first not full, one missing or repeated, another range).
	ErrSequence = errors.New("checkpoint: images out of sequence")
	// ErrInvalid: a bad argument (range, destination size).
	ErrInvalid = errors.New("checkpoint: invalid argument")
	// ErrClosed: the Tracker (or its target) was closed. Errors after
	// Close wrap it and name the call ("checkpoint: checkpoint:
	// checkpoint: closed").
	ErrClosed = errors.New("checkpoint: closed")
)

// Options tune New. A nil *Options, like the zero value, means an
// event-driven tracker with the domain defaults of
// activeaccess.DomainOptions. Values the domain refuses (a negative
// PollIdle) make New fail with activeaccess.ErrInvalid.
type Options struct {
	// Notify is how the handler learns of remote writes (activeaccess.Event
	// or activeaccess.Poll); PollIdle as in activeaccess.DomainOptions.
	Notify   activeaccess.Notification
	PollIdle time.Duration
}

// Tracker tracks the changed pages of a range of a target's memory and
// writes checkpoints of it. Its methods are safe for concurrent use;
// checkpoints are taken one at a time. Close it before its Target (the
// memory it copies is unmapped by Target.Close).
type Tracker struct {
	tg     *activeaccess.Target
	off    int
	region []byte // the range in the target's memory
	d      *activeaccess.Domain

	cmu  sync.Mutex // one Checkpoint at a time; seq
	seq  uint64
	done bool

	mu     sync.Mutex
	remote []bool // pages written remotely since the last checkpoint
	local  []bool // pages harvested from soft-dirty bits since then
}

// New tracks the pages [off, off+length) of tg's memory: it creates a
// domain whose handler records remotely written pages, associates the
// pages with W|R|WL (replacing what they had), and checks once per process
// that the kernel tracks soft-dirty pages. off and length must be
// multiples of Page. opts may be nil (see Options). New changes local
// state only, so it takes no context.
//
// Errors wrap ErrNotSupported (no soft-dirty tracking), ErrInvalid (a nil
// target, unaligned or empty pages), activeaccess.ErrRange (pages beyond
// the memory), ErrClosed and activeaccess.ErrClosed (tg was closed),
// activeaccess.ErrInvalid (an option out of range), or the module's
// error.
func New(tg *activeaccess.Target, off, length int, opts *Options) (*Tracker, error) {
	if tg == nil || off < 0 || length <= 0 || off%Page != 0 || length%Page != 0 {
		return nil, fmt.Errorf("%w: pages [%d, +%d) (whole %d-byte pages of a target)", ErrInvalid, off, length, Page)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	mem := tg.Memory()
	if mem == nil {
		return nil, fmt.Errorf("checkpoint: new: %w: %w", ErrClosed, activeaccess.ErrClosed)
	}
	if off+length > len(mem) {
		return nil, fmt.Errorf("checkpoint: %w: pages [%d, +%d) of %d bytes", activeaccess.ErrRange, off, length, len(mem))
	}
	t := &Tracker{tg: tg, off: off, region: mem[off : off+length], remote: make([]bool, length/Page), local: make([]bool, length/Page)}
	softDirty.mu.Lock()
	err := probeLocked()
	softDirty.mu.Unlock()
	if err != nil {
		return nil, err
	}
	d, err := tg.NewDomain(t.handle, &activeaccess.DomainOptions{Notify: o.Notify, PollIdle: o.PollIdle})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if err := d.Associate(off, length, activeaccess.W|activeaccess.R|activeaccess.WL); err != nil {
		d.Close()
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	t.d = d
	softDirty.mu.Lock()
	if softDirty.trackers == nil {
		softDirty.trackers = map[*Tracker]struct{}{}
	}
	softDirty.trackers[t] = struct{}{}
	softDirty.mu.Unlock()
	return t, nil
}

// handle marks the page of a remote write (or atomic) dirty.
func (t *Tracker) handle(a *activeaccess.Access) {
	if a.Kind == activeaccess.KindGet || a.Suppressed {
		return
	}
	i := (a.Offset - t.off) / Page
	if a.Offset < t.off || i >= len(t.remote) {
		return
	}
	t.mu.Lock()
	t.remote[i] = true
	t.mu.Unlock()
}

// Checkpoint writes an image of the range to w: the first one full, each
// later one with only the pages written (remotely or locally) since the
// previous checkpoint. Take it at a synchronisation point (see the package
// documentation). If writing fails, the pages stay marked changed and the
// next Checkpoint saves them again (with the same sequence number), so a
// failed checkpoint loses nothing; what was written to w is then an
// incomplete image, which Restore refuses.
//
// If ctx is already done, Checkpoint returns ctx's error, wrapped, and
// neither reads the soft-dirty bits nor writes; if ctx ends while it
// writes (it looks between pages), it stops and returns ctx's error, as
// for a failed write. Other errors wrap ErrClosed (after Close, or the
// target was closed: then also activeaccess.ErrClosed), or the /proc
// files' or w's error.
func (t *Tracker) Checkpoint(ctx context.Context, w io.Writer) (Info, error) {
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("checkpoint: checkpoint: %w", err)
	}
	t.cmu.Lock()
	defer t.cmu.Unlock()
	if t.done {
		return Info{}, fmt.Errorf("checkpoint: checkpoint: %w", ErrClosed)
	}
	if t.tg.Memory() == nil {
		return Info{}, fmt.Errorf("checkpoint: checkpoint: %w: the target was closed: %w", ErrClosed, activeaccess.ErrClosed)
	}
	full := t.seq == 0
	if err := harvestAndClear(); err != nil {
		return Info{}, fmt.Errorf("checkpoint: checkpoint: %w", err)
	}
	n := len(t.remote)
	t.mu.Lock()
	remote, local := t.remote, t.local
	t.remote, t.local = make([]bool, n), make([]bool, n)
	t.mu.Unlock()

	info := Info{Seq: t.seq + 1, Off: t.off, Length: len(t.region), Full: full}
	var idx []int
	for i := 0; i < n; i++ {
		if !full {
			if remote[i] {
				info.Remote++
			}
			if local[i] {
				info.Local++
			}
		}
		if full || remote[i] || local[i] {
			idx = append(idx, i)
		}
	}
	info.Pages = len(idx)
	nb, err := writeImage(ctx, w, info, t.region, idx)
	info.Bytes = nb
	if err != nil {
		t.mu.Lock() // give the pages back: the next checkpoint saves them
		for i := 0; i < n; i++ {
			t.remote[i] = t.remote[i] || remote[i]
			t.local[i] = t.local[i] || local[i]
		}
		t.mu.Unlock()
		return info, fmt.Errorf("checkpoint: checkpoint: %w", err)
	}
	t.seq++
	return info, nil
}

// Err returns the error that stopped the remote tracking (the domain's
// runtime failed: a corrupt log), or nil while it tracks and after a
// clean Close; after such an error later checkpoints may miss remote
// writes.
func (t *Tracker) Err() error {
	if err := t.d.Err(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// Close stops tracking (waiting for a running handler) and makes the
// pages plain memory. It returns the module's error freeing the domain's
// log, if any; a second Close returns nil.
func (t *Tracker) Close() error {
	t.cmu.Lock()
	defer t.cmu.Unlock()
	if t.done {
		return nil
	}
	t.done = true
	softDirty.mu.Lock()
	delete(softDirty.trackers, t)
	softDirty.mu.Unlock()
	if err := t.d.Close(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}
