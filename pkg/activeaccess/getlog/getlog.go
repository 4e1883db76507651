// Package getlog logs the data an Active Access target serves to remote
// readers, so that a reader that crashed can replay its gets (Besta and
// Hoefler, ICS'15, section 4.4). In plain RMA the target knows nothing of
// the gets it serves, so the reader has to send the data it fetched back
// to be logged; here the pages get R|RL|RLD (and W, so that writes go on
// as usual), the module (or, in the mediated mode, the target's runtime)
// copies every byte it serves into the access log, and the Logger's
// handler appends it to a file per reader. A reader that lost its state
// reconnects with the same name, asks the target for its log (Recover,
// over a TCP connection to the Logger's replay listener), and re-executes
// its work taking each get's bytes from the Replayer instead of the
// network: it gets the same bytes it read before, even if the target's
// memory has changed since.
//
// Readers are told apart by their activeaccess.SourceOptions.Name (the
// target's handlers see it as Peer.Name); two readers with one name share
// one log. Gets from RDMA peers the target did not accept are logged under
// the empty name.
//
// Persistence: entries are written to the log file (the file system's page
// cache) within FlushInterval of being handled and before any replay is
// served; the Logger does not fsync, so a crash of the target's host (not
// of the reader) can lose the last entries. An RDMA READ that the reader's
// NIC retransmits is served, and logged, again; the Replayer skips such
// repeats when they do not start the next get (see Replayer.Get).
package getlog

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/activeaccess"
)

// Page is the granularity of logged pages: one IOMMU page.
const Page = 4096

// FlushInterval is how long a handled entry may stay in the Logger's
// buffers before it is written to its file.
const FlushInterval = 10 * time.Millisecond

// Sentinel errors. Every error of this package wraps one of these, an
// error of pkg/activeaccess, a context error, or the error of the file
// system or the network (test with errors.Is).
var (
	// ErrCorrupt: a log file or a replay answer is damaged or foreign.
	ErrCorrupt = errors.New("getlog: corrupt log")
	// ErrDiverged: a replaying reader asked for a get its log does not
	// hold next (it does not repeat the gets it made before).
	ErrDiverged = errors.New("getlog: replay diverged from the log")
	// ErrClosed: the Logger was closed. Errors after Close wrap it and
	// name the call ("getlog: entries: getlog: closed").
	ErrClosed = errors.New("getlog: closed")
	// ErrInvalid: a bad argument (a nil target, no directory, unaligned
	// pages, a reader name over 255 bytes), or a request the Logger
	// refused.
	ErrInvalid = errors.New("getlog: invalid argument")
)

// Options tune New. A nil *Options, like the zero value, means an
// event-driven Logger with the domain defaults of
// activeaccess.DomainOptions. Values the domain refuses (negative ones,
// Adaptive without an Interval) make New fail with
// activeaccess.ErrInvalid.
type Options struct {
	// Notify and PollIdle as in activeaccess.DomainOptions.
	Notify   activeaccess.Notification
	PollIdle time.Duration
	// Threshold, Interval and Adaptive (Notify Event) batch the
	// handler's wake-ups as in activeaccess.DomainOptions, whose default
	// (adaptive, activeaccess.DefaultInterval) they keep when all zero.
	// Gets are served at once either way; what waits is their logging.
	Threshold int
	Interval  time.Duration
	Adaptive  bool
}

// Logger logs the gets served from a range of a target's pages. It is safe
// for concurrent use.
type Logger struct {
	dir string
	d   *activeaccess.Domain

	mu      sync.Mutex
	readers map[string]*readerLog
	err     error // the first write error; later entries are not logged
	closed  bool
	lns     map[net.Listener]struct{}
	conns   map[net.Conn]struct{}
	stop    chan struct{}
	wg      sync.WaitGroup
}

type readerLog struct {
	f *os.File
	w *bufio.Writer
	n uint64 // entries logged
}

// New logs the gets served from the pages [off, off+length) of tg's
// memory into the directory dir, which holds one log file per reader
// ("<hex of the name>.getlog") and is created if missing; logs found
// there are continued. It opens (and checks) those logs, creates a domain
// whose handler appends each served entry to its reader's log, and
// associates the pages with W|R|RL|RLD (replacing what they had). off and
// length must be multiples of Page. opts may be nil (see Options). New
// works on local state and files only, so it takes no context.
//
// Errors wrap ErrInvalid (a nil target, an empty dir, unaligned or empty
// pages), ErrCorrupt (a log in dir is damaged: move it away),
// activeaccess.ErrRange (pages beyond the memory), activeaccess.ErrClosed
// (tg was closed), activeaccess.ErrInvalid (an option out of range), the
// module's error, or the file system's.
func New(tg *activeaccess.Target, off, length int, dir string, opts *Options) (*Logger, error) {
	if tg == nil || dir == "" || off < 0 || length <= 0 || off%Page != 0 || length%Page != 0 {
		return nil, fmt.Errorf("%w: target %v, dir %q, pages [%d, +%d) (whole %d-byte pages)", ErrInvalid, tg != nil, dir, off, length, Page)
	}
	var cfg Options
	if opts != nil {
		cfg = *opts
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("getlog: %w", err)
	}
	l := &Logger{dir: dir, readers: map[string]*readerLog{}, lns: map[net.Listener]struct{}{},
		conns: map[net.Conn]struct{}{}, stop: make(chan struct{})}
	if err := l.openExisting(); err != nil {
		l.closeFiles()
		return nil, err
	}
	d, err := tg.NewDomain(l.handle, &activeaccess.DomainOptions{Notify: cfg.Notify, PollIdle: cfg.PollIdle, Threshold: cfg.Threshold, Interval: cfg.Interval, Adaptive: cfg.Adaptive})
	if err != nil {
		l.closeFiles()
		return nil, fmt.Errorf("getlog: %w", err)
	}
	if err := d.Associate(off, length, activeaccess.W|activeaccess.R|activeaccess.RL|activeaccess.RLD); err != nil {
		d.Close()
		l.closeFiles()
		return nil, fmt.Errorf("getlog: %w", err)
	}
	l.d = d
	l.wg.Add(1)
	go l.flusher()
	return l, nil
}

// fileName is the log file of reader name.
func fileName(name string) string { return hex.EncodeToString([]byte(name)) + ".getlog" }

// openExisting opens every log in the directory and counts its entries,
// refusing damaged ones.
func (l *Logger) openExisting() error {
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("getlog: %w", err)
	}
	for _, de := range ents {
		base, ok := strings.CutSuffix(de.Name(), ".getlog")
		if !ok || de.IsDir() {
			continue
		}
		name, err := hex.DecodeString(base)
		if err != nil {
			continue // not one of ours
		}
		rl, err := l.open(string(name))
		if err != nil {
			return err
		}
		l.readers[string(name)] = rl
	}
	return nil
}

// open opens (creating) reader name's log and counts its entries.
func (l *Logger) open(name string) (*readerLog, error) {
	p := filepath.Join(l.dir, fileName(name))
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("getlog: %w", err)
	}
	es, err := readRecords(f, 1, ^uint64(0))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("getlog: %s: %w", p, err)
	}
	return &readerLog{f: f, w: bufio.NewWriterSize(f, 64<<10), n: uint64(len(es))}, nil
}

// handle appends one served entry to its reader's log.
func (l *Logger) handle(a *activeaccess.Access) {
	if a.Kind != activeaccess.KindGet {
		return
	}
	name := ""
	if a.Source != nil {
		name = a.Source.Name
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || l.closed {
		return
	}
	rl := l.readers[name]
	if rl == nil {
		var err error
		if rl, err = l.open(name); err != nil {
			l.err = err
			return
		}
		l.readers[name] = rl
	}
	rl.n++
	if err := writeRecord(rl.w, Entry{Seq: rl.n, Offset: a.Offset, Data: a.Data}); err != nil {
		l.err = fmt.Errorf("getlog: writing %s: %w", rl.f.Name(), err)
	}
}

func (l *Logger) flusher() {
	defer l.wg.Done()
	tick := time.NewTicker(FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
			l.mu.Lock()
			l.flushLocked()
			l.mu.Unlock()
		}
	}
}

func (l *Logger) flushLocked() {
	for _, rl := range l.readers {
		if err := rl.w.Flush(); err != nil && l.err == nil {
			l.err = fmt.Errorf("getlog: writing %s: %w", rl.f.Name(), err)
		}
	}
}

// Entries returns reader name's logged entries from number from (1: all)
// on, as written so far (none, and no error, for a reader with no log).
// It reads the local file, so it takes no context. Errors wrap ErrCorrupt
// (the file was damaged), ErrClosed (after Close), or the file system's.
func (l *Logger) Entries(name string, from uint64) ([]Entry, error) {
	if from == 0 {
		from = 1
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, fmt.Errorf("getlog: entries: %w", ErrClosed)
	}
	l.flushLocked()
	rl := l.readers[name]
	var n uint64
	if rl != nil {
		n = rl.n
	}
	l.mu.Unlock()
	if rl == nil || from > n {
		return nil, nil
	}
	f, err := os.Open(filepath.Join(l.dir, fileName(name)))
	if err != nil {
		return nil, fmt.Errorf("getlog: %w", err)
	}
	defer f.Close()
	es, err := readRecords(f, 1, n)
	if err == nil && uint64(len(es)) != n {
		err = fmt.Errorf("%w: %s holds %d entries, %d were logged", ErrCorrupt, f.Name(), len(es), n)
	}
	if err != nil {
		return nil, fmt.Errorf("getlog: %w", err)
	}
	return es[from-1:], nil
}

// Count returns how many entries reader name has in its log. It cannot
// fail; after Close it keeps the last counts.
func (l *Logger) Count(name string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rl := l.readers[name]; rl != nil {
		return rl.n
	}
	return 0
}

// Clear empties reader name's log (once the reader no longer needs to
// replay it, for example after it checkpointed its state); the reader's
// next entry is number 1 again. Errors wrap ErrClosed (after Close) or the
// file system's.
func (l *Logger) Clear(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("getlog: clear: %w", ErrClosed)
	}
	rl := l.readers[name]
	if rl == nil {
		return nil
	}
	rl.w.Reset(rl.f)
	if err := rl.f.Truncate(0); err != nil {
		return fmt.Errorf("getlog: clear: %w", err)
	}
	rl.n = 0
	return nil
}

// Err returns the error that stopped the logging (a write to a log file
// failed, or the domain's runtime failed), or nil while it logs and after
// a clean Close. Gets served after such an error are not in the logs.
func (l *Logger) Err() error {
	l.mu.Lock()
	err := l.err
	l.mu.Unlock()
	if err != nil {
		return err
	}
	if err := l.d.Err(); err != nil {
		return fmt.Errorf("getlog: %w", err)
	}
	return nil
}

// Close stops logging (waiting for a running handler; the pages become
// plain memory), closes the replay listeners and connections (ServeReplay
// returns nil), writes what is buffered and closes the files. It returns
// the module's error freeing the domain's log or the first write error,
// if any; a second Close returns nil.
func (l *Logger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true // the handler logs nothing more
	l.mu.Unlock()
	derr := l.d.Close() // no handler runs after this
	l.mu.Lock()
	close(l.stop)
	for ln := range l.lns {
		ln.Close()
	}
	for c := range l.conns {
		c.Close()
	}
	l.flushLocked()
	err := l.err
	l.mu.Unlock()
	l.wg.Wait()
	l.closeFiles()
	if derr != nil {
		return fmt.Errorf("getlog: %w", derr)
	}
	return err
}

func (l *Logger) closeFiles() {
	for _, rl := range l.readers {
		rl.f.Close()
	}
}
