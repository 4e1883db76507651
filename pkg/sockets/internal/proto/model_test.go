package proto

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmaplus/rdmaplus/internal/sockwire"
)

// The model: two sides (side 0 the client, side 1 the server, or a plain
// TCP program without the shim) joined by an in-memory transport:
//   - the anchor, one reliable byte stream per direction with its FIN;
//   - one QP per attachment, a FIFO of messages per direction, that may
//     fail at any moment: what is in flight is lost, and each side learns
//     it (QPError) at a moment of its own, or never if it demoted first;
//   - rvmad, a reliable FIFO of records per direction.
// Each step is one event at one side: the program writes, reads or shuts
// down; a message arrives; the QP fails; a side demotes; the client
// attaches; a finished side is released. The checker explores the steps'
// interleavings and checks, after every step, that each program read a
// prefix of what the other wrote (nothing lost, duplicated or reordered),
// that end of file comes only after all of it, and that no side saw a
// protocol violation; at every state where no step is possible, that both
// programs read everything and saw end of file (no deadlock).

type scenario struct {
	name      string
	data      [2]int // bytes each side's program writes
	ring      int    // both sides' ring size
	batch     int    // credit batch
	sendBuf   int
	wchunk    int // bytes per program write
	rchunk    int // bytes per program read
	attaches  int // ATTACH_REQs the client may start
	demotes   [2]int
	qpFails   int
	plainPeer bool            // side 1 runs without the shim
	refuse    sockwire.Reason // side 1 refuses attachments
	release   bool            // finished sides may be released
	big       bool            // exhaustive only with PROTO_BIG=1
	light     bool            // exhaustive under the race detector too
}

type tcpStream struct {
	data []byte
	fin  bool
}

type world struct {
	sc       *scenario
	m        [2]*Machine
	tcp      [2]tcpStream // tcp[i]: from side i
	qp       [][2][]Msg   // qp[e-1][i]: from side i on attachment e
	qpDead   []bool
	broker   [2][]Msg
	qpErr    [2][]uint32 // QP errors side i has yet to notice
	wrote    [2]int
	shut     [2]bool
	read     [2]int
	eof      [2]bool
	released [2]bool
	demotes  [2]int
	qpFails  int
	attaches int
	// ringBytes counts the bytes that arrived by ring writes.
	ringBytes int
}

func script(side, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(1 + side*100 + i%97)
	}
	return b
}

func newWorld(sc *scenario) *world {
	w := &world{sc: sc}
	for i := range 2 {
		if i == 1 && sc.plainPeer {
			continue
		}
		cfg := Config{Role: Role(i), RingSize: sc.ring, CreditBatch: sc.batch, SendBuf: sc.sendBuf}
		if i == 1 {
			cfg.Refuse = sc.refuse
		}
		w.m[i] = New(cfg)
	}
	return w
}

func (w *world) clone() *world {
	c := *w
	for i := range 2 {
		if w.m[i] != nil {
			c.m[i] = w.m[i].Clone()
		}
		c.tcp[i].data = append([]byte(nil), w.tcp[i].data...)
		c.broker[i] = append([]Msg(nil), w.broker[i]...)
		c.qpErr[i] = append([]uint32(nil), w.qpErr[i]...)
	}
	c.qp = make([][2][]Msg, len(w.qp))
	for e := range w.qp {
		for i := range 2 {
			c.qp[e][i] = append([]Msg(nil), w.qp[e][i]...)
		}
	}
	c.qpDead = append([]bool(nil), w.qpDead...)
	return &c
}

// route carries side i's outputs into the transport.
func (w *world) route(i int) error {
	m := w.m[i]
	for _, o := range m.Outputs() {
		switch o.Via {
		case ViaTCP:
			if w.tcp[i].fin && (len(o.Data) > 0 || o.Shut) {
				return fmt.Errorf("side %d wrote to the anchor after shutting it", i)
			}
			w.tcp[i].data = append(w.tcp[i].data, o.Data...)
			w.tcp[i].fin = o.Shut
		case ViaQP:
			e := int(o.Msg.Epoch)
			if e < 1 || e > len(w.qp) {
				return fmt.Errorf("side %d posted %v on no QP", i, o.Msg)
			}
			if w.sc.plainPeer {
				return fmt.Errorf("side %d posted %v towards a plain peer", i, o.Msg)
			}
			if !w.qpDead[e-1] {
				w.qp[e-1][i] = append(w.qp[e-1][i], o.Msg)
			}
		case ViaBroker:
			if o.Msg.Kind == MsgAttachReq {
				for len(w.qp) < int(o.Msg.Epoch) {
					w.qp = append(w.qp, [2][]Msg{})
					w.qpDead = append(w.qpDead, false)
				}
			}
			w.broker[i] = append(w.broker[i], o.Msg)
		}
	}
	return m.Err()
}

// A step; apply returns false when it is not possible in this state.
type step struct {
	name  string
	apply func(w *world) (bool, error)
}

func (w *world) moves() []step {
	var s []step
	for i := range 2 {
		// What a released side sent is still delivered.
		if len(w.broker[i]) > 0 {
			s = append(s, step{fmt.Sprintf("broker%d>", i), func(w *world) (bool, error) { return w.brokerDeliver(i) }})
		}
		for e := range w.qp {
			if len(w.qp[e][i]) > 0 {
				s = append(s, step{fmt.Sprintf("qp%d/%d>", e+1, i), func(w *world) (bool, error) { return w.qpDeliver(e, i) }})
			}
		}
		if w.released[i] {
			continue
		}
		if !w.eof[i] {
			s = append(s, step{fmt.Sprintf("read%d", i), func(w *world) (bool, error) { return w.appRead(i, w.sc.rchunk) }})
		}
		if !w.shut[i] {
			s = append(s, step{fmt.Sprintf("write%d", i), func(w *world) (bool, error) { return w.appWrite(i, w.sc.wchunk) }},
				step{fmt.Sprintf("shut%d", i), func(w *world) (bool, error) { return w.appShut(i) }})
		}
		if len(w.qpErr[i]) > 0 {
			s = append(s, step{fmt.Sprintf("qperr%d", i), func(w *world) (bool, error) { return w.qpErrDeliver(i) }})
		}
		if w.m[i] != nil {
			if w.demotes[i] < w.sc.demotes[i] {
				s = append(s, step{fmt.Sprintf("demote%d", i), func(w *world) (bool, error) { return w.demote(i) }})
			}
			if w.sc.release && w.m[i].Done() {
				s = append(s, step{fmt.Sprintf("release%d", i), func(w *world) (bool, error) { return w.release(i) }})
			}
		}
	}
	if w.qpFails < w.sc.qpFails {
		for e := range w.qp {
			if !w.qpDead[e] {
				s = append(s, step{fmt.Sprintf("qpfail%d", e+1), func(w *world) (bool, error) { return w.qpFail(e) }})
			}
		}
	}
	if w.attaches < w.sc.attaches && w.m[0] != nil {
		s = append(s, step{"attach", func(w *world) (bool, error) { return w.attach() }})
	}
	return s
}

func (w *world) appWrite(i, chunk int) (bool, error) {
	want := script(i, w.sc.data[i])
	if w.shut[i] || w.wrote[i] == len(want) {
		return false, nil
	}
	p := want[w.wrote[i]:min(len(want), w.wrote[i]+chunk)]
	if w.m[i] == nil {
		w.tcp[i].data = append(w.tcp[i].data, p...)
		w.wrote[i] += len(p)
		return true, nil
	}
	n, err := w.m[i].Write(p)
	if err != nil {
		return false, err
	}
	w.wrote[i] += n
	return n > 0, w.route(i)
}

func (w *world) appShut(i int) (bool, error) {
	if w.shut[i] || w.wrote[i] != w.sc.data[i] {
		return false, nil
	}
	w.shut[i] = true
	if w.m[i] == nil {
		w.tcp[i].fin = true
		return true, nil
	}
	w.m[i].ShutdownWrite()
	return true, w.route(i)
}

func (w *world) appRead(i, chunk int) (bool, error) {
	if w.eof[i] {
		return false, nil
	}
	from := &w.tcp[1-i]
	tcp := func(n int) ([]byte, bool) {
		n = min(n, len(from.data))
		p := from.data[:n]
		from.data = from.data[n:]
		return p, len(from.data) == 0 && from.fin
	}
	var p []byte
	var eof bool
	if w.m[i] == nil {
		p, eof = tcp(chunk)
		if len(p) > 0 {
			eof = false
		}
	} else {
		var err error
		if p, eof, err = w.m[i].Read(chunk, tcp); err != nil {
			return false, err
		}
		if err := w.route(i); err != nil {
			return false, err
		}
	}
	want := script(1-i, w.sc.data[1-i])
	if len(p) > 0 {
		if w.read[i]+len(p) > len(want) || string(p) != string(want[w.read[i]:w.read[i]+len(p)]) {
			return false, fmt.Errorf("side %d read %v at %d, the peer wrote %v", i, p, w.read[i], want)
		}
		w.read[i] += len(p)
		return true, nil
	}
	if eof {
		if w.read[i] != len(want) || !w.shut[1-i] {
			return false, fmt.Errorf("side %d: end of file at %d of %d bytes (peer shut: %v)", i, w.read[i], len(want), w.shut[1-i])
		}
		w.eof[i] = true
		return true, nil
	}
	return false, nil
}

func (w *world) qpDeliver(e, i int) (bool, error) {
	q := w.qp[e][i]
	if len(q) == 0 {
		return false, nil
	}
	msg := q[0]
	w.qp[e][i] = q[1:]
	if w.released[1-i] {
		return true, nil
	}
	w.ringBytes += len(msg.Data)
	w.m[1-i].FromQP(msg)
	return true, w.route(1 - i)
}

func (w *world) brokerDeliver(i int) (bool, error) {
	q := w.broker[i]
	if len(q) == 0 {
		return false, nil
	}
	msg := q[0]
	w.broker[i] = q[1:]
	if w.m[1-i] == nil {
		// rvmad answers for a program without the shim.
		if msg.Kind == MsgAttachReq {
			w.broker[1-i] = append(w.broker[1-i], Msg{Kind: MsgAttachNack, Epoch: msg.Epoch, Reason: sockwire.ReasonNoOwner})
		}
		return true, nil
	}
	if w.released[1-i] {
		return true, nil
	}
	w.m[1-i].FromBroker(msg)
	return true, w.route(1 - i)
}

func (w *world) qpFail(e int) (bool, error) {
	if w.qpDead[e] || w.qpFails >= w.sc.qpFails {
		return false, nil
	}
	w.qpFails++
	w.kill(e)
	return true, nil
}

func (w *world) kill(e int) {
	w.qpDead[e] = true
	w.qp[e] = [2][]Msg{}
	for i := range 2 {
		if w.m[i] != nil && !w.released[i] {
			w.qpErr[i] = append(w.qpErr[i], uint32(e+1))
		}
	}
}

func (w *world) qpErrDeliver(i int) (bool, error) {
	if len(w.qpErr[i]) == 0 {
		return false, nil
	}
	e := w.qpErr[i][0]
	w.qpErr[i] = w.qpErr[i][1:]
	w.m[i].QPError(e)
	return true, w.route(i)
}

func (w *world) demote(i int) (bool, error) {
	if w.m[i] == nil || w.demotes[i] >= w.sc.demotes[i] || !w.m[i].Demote(sockwire.ReasonApp) {
		return false, nil
	}
	w.demotes[i]++
	return true, w.route(i)
}

func (w *world) attach() (bool, error) {
	if w.attaches >= w.sc.attaches || !w.m[0].Attach() {
		return false, nil
	}
	w.attaches++
	return true, w.route(0)
}

// release: the program closed a finished side once its QP operations
// completed; its QP goes, and the peer may notice.
func (w *world) release(i int) (bool, error) {
	if !w.sc.release || w.m[i] == nil || !w.m[i].Done() || w.released[i] || len(w.qpErr[i]) > 0 {
		// A side whose QP failed notices it before it goes.
		return false, nil
	}
	for e := range w.qp {
		if len(w.qp[e][i]) > 0 {
			return false, nil
		}
	}
	w.released[i] = true
	if e := int(w.m[i].Epoch()); e > 0 && !w.qpDead[e-1] {
		w.kill(e - 1)
	}
	return true, nil
}

func (w *world) done() error {
	for i := range 2 {
		if w.wrote[i] != w.sc.data[i] || !w.shut[i] || !w.eof[i] {
			return fmt.Errorf("deadlock: side %d wrote %d of %d (shut %v), read %d of %d (eof %v); %s",
				i, w.wrote[i], w.sc.data[i], w.shut[i], w.read[i], w.sc.data[1-i], w.eof[i], w.describe())
		}
		if m := w.m[i]; m != nil && !w.released[i] && !m.Done() {
			return fmt.Errorf("side %d never finished (anchor shut %v); %s", i, m.out.tcpShut, w.describe())
		}
	}
	return nil
}

func (w *world) describe() string {
	var b strings.Builder
	for i := range 2 {
		if m := w.m[i]; m != nil {
			om, im := m.Modes()
			fmt.Fprintf(&b, "side %d: %v epoch %d out %v %+v in %v consumed %d; ", i, m.Phase(), m.Epoch(), om,
				struct{ Sent, TCPEnd, RingEnd, Acked uint64 }{m.out.sent, m.out.tcpEnd, m.out.ringEnd, m.out.acked},
				im, m.in.consumed)
		}
		fmt.Fprintf(&b, "tcp %d: %d bytes fin %v; broker %v; ", i, len(w.tcp[i].data), w.tcp[i].fin, w.broker[i])
	}
	for e := range w.qp {
		fmt.Fprintf(&b, "qp %d dead %v %v %v; ", e+1, w.qpDead[e], w.qp[e][0], w.qp[e][1])
	}
	return b.String()
}

var seed = maphash.MakeSeed()

func (m *Machine) appendKey(b []byte) []byte {
	u := func(v uint64) { b = binary.AppendUvarint(b, v) }
	f := func(v bool) {
		if v {
			u(1)
		} else {
			u(0)
		}
	}
	u(uint64(m.phase))
	u(uint64(m.epoch))
	u(uint64(m.peerRing))
	f(m.peerReady)
	f(m.sentDem)
	f(m.gotDem)
	f(m.qpDead)
	u(uint64(m.attaches))
	o := &m.out
	u(uint64(o.mode))
	for _, v := range []uint64{o.sent, o.tcpEnd, o.switchOff, o.ringEnd, o.acked, o.keepBase, o.blocked} {
		u(v)
	}
	u(uint64(len(o.keep)))
	f(o.shut)
	f(o.finSent)
	f(o.tcpShut)
	f(o.switched)
	in := &m.in
	u(uint64(in.mode))
	for _, v := range []uint64{in.consumed, in.switchAt, in.ringStart, in.ringProd, in.fin, in.credited} {
		u(v)
	}
	u(uint64(len(in.ring)))
	f(in.finKnown)
	f(in.blocked)
	f(in.eof)
	if m.err != nil {
		u(1)
	}
	return b
}

func appendMsgs(b []byte, q []Msg) []byte {
	b = binary.AppendUvarint(b, uint64(len(q)))
	for _, m := range q {
		b = append(b, byte(m.Kind))
		b = binary.AppendUvarint(b, uint64(m.Epoch))
		b = binary.AppendUvarint(b, m.Off)
		b = binary.AppendUvarint(b, uint64(len(m.Data)))
	}
	return b
}

// key identifies a state; the bytes themselves follow from offsets
// (every program writes a fixed script), so lengths suffice.
func (w *world) key(buf []byte) uint64 {
	b := buf[:0]
	for i := range 2 {
		if w.m[i] != nil {
			b = w.m[i].appendKey(b)
		}
		b = binary.AppendUvarint(b, uint64(len(w.tcp[i].data)))
		b = append(b, 0xf0)
		if w.tcp[i].fin {
			b = append(b, 1)
		}
		b = appendMsgs(b, w.broker[i])
		b = binary.AppendUvarint(b, uint64(len(w.qpErr[i])))
		for _, e := range w.qpErr[i] {
			b = binary.AppendUvarint(b, uint64(e))
		}
		for _, v := range []int{w.wrote[i], w.read[i], w.demotes[i]} {
			b = binary.AppendUvarint(b, uint64(v))
		}
		for _, v := range []bool{w.shut[i], w.eof[i], w.released[i]} {
			if v {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
	}
	for e := range w.qp {
		b = appendMsgs(b, w.qp[e][0])
		b = appendMsgs(b, w.qp[e][1])
		if w.qpDead[e] {
			b = append(b, 1)
		}
	}
	b = binary.AppendUvarint(b, uint64(w.qpFails))
	b = binary.AppendUvarint(b, uint64(w.attaches))
	return maphash.Bytes(seed, b)
}

type explorer struct {
	sc       *scenario
	seen     map[uint64]struct{}
	maxDepth int
	cut      int // states not expanded at the depth bound
	ends     int // states where no step is possible
	buf      []byte
	path     []string
	err      error
}

func (x *explorer) dfs(w *world, depth int) {
	if x.err != nil {
		return
	}
	if depth >= x.maxDepth {
		x.cut++
		return
	}
	moved := false
	for _, s := range w.moves() {
		c := w.clone()
		ok, err := s.apply(c)
		if err != nil {
			x.err = fmt.Errorf("%v\n  after %s %s\n  %s", err, strings.Join(x.path, " "), s.name, c.describe())
			return
		}
		if !ok {
			continue
		}
		moved = true
		k := c.key(x.buf)
		if _, dup := x.seen[k]; dup {
			continue
		}
		x.seen[k] = struct{}{}
		x.path = append(x.path, s.name)
		x.dfs(c, depth+1)
		x.path = x.path[:len(x.path)-1]
		if x.err != nil {
			return
		}
	}
	if !moved {
		x.ends++
		if err := w.done(); err != nil {
			x.err = fmt.Errorf("%v\n  after %s", err, strings.Join(x.path, " "))
		}
	}
}

// The exhaustive configurations: small, every interleaving. Those marked
// big (about 3 million states, half a minute) run with PROTO_BIG=1.
var exhaustive = []scenario{
	{name: "upgrade, demote by either side, QP failure", data: [2]int{2, 2}, ring: 2, batch: 2, sendBuf: 2,
		wchunk: 2, rchunk: 2, attaches: 1, demotes: [2]int{1, 1}, qpFails: 1, release: true},
	{name: "single-byte writes and reads, credit per byte, blocked sender", data: [2]int{2, 1}, ring: 1, batch: 1,
		sendBuf: 2, wchunk: 1, rchunk: 1, attaches: 1, demotes: [2]int{1, 0}, qpFails: 1},
	{name: "attach twice: demote then upgrade again", data: [2]int{2, 1}, ring: 2, batch: 2, sendBuf: 2,
		wchunk: 2, rchunk: 2, attaches: 2, demotes: [2]int{1, 0}, qpFails: 0},
	{name: "attach twice across a QP failure", light: true, data: [2]int{2, 1}, ring: 1, batch: 1, sendBuf: 1,
		wchunk: 1, rchunk: 2, attaches: 2, demotes: [2]int{0, 0}, qpFails: 1, release: true},
	{name: "server refuses", light: true, data: [2]int{2, 2}, ring: 2, batch: 1, sendBuf: 2, wchunk: 1, rchunk: 1,
		attaches: 1, demotes: [2]int{1, 1}, refuse: sockwire.ReasonNoMemory},
	{name: "peer without the shim", light: true, data: [2]int{3, 3}, ring: 2, batch: 1, sendBuf: 2, wchunk: 1, rchunk: 2,
		attaches: 2, demotes: [2]int{1, 0}, plainPeer: true},
	{name: "big: upgrade, demotes, QP failure", big: true, data: [2]int{3, 2}, ring: 2, batch: 2, sendBuf: 2,
		wchunk: 2, rchunk: 2, attaches: 1, demotes: [2]int{1, 1}, qpFails: 1, release: true},
	{name: "big: single bytes, credit per byte", big: true, data: [2]int{3, 1}, ring: 2, batch: 1, sendBuf: 3,
		wchunk: 1, rchunk: 1, attaches: 1, demotes: [2]int{1, 0}, qpFails: 1},
	{name: "big: attach twice", big: true, data: [2]int{3, 1}, ring: 2, batch: 2, sendBuf: 2,
		wchunk: 2, rchunk: 2, attaches: 2, demotes: [2]int{1, 1}, qpFails: 0},
	{name: "big: attach twice across a QP failure", big: true, data: [2]int{2, 2}, ring: 1, batch: 1, sendBuf: 1,
		wchunk: 1, rchunk: 2, attaches: 2, demotes: [2]int{0, 0}, qpFails: 1, release: true},
}

func TestModelExhaustive(t *testing.T) {
	total := 0
	start := time.Now()
	big := os.Getenv("PROTO_BIG") != ""
	for i := range exhaustive {
		sc := &exhaustive[i]
		if sc.big && !big {
			continue
		}
		if raceEnabled && !big && !sc.light {
			// About five times slower: the race detector keeps the
			// light cases.
			continue
		}
		t0 := time.Now()
		x := &explorer{sc: sc, seen: map[uint64]struct{}{}, maxDepth: 400, buf: make([]byte, 0, 1024)}
		x.dfs(newWorld(sc), 0)
		if x.err != nil {
			t.Fatalf("%s: %v", sc.name, x.err)
		}
		if x.cut > 0 {
			t.Errorf("%s: %d states at the depth bound %d", sc.name, x.cut, x.maxDepth)
		}
		t.Logf("%s: %d states, %d final, %v", sc.name, len(x.seen), x.ends, time.Since(t0).Round(time.Millisecond))
		total += len(x.seen)
	}
	t.Logf("exhaustive: %d states in %v", total, time.Since(start).Round(time.Millisecond))
}

// Random runs over larger configurations: each step picked at random
// among the possible ones, writes and reads of random sizes. A failing
// run prints its seed; PROTO_SEED=n replays it alone.
func TestModelRandom(t *testing.T) {
	runs := 3000
	if raceEnabled {
		runs = 300
	}
	if s := os.Getenv("PROTO_RUNS"); s != "" {
		runs, _ = strconv.Atoi(s)
	}
	var seeds []uint64
	if s := os.Getenv("PROTO_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seeds = []uint64{v}
	} else {
		base := uint64(time.Now().UnixNano())
		for i := range runs {
			seeds = append(seeds, base+uint64(i))
		}
	}
	start := time.Now()
	stats := map[string]int{}
	steps := 0
	for _, sd := range seeds {
		n, outcome, err := randomRun(sd)
		if err != nil {
			t.Fatalf("seed %d (PROTO_SEED=%d go test -run TestModelRandom): %v", sd, sd, err)
		}
		stats[outcome]++
		steps += n
	}
	t.Logf("%d random runs, %d steps, %v; %v", len(seeds), steps, time.Since(start).Round(time.Millisecond), stats)
}

func randomRun(sd uint64) (int, string, error) {
	r := rand.New(rand.NewPCG(sd, sd^0x9e3779b97f4a7c15))
	ring := 1 << r.IntN(4)
	sc := &scenario{
		data:      [2]int{r.IntN(200), r.IntN(120)},
		ring:      ring,
		batch:     1 + r.IntN(ring),
		sendBuf:   ring + r.IntN(2*ring),
		attaches:  1 + r.IntN(3),
		demotes:   [2]int{r.IntN(3), r.IntN(3)},
		qpFails:   r.IntN(3),
		plainPeer: r.IntN(10) == 0,
		release:   r.IntN(2) == 0,
	}
	switch r.IntN(12) {
	case 0:
		sc.refuse = sockwire.ReasonBusy
	case 1, 2, 3, 4:
		// Clean runs: credits and blocking, FIN on the ring.
		sc.demotes, sc.qpFails = [2]int{}, 0
	}
	w := newWorld(sc)
	var trace []string
	for {
		steps := w.moves()
		r.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
		moved := false
		for _, s := range steps {
			// Environment steps are rarer than the programs' and the
			// transport's.
			switch {
			case s.name == "attach" && r.IntN(3) != 0,
				strings.HasPrefix(s.name, "demote") && r.IntN(12) != 0,
				strings.HasPrefix(s.name, "qpfail") && r.IntN(25) != 0,
				strings.HasPrefix(s.name, "release") && r.IntN(4) != 0:
				continue
			}
			w.sc.wchunk, w.sc.rchunk = 1+r.IntN(7), 1+r.IntN(7)
			ok, err := s.apply(w)
			if err != nil {
				return 0, "", fmt.Errorf("%v\n  after %s %s\n  %s", err, tail(trace), s.name, w.describe())
			}
			if ok {
				trace = append(trace, s.name)
				moved = true
				break
			}
		}
		if !moved {
			// Only environment steps may remain: try them all once.
			for _, s := range steps {
				ok, err := s.apply(w)
				if err != nil {
					return 0, "", fmt.Errorf("%v\n  after %s %s", err, tail(trace), s.name)
				}
				if ok {
					trace = append(trace, s.name)
					moved = true
					break
				}
			}
		}
		if !moved {
			break
		}
		if len(trace) > 100000 {
			return 0, "", fmt.Errorf("no end after %d steps: %s", len(trace), tail(trace))
		}
	}
	if err := w.done(); err != nil {
		return 0, "", fmt.Errorf("%v\n  after %s\n  scenario %+v", err, tail(trace), *sc)
	}
	outcome := "tcp only"
	if w.ringBytes > 0 {
		outcome = "ring"
		if w.m[0].attaches > 1 {
			outcome += ", attached again"
		}
		if len(w.m[0].demotes)+len(w.m[1].demotes) > 0 {
			outcome += ", demoted"
		}
	}
	return len(trace), outcome, nil
}

func tail(trace []string) string {
	if len(trace) > 60 {
		return "... " + strings.Join(trace[len(trace)-60:], " ")
	}
	return strings.Join(trace, " ")
}
