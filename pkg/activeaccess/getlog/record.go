package getlog

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// A record is one logged get entry, on disk and on the wire:
//
//	len u32 (data bytes) | seq u64 | offset u64 | CRC-32C of seq, offset and data u32 | data
//
// little-endian; seq counts a reader's entries from 1 without gaps.
const recHeader = 4 + 8 + 8 + 4

// maxEntry bounds one entry's data: a log entry is at most one packet in
// one page. Larger lengths in a file or a reply are corruption.
const maxEntry = 64 << 10

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Entry is one logged part of a get: the bytes a reader was served from
// Offset (one packet in one page, at most 64 KiB; a get larger than the
// path MTU, or crossing a page boundary, is several entries, in order).
type Entry struct {
	Seq    uint64 // the reader's entry number, from 1 without gaps
	Offset int    // where the bytes were read in the target's memory
	Data   []byte
}

func recordCRC(seq uint64, off int, data []byte) uint32 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], seq)
	binary.LittleEndian.PutUint64(b[8:], uint64(off))
	return crc32.Update(crc32.Checksum(b[:], castagnoli), castagnoli, data)
}

// appendRecord appends e's encoding to b.
func appendRecord(b []byte, e Entry) []byte {
	var h [recHeader]byte
	return append(append(b, recordHeader(&h, e)...), e.Data...)
}

// writeRecord writes e's encoding to w without allocating.
func writeRecord(w *bufio.Writer, e Entry) error {
	var h [recHeader]byte
	w.Write(recordHeader(&h, e))
	_, err := w.Write(e.Data)
	return err
}

func recordHeader(h *[recHeader]byte, e Entry) []byte {
	binary.LittleEndian.PutUint32(h[:], uint32(len(e.Data)))
	binary.LittleEndian.PutUint64(h[4:], e.Seq)
	binary.LittleEndian.PutUint64(h[12:], uint64(e.Offset))
	binary.LittleEndian.PutUint32(h[20:], recordCRC(e.Seq, e.Offset, e.Data))
	return h[:]
}

// readRecords reads records until EOF, checking each one and that their
// seqs run from first without gaps. It returns the records it read before
// any error; a clean EOF between records ends without error, anything else
// (a truncated or damaged record) wraps ErrCorrupt.
func readRecords(r io.Reader, first uint64, max uint64) ([]Entry, error) {
	br := bufio.NewReader(r)
	var out []Entry
	var h [recHeader]byte
	for uint64(len(out)) < max {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, fmt.Errorf("%w: record %d: %w", ErrCorrupt, first+uint64(len(out)), unexpected(err))
		}
		n := binary.LittleEndian.Uint32(h[:])
		e := Entry{Seq: binary.LittleEndian.Uint64(h[4:]), Offset: int(binary.LittleEndian.Uint64(h[12:]))}
		want := first + uint64(len(out))
		if n > maxEntry || e.Seq != want || e.Offset < 0 {
			return out, fmt.Errorf("%w: record %d: %d bytes, seq %d, offset %d", ErrCorrupt, want, n, e.Seq, e.Offset)
		}
		e.Data = make([]byte, n)
		if _, err := io.ReadFull(br, e.Data); err != nil {
			return out, fmt.Errorf("%w: record %d: %w", ErrCorrupt, want, unexpected(err))
		}
		if got := binary.LittleEndian.Uint32(h[20:]); got != recordCRC(e.Seq, e.Offset, e.Data) {
			return out, fmt.Errorf("%w: record %d: checksum mismatch", ErrCorrupt, want)
		}
		out = append(out, e)
	}
	return out, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
