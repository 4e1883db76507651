package kmod

import (
	"bytes"
	"encoding/binary"
	"os"
	"strings"
	"testing"
)

// fakeDomain is a Domain over ordinary memory laid out like the kernel's
// mapping, so the consumer side can be tested without the module.
func fakeDomain(size int) *Domain {
	mem := make([]byte, os.Getpagesize()+size)
	return &Domain{id: 7, mem: mem, area: mem[os.Getpagesize():], size: uint64(size)}
}

// produce appends an entry the way the kernel does (padding at the end of
// the area) and publishes head.
func (dm *Domain) produce(t *testing.T, op uint16, seq uint64, data []byte) {
	t.Helper()
	head := binary.LittleEndian.Uint64(dm.mem[offHead:])
	l := uint64(EntryHeader + (len(data)+EntryAlign-1)/EntryAlign*EntryAlign)
	off := head & (dm.size - 1)
	if dm.size-off < l {
		binary.LittleEndian.PutUint32(dm.area[off:], uint32(dm.size-off))
		binary.LittleEndian.PutUint16(dm.area[off+4:], opPad)
		head += dm.size - off
		off = 0
	}
	e := dm.area[off:]
	clear(e[:EntryHeader])
	binary.LittleEndian.PutUint32(e[0:], uint32(l))
	binary.LittleEndian.PutUint16(e[4:], op)
	if len(data) > 0 {
		binary.LittleEndian.PutUint16(e[6:], FlagData)
	}
	binary.LittleEndian.PutUint64(e[8:], seq)
	binary.LittleEndian.PutUint64(e[16:], 0x1000*seq)
	binary.LittleEndian.PutUint32(e[24:], uint32(len(data)))
	binary.LittleEndian.PutUint32(e[28:], uint32(len(data)))
	binary.LittleEndian.PutUint32(e[32:], dm.id)
	copy(e[EntryHeader:], data)
	binary.LittleEndian.PutUint64(dm.mem[offHead:], head+l)
	binary.LittleEndian.PutUint64(dm.mem[offHeadSeq:], seq)
}

func TestReadWrapsAndPads(t *testing.T) {
	dm := fakeDomain(4096)
	seq := uint64(0)
	var got []Entry
	for round := 0; round < 50; round++ {
		for i := 0; i < 5; i++ {
			seq++
			dm.produce(t, uint16(OpWrite), seq, bytes.Repeat([]byte{byte(seq)}, int(seq%200)))
		}
		es, err := dm.Read(nil, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) != 3 {
			t.Fatalf("Read with max 3 returned %d", len(es))
		}
		got = append(got, es...)
		if es, err = dm.Read(nil, 0); err != nil {
			t.Fatal(err)
		}
		got = append(got, es...)
	}
	if len(got) != int(seq) {
		t.Fatalf("%d entries for %d produced", len(got), seq)
	}
	for i, e := range got {
		s := uint64(i + 1)
		if e.Seq != s || e.Op != OpWrite || e.IOVA != 0x1000*s || e.Domain != 7 ||
			!bytes.Equal(e.Data, bytes.Repeat([]byte{byte(s)}, int(s%200))) {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}
	if dm.Tail() != binary.LittleEndian.Uint64(dm.mem[offHead:]) {
		t.Fatal("tail does not reach head")
	}
}

func TestReadRefusesCorruption(t *testing.T) {
	dm := fakeDomain(4096)
	dm.produce(t, uint16(OpWrite), 1, nil)
	binary.LittleEndian.PutUint32(dm.area[0:], 12) // not a multiple of 64
	if _, err := dm.Read(nil, 0); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt length: %v", err)
	}
	dm = fakeDomain(4096)
	binary.LittleEndian.PutUint64(dm.mem[offHead:], 1<<20)
	if _, err := dm.Read(nil, 0); err == nil {
		t.Fatal("head beyond the log accepted")
	}
}

func TestDomainMisuse(t *testing.T) {
	dm := fakeDomain(4096)
	if err := dm.Arm(1, 0, 4096, 0x40); err == nil {
		t.Fatal("bad bits accepted")
	}
	if err := dm.Notify(NotifyOptions{Threshold: -1}); err == nil {
		t.Fatal("negative threshold accepted")
	}
	d := &Device{domains: map[*Domain]struct{}{}, closed: true}
	if _, err := d.NewDomain(1000); err == nil {
		t.Fatal("odd log size accepted")
	}
	if _, err := d.NewDomain(4096); err != ErrClosed {
		t.Fatalf("NewDomain on a closed device: %v", err)
	}
}
