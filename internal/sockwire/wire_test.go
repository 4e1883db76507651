package sockwire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.hex from the Go encoder")

const header = "../../cmd/sockpreload/sockproto.h"

func seq(first byte) (a [16]byte) {
	for i := range a {
		a[i] = first + byte(i)
	}
	return a
}

type vector struct {
	name string
	rec  Record // nil for the layouts below
	raw  []byte
}

// The golden vectors; testdata/vectors.c builds the same from the header.
func vectors() []vector {
	recs := []vector{
		{name: "attach_req", rec: Attach{Epoch: 1,
			Tuple:       Tuple{Family: AFInet6, LocalPort: 40000, RemotePort: 5201, Local: seq(0x10), Remote: seq(0x20)},
			Incarnation: 0x0102030405060708,
			Endpoint: Endpoint{GID: seq(0xa0), QPN: 0x000123, PSN: 0xabcdef, RingAddr: 0x00007f0011223344,
				RingRKey: 0x55667788, RingLog2: 18, MTU: 3, CtrlAddr: 0x00007f0099aabbcc, CtrlRKey: 0xddeeff01}}},
		{name: "attach_rep", rec: Attach{Reply: true, Epoch: 2,
			Tuple:       Tuple{Family: AFInet, LocalPort: 5201, RemotePort: 40000, Local: seq(0x30), Remote: seq(0x40)},
			Incarnation: 0x8877665544332211,
			Endpoint: Endpoint{GID: seq(0xb0), QPN: 0xfffffe, PSN: 1, RingAddr: 0x0000555500001000,
				RingRKey: 0x01020304, RingLog2: 12, MTU: 5, CtrlAddr: 0x0000555500000040, CtrlRKey: 0x0a0b0c0d}}},
		{name: "attach_nack", rec: Nack{Epoch: 3, Reason: ReasonNoOwner}},
		{name: "switch", rec: Switch{Epoch: 4, Offset: 0x123456789a}},
		{name: "fin", rec: Fin{Epoch: 5, Offset: 1<<40 + 7}},
		{name: "abort", rec: Abort{Epoch: 6, Reason: ReasonCloseUnread}},
		{name: "demote", rec: Demote{Epoch: 7, Consumed: 0x0fedcba987654321, Reason: ReasonQPError}},
		{name: "route", rec: Route{Epoch: 7,
			Tuple: Tuple{Family: AFInet, LocalPort: 40000, RemotePort: 5201, Local: seq(0x70), Remote: seq(0x80)}}},
		{name: "register", rec: Register{Epoch: 1,
			Tuple: Tuple{Family: AFInet6, LocalPort: 5201, RemotePort: 40000, Local: seq(0x90), Remote: seq(0xa0)},
			FD:    0x7fffffff}},
		{name: "unregister", rec: Unregister{Epoch: 2,
			Tuple: Tuple{Family: AFInet6, LocalPort: 5201, RemotePort: 40000, Local: seq(0x90), Remote: seq(0xa0)}}},
		{name: "result", rec: Result{Epoch: 3,
			Tuple:   Tuple{Family: AFInet, LocalPort: 5201, RemotePort: 40001, Local: seq(0xb0), Remote: seq(0xc0)},
			Request: TypeRegister, Reason: ReasonLimit}},
		{name: "stats", rec: Stats{Epoch: 1, Size: StatsHdrSize + 4096*StatsSlotSize}},
		{name: "device", rec: Device{Epoch: 0xfffffff0, Name: "rxe_eth0"}},
		{name: "list", rec: List{Epoch: 9}},
	}
	for i := range recs {
		b, err := Marshal(recs[i].rec)
		if err != nil {
			panic(fmt.Sprintf("%s: %v", recs[i].name, err))
		}
		recs[i].raw = b
	}
	recs = append(recs,
		vector{name: "ctrl", raw: AppendCtrl(nil, Ctrl{Credit: 0x1111222233334444, Blocked: 0x5555666677778888, Epoch: 9})},
		vector{name: "ring", raw: AppendRingHeader(nil, RingHeader{Log2Size: 16, Epoch: 10, Base: 100, Prod: 300,
			Cons: 200, Fin: NoFin, Credited: 150})},
		vector{name: "imm", raw: binary.BigEndian.AppendUint32(nil, Imm(ImmData, 65536))},
	)
	return recs
}

func TestGoldenFiles(t *testing.T) {
	for _, v := range vectors() {
		path := filepath.Join("testdata", v.name+".hex")
		if *update {
			if err := os.WriteFile(path, []byte(hex.EncodeToString(v.raw)+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (go test -update writes it)", err)
		}
		want, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if !bytes.Equal(v.raw, want) {
			t.Errorf("%s: Go encodes\n%x\nthe file has\n%x", v.name, v.raw, want)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for _, v := range vectors() {
		switch v.name {
		case "ctrl":
			c, err := DecodeCtrl(v.raw)
			if err != nil || c != (Ctrl{Credit: 0x1111222233334444, Blocked: 0x5555666677778888, Epoch: 9}) {
				t.Errorf("ctrl: %+v, %v", c, err)
			}
			continue
		case "ring":
			h, err := DecodeRingHeader(v.raw)
			if err != nil || h.Cons != 200 || h.Fin != NoFin || h.Log2Size != 16 {
				t.Errorf("ring: %+v, %v", h, err)
			}
			continue
		case "imm":
			imm := binary.BigEndian.Uint32(v.raw)
			if ImmType(imm) != ImmData || ImmLen(imm) != 65536 {
				t.Errorf("imm %#x", imm)
			}
			continue
		}
		r, err := Decode(v.raw)
		if err != nil {
			t.Errorf("%s: %v", v.name, err)
			continue
		}
		if !reflect.DeepEqual(r, v.rec) {
			t.Errorf("%s: decoded %+v, want %+v", v.name, r, v.rec)
		}
		h, err := PeekHeader(v.raw)
		if err != nil || h.Type != v.rec.Type() || h.Length != len(v.raw) || h.Epoch != v.rec.RecordEpoch() {
			t.Errorf("%s: header %+v, %v", v.name, h, err)
		}
	}
}

type malformed struct {
	name string
	b    []byte
	kind Kind // 0: well-formed
}

func mutate(b []byte, f func(b []byte) []byte) []byte {
	return f(append([]byte(nil), b...))
}

// Malformed records, each failing one check, and a few well-formed edges.
func malformedRecords() []malformed {
	vs := map[string][]byte{}
	for _, v := range vectors() {
		vs[v.name] = v.raw
	}
	sw, dm, at, dv, nk := vs["switch"], vs["demote"], vs["attach_req"], vs["device"], vs["attach_nack"]
	rt, rg, rs := vs["route"], vs["register"], vs["result"]
	set := func(off int, vals ...byte) func([]byte) []byte {
		return func(b []byte) []byte { copy(b[off:], vals); return b }
	}
	u64 := func(off int, v uint64) func([]byte) []byte {
		return func(b []byte) []byte { le.PutUint64(b[off:], v); return b }
	}
	u32 := func(off int, v uint32) func([]byte) []byte {
		return func(b []byte) []byte { le.PutUint32(b[off:], v); return b }
	}
	m := []malformed{
		{"empty", nil, KindShort},
		{"15 bytes", sw[:15], KindShort},
		{"header only", sw[:16], KindShort},
		{"switch minus one", sw[:23], KindShort},
		{"attach minus one", at[:119], KindShort},
		{"magic byte-swapped", mutate(sw, set(0, 0x53, 0x52)), KindMagic},
		{"version 0", mutate(sw, set(2, 0)), KindVersion},
		{"version 2", mutate(sw, set(2, 2)), KindVersion},
		{"type 0", mutate(sw, set(3, 0)), KindType},
		{"type 8 (reserved)", mutate(sw, set(3, 8)), KindType},
		{"type 16", mutate(sw, set(3, 16)), KindType},
		{"route with a switch's length", mutate(sw, set(3, 9)), KindLength},
		{"type 255", mutate(sw, set(3, 255)), KindType},
		{"length 0", mutate(sw, set(4, 0, 0)), KindLength},
		{"length 32 for switch", mutate(sw, set(4, 32, 0)), KindLength},
		{"length 65535", mutate(sw, set(4, 0xff, 0xff)), KindLength},
		{"extra byte", append(append([]byte(nil), sw...), 0), KindLength},
		{"two records", append(append([]byte(nil), sw...), sw...), KindLength},
		{"flags", mutate(sw, set(6, 1)), KindReserved},
		{"reserved", mutate(sw, set(15, 0x80)), KindReserved},
		{"nack padding", mutate(nk, set(23, 1)), KindReserved},
		{"demote padding", mutate(dm, set(26, 1)), KindReserved},
		{"tuple padding", mutate(at, set(22, 1)), KindReserved},
		{"endpoint padding", mutate(at, set(64+38, 1)), KindReserved},
		{"endpoint padding 2", mutate(at, set(64+55, 1)), KindReserved},
		{"device byte after the name's NUL", mutate(dv, set(16+63, 1)), KindReserved},
		{"device name empty", mutate(dv, set(16, 0, 0, 0, 0, 0, 0, 0, 0)), KindField},
		{"device name empty, a byte after", mutate(dv, set(16, 0)), KindReserved},
		{"device name of 64 bytes, no NUL", mutate(dv, func(b []byte) []byte {
			for i := 16; i < 80; i++ {
				b[i] = 'x'
			}
			return b
		}), KindField},
		{"device name of 63 bytes", mutate(dv, func(b []byte) []byte {
			for i := 16; i < 79; i++ {
				b[i] = 'x'
			}
			return b
		}), 0},
		{"device minus one", dv[:79], KindShort},
		{"epoch 0", mutate(sw, set(8, 0, 0, 0, 0)), KindField},
		{"switch offset 2^63", mutate(sw, u64(16, 1<<63)), KindField},
		{"demote consumed 2^64-1", mutate(dm, u64(16, ^uint64(0))), KindField},
		{"nack reason 0", mutate(nk, set(16, 0, 0)), KindField},
		{"nack reason max+1", mutate(nk, set(16, byte(ReasonMax+1), 0)), KindField},
		{"demote reason 0", mutate(dm, set(24, 0, 0)), KindField},
		{"family 3", mutate(at, set(16, 3, 0)), KindField},
		{"qpn 2^24", mutate(at, set(64+16, 0, 0, 0, 1)), KindField},
		{"psn 2^24", mutate(at, set(64+20, 0, 0, 0, 1)), KindField},
		{"ring log2 11", mutate(at, set(64+36, 11)), KindField},
		{"ring log2 31", mutate(at, set(64+36, 31)), KindField},
		{"mtu 0", mutate(at, set(64+37, 0)), KindField},
		{"mtu 6", mutate(at, set(64+37, 6)), KindField},
		{"family before endpoint padding", mutate(at, func(b []byte) []byte {
			b[16] = 3
			b[64+38] = 1
			return b
		}), KindField},
		{"length checked before size", mutate(at[:20], set(3, byte(TypeSwitch))), KindLength},
		{"route minus one", rt[:55], KindShort},
		{"route tuple padding", mutate(rt, set(22, 1)), KindReserved},
		{"route family 0", mutate(rt, set(16, 0, 0)), KindField},
		{"register padding", mutate(rg, set(60, 1)), KindReserved},
		{"register fd -1", mutate(rg, set(56, 0xff, 0xff, 0xff, 0xff)), KindField},
		{"register family before padding", mutate(rg, set(16, 3, 0, 0)), KindField},
		{"result padding", mutate(rs, set(57, 1)), KindReserved},
		{"result padding 2", mutate(rs, set(63, 1)), KindReserved},
		{"result request 0", mutate(rs, set(56, 0)), KindField},
		{"result request 16", mutate(rs, set(56, 16)), KindField},
		{"stats padding", mutate(vs["stats"], set(20, 1)), KindReserved},
		{"stats size below", mutate(vs["stats"], u32(16, StatsMin-1)), KindField},
		{"stats size above", mutate(vs["stats"], u32(16, StatsMax+1)), KindField},
		{"stats size min", mutate(vs["stats"], u32(16, StatsMin)), 0},
		{"stats size max", mutate(vs["stats"], u32(16, StatsMax)), 0},
		{"stats padding before size", mutate(vs["stats"], func(b []byte) []byte {
			le.PutUint32(b[16:], 0)
			b[23] = 1
			return b
		}), KindReserved},
		{"list reserved", mutate(vs["list"], set(23, 1)), KindReserved},
		{"list minus one", vs["list"][:23], KindShort},
		{"result request list", mutate(rs, set(56, byte(TypeList))), 0},
		{"result reason max+1", mutate(rs, set(58, byte(ReasonMax+1), 0)), KindField},
		{"result padding before request", mutate(rs, set(56, 0, 1)), KindReserved},
		{"result reason 0", mutate(rs, set(58, 0, 0)), 0},
		{"register fd 0", mutate(rg, set(56, 0, 0, 0, 0)), 0},
		{"switch offset 2^63-1", mutate(sw, u64(16, 1<<63-1)), 0},
		{"nack reason max", mutate(nk, set(16, byte(ReasonMax), 0)), 0},
		{"ring log2 12", mutate(at, set(64+36, 12)), 0},
	}
	for _, v := range vectors() {
		if v.rec != nil {
			m = append(m, malformed{"golden " + v.name, v.raw, 0})
		}
	}
	return m
}

func TestMalformed(t *testing.T) {
	for _, m := range malformedRecords() {
		r, err := Decode(m.b)
		if m.kind == 0 {
			if err != nil {
				t.Errorf("%s: %v", m.name, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Kind != m.kind {
			t.Errorf("%s: %v (record %v), want kind %d", m.name, err, r, m.kind)
			continue
		}
		if !errors.Is(err, kindErrs[m.kind]) {
			t.Errorf("%s: %v does not wrap %v", m.name, err, kindErrs[m.kind])
		}
		if r != nil {
			t.Errorf("%s: a record with an error", m.name)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	good := Endpoint{QPN: 1, RingLog2: 12, MTU: 1}
	for _, r := range []Record{
		nil,
		Switch{Epoch: 0, Offset: 1},
		Switch{Epoch: 1, Offset: 1 << 63},
		Fin{Epoch: 1, Offset: ^uint64(0)},
		Demote{Epoch: 1, Reason: 0},
		Demote{Epoch: 1, Reason: ReasonQPError, Consumed: 1 << 63},
		Nack{Epoch: 1, Reason: ReasonMax + 1},
		Abort{Epoch: 1},
		Attach{Epoch: 1, Tuple: Tuple{Family: 1}, Endpoint: good},
		Attach{Epoch: 1, Tuple: Tuple{Family: AFInet}, Endpoint: Endpoint{QPN: 1 << 24, RingLog2: 12, MTU: 1}},
		Attach{Epoch: 1, Tuple: Tuple{Family: AFInet}, Endpoint: Endpoint{RingLog2: 31, MTU: 1}},
		Attach{Epoch: 1, Tuple: Tuple{Family: AFInet}, Endpoint: Endpoint{RingLog2: 12, MTU: 0}},
		Device{Epoch: 1},
		Device{Epoch: 1, Name: "a\x00b"},
		Device{Epoch: 1, Name: strings.Repeat("x", DeviceNameMax)},
		Route{Epoch: 1},
		Unregister{Epoch: 1, Tuple: Tuple{Family: 3}},
		Register{Epoch: 1, Tuple: Tuple{Family: AFInet}, FD: -1},
		Result{Epoch: 1, Tuple: Tuple{Family: AFInet}, Request: 0},
		Result{Epoch: 1, Tuple: Tuple{Family: AFInet}, Request: TypeMax + 1},
		Result{Epoch: 1, Tuple: Tuple{Family: AFInet}, Request: TypeRegister, Reason: ReasonMax + 1},
	} {
		b, err := Append([]byte{1, 2}, r)
		var e *Error
		if !errors.As(err, &e) || !bytes.Equal(b, []byte{1, 2}) {
			t.Errorf("%+v: %v, %x", r, err, b)
		}
	}
}

func TestLayouts(t *testing.T) {
	if _, err := DecodeCtrl(make([]byte, 63)); !errors.Is(err, ErrShort) {
		t.Errorf("short ctrl: %v", err)
	}
	c := AppendCtrl(nil, Ctrl{Credit: 1})
	c[40] = 1
	if _, err := DecodeCtrl(c); !errors.Is(err, ErrReserved) {
		t.Errorf("ctrl padding: %v", err)
	}
	good := RingHeader{Log2Size: 12, Epoch: 1, Base: 10, Prod: 20, Cons: 15, Fin: NoFin, Credited: 12}
	for name, tc := range map[string]struct {
		h    RingHeader
		edit func([]byte)
		want error
	}{
		"good":           {good, nil, nil},
		"short":          {good, nil, ErrShort},
		"magic":          {good, func(b []byte) { b[0] = 0 }, ErrMagic},
		"version":        {good, func(b []byte) { b[4] = 9 }, ErrVersion},
		"flags":          {good, func(b []byte) { b[7] = 1 }, ErrReserved},
		"log2":           {RingHeader{Log2Size: 40, Fin: NoFin}, nil, ErrField},
		"cons>prod":      {RingHeader{Log2Size: 12, Cons: 5, Prod: 4, Fin: NoFin}, nil, ErrField},
		"over the size":  {RingHeader{Log2Size: 12, Prod: 4097, Fin: NoFin}, nil, ErrField},
		"fin below prod": {RingHeader{Log2Size: 12, Prod: 9, Fin: 8}, nil, ErrField},
		"credited":       {RingHeader{Log2Size: 12, Credited: 1, Fin: NoFin}, nil, ErrField},
	} {
		b := AppendRingHeader(nil, tc.h)
		if name == "short" {
			b = b[:63]
		}
		if tc.edit != nil {
			tc.edit(b)
		}
		h, err := DecodeRingHeader(b)
		if !errors.Is(err, tc.want) || (err == nil && h != tc.h) {
			t.Errorf("%s: %+v, %v, want %v", name, h, err, tc.want)
		}
	}
	if Imm(ImmData, ImmLenMax+1) != ImmData<<28 {
		t.Errorf("Imm does not mask the length as the C macro does")
	}
}

// cHelper builds testdata/vectors.c with the host's C compiler.
func cHelper(t *testing.T) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s): %v", cc, err)
	}
	bin := filepath.Join(t.TempDir(), "vectors")
	out, err := exec.Command(cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-pedantic",
		"-I", filepath.Dir(header), "-o", bin, "testdata/vectors.c").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, out)
	}
	return bin
}

func run(t *testing.T, bin, mode, stdin string) []string {
	t.Helper()
	cmd := exec.Command(bin, mode)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("vectors %s: %v", mode, err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// The header and the Go mirror agree: the same vectors byte for byte, the
// same sizes and constants, and the same verdict on malformed records.
func TestHeaderAgrees(t *testing.T) {
	bin := cHelper(t)

	c := map[string]string{}
	for _, l := range run(t, bin, "vectors", "") {
		name, h, _ := strings.Cut(l, " ")
		c[name] = h
	}
	vs := vectors()
	if len(c) != len(vs) {
		t.Errorf("C has %d vectors, Go %d", len(c), len(vs))
	}
	for _, v := range vs {
		if got := hex.EncodeToString(v.raw); c[v.name] != got {
			t.Errorf("%s:\nC  %s\nGo %s", v.name, c[v.name], got)
		}
	}

	want := map[string]uint64{
		"magic": Magic, "version": Version, "type_max": uint64(TypeMax), "reason_max": uint64(ReasonMax),
		"record_max": RecordMax, "ring_log2_min": RingLog2Min, "ring_log2_max": RingLog2Max,
		"ring_magic": RingMagic, "imm_len_max": ImmLenMax, "imm_ctrl": ImmCtrl, "imm_data": ImmData, "sizeof.ctrl": CtrlSize,
		"sizeof.ring": RingHeaderSize, "sockproto_ctrl.credit": CtrlCreditOff,
		"sockproto_ctrl.blocked": CtrlBlockedOff, "sockproto_ctrl.epoch": CtrlEpochOff,

		"stats_magic": StatsMagic, "stats_version": StatsVersion, "stats_reasons": StatsReasons,
		"stats_slots_max": StatsSlotsMax, "stats_min": StatsMin, "stats_max": StatsMax,
		"sizeof.stats": StatsHdrSize, "sizeof.stats_slot": StatsSlotSize, "sizeof.stats_counters": StatsCountersSize,
		"stats_client": StatsClient, "stats_server": StatsServer, "stats_adopted": StatsAdopted,
		"slot_state_max":          SlotStateMax,
		"sockproto_stats.version": StatsVersionOff, "sockproto_stats.hdr_size": StatsHdrSizeOff,
		"sockproto_stats.slot_size": StatsSlotSizeOff, "sockproto_stats.nslots": StatsNSlotsOff,
		"sockproto_stats.used": StatsUsedOff, "sockproto_stats.pid": StatsPIDOff, "sockproto_stats.c": StatsCountersOff,
		"sockproto_stats_counters.connect_failed": StatsConnectFailOff,
		"sockproto_stats_counters.inherited":      StatsInheritedOff, "sockproto_stats_counters.live": StatsLiveOff,
		"sockproto_stats_counters.bytes_in": StatsBytesInOff, "sockproto_stats_counters.bytes_out": StatsBytesOutOff,
		"sockproto_stats_counters.rdma_in": StatsRDMAInOff, "sockproto_stats_counters.rdma_out": StatsRDMAOutOff,
		"sockproto_stats_counters.rdma_writes": StatsRDMAWritesOff,
		"sockproto_stats_counters.attachable":  StatsAttachableOff, "sockproto_stats_counters.attached": StatsAttachedOff,
		"sockproto_stats_counters.demoted": StatsDemotedOff, "sockproto_stats_counters.fd_passed": StatsFDPassedOff,
		"sockproto_stats_counters.fdopen": StatsFdopenOff, "sockproto_stats_counters.splice": StatsSpliceOff,
		"sockproto_stats_counters.execs": StatsExecsOff, "sockproto_stats_counters.spawns": StatsSpawnsOff,
		"sockproto_stats_counters.demotes": StatsDemotesOff, "sockproto_stats_counters.fallbacks": StatsFallbacksOff,
		"sockproto_stats_slot.state": SlotStateOff, "sockproto_stats_slot.path": SlotPathOff,
		"sockproto_stats_slot.last_reason": SlotReasonOff, "sockproto_stats_slot.epoch": SlotEpochOff,
		"sockproto_stats_slot.fd": SlotFDOff, "sockproto_stats_slot.tuple": SlotTupleOff,
		"sockproto_stats_slot.bytes_in": SlotBytesInOff, "sockproto_stats_slot.bytes_out": SlotBytesOutOff,
		"sockproto_stats_slot.rdma_in": SlotRDMAInOff, "sockproto_stats_slot.rdma_out": SlotRDMAOutOff,
		"sockproto_stats_slot.rdma_writes": SlotRDMAWritesOff,
	}
	for ty := Type(0); ty <= TypeMax+1; ty++ {
		want[fmt.Sprintf("size.%d", ty)] = uint64(ty.Size())
	}
	seen := 0
	for _, l := range run(t, bin, "layout", "") {
		name, val, _ := strings.Cut(l, " ")
		v, err := strconv.ParseUint(val, 10, 64)
		w, ok := want[name]
		if err != nil || !ok {
			t.Errorf("layout line %q", l)
			continue
		}
		seen++
		if v != w {
			t.Errorf("%s: header %d, Go %d", name, v, w)
		}
	}
	if seen != len(want) {
		t.Errorf("C printed %d of %d layout values", seen, len(want))
	}

	ms := malformedRecords()
	var in strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&in, "%x\n", m.b)
	}
	got := run(t, bin, "check", in.String())
	if len(got) != len(ms) {
		t.Fatalf("C checked %d records of %d", len(got), len(ms))
	}
	for i, m := range ms {
		if got[i] != strconv.Itoa(int(m.kind)) {
			t.Errorf("%s: C says %s, Go %d", m.name, got[i], m.kind)
		}
	}
}

// Every input decodes or fails with an *Error, never panics; what decodes
// encodes back to the same bytes (one encoding per record).
func FuzzDecode(f *testing.F) {
	for _, v := range vectors() {
		f.Add(v.raw)
	}
	for _, name := range []string{"switch", "attach_req"} {
		if b, err := os.ReadFile(filepath.Join("testdata", name+".hex")); err == nil {
			if raw, err := hex.DecodeString(strings.TrimSpace(string(b))); err == nil {
				for i := range raw {
					f.Add(raw[:i])
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || r != nil || e.Kind < KindShort || e.Kind > KindField {
				t.Fatalf("%x: %#v, %v", b, r, err)
			}
			_ = e.Error()
			return
		}
		out, err := Marshal(r)
		if err != nil || !bytes.Equal(out, b) {
			t.Fatalf("%x decodes to %+v, encodes to %x, %v", b, r, out, err)
		}
		if _, err := DecodeCtrl(b); err != nil && !errors.Is(err, ErrShort) && !errors.Is(err, ErrReserved) {
			t.Fatalf("ctrl: %v", err)
		}
		_, _ = DecodeRingHeader(b)
	})
}

// The golden files must stay one line of hex each (tools read them).
func TestGoldenFormat(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.hex")
	if len(files) == 0 {
		t.Skip("no golden files")
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		lines := 0
		for sc.Scan() {
			lines++
		}
		fh.Close()
		if lines != 1 {
			t.Errorf("%s: %d lines", f, lines)
		}
	}
}
