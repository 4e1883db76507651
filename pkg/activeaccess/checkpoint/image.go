package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// An image is one checkpoint as Tracker.Checkpoint writes it:
//
//	header   magic "AACKPT01", seq u64, off u64, length u64, pages u32, flags u32 (1: full)
//	pages    per saved page, in increasing order: its index in the range u32, then Page bytes
//	trailer  CRC-32C of everything before it, u32
//
// little-endian. A full image holds every page of the range; an
// incremental one only those changed since the image before it (seq - 1).

var imageMagic = [8]byte{'A', 'A', 'C', 'K', 'P', 'T', '0', '1'}

const (
	headerSize = 8 + 8 + 8 + 8 + 4 + 4
	flagFull   = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Info describes a checkpoint image.
type Info struct {
	Seq    uint64 // 1 for the first (full) image of a Tracker, then +1 each
	Off    int    // the range of the target's memory: its first byte
	Length int    // and its length
	Full   bool   // every page of the range is saved
	Pages  int    // pages saved
	Remote int    // of these, pages written remotely since the last image (0 in a full image)
	Local  int    // pages written by the process itself (0 in a full image); a page can be both
	Bytes  int64  // the image's size
}

// ImageSize is the size in bytes of an image of n pages (Info.Bytes), for
// sizing the space checkpoints need. It cannot fail.
func ImageSize(n int) int64 { return int64(headerSize) + int64(n)*(4+Page) + 4 }

// writeImage writes an image of the pages idx (increasing) of mem, the
// range [info.Off, +info.Length). It stops with ctx's error when ctx
// ends, looking between pages.
func writeImage(ctx context.Context, w io.Writer, info Info, mem []byte, idx []int) (int64, error) {
	h := crc32.New(castagnoli)
	cw := &countWriter{w: io.MultiWriter(w, h)}
	var hdr [headerSize]byte
	copy(hdr[:], imageMagic[:])
	binary.LittleEndian.PutUint64(hdr[8:], info.Seq)
	binary.LittleEndian.PutUint64(hdr[16:], uint64(info.Off))
	binary.LittleEndian.PutUint64(hdr[24:], uint64(info.Length))
	binary.LittleEndian.PutUint32(hdr[32:], uint32(len(idx)))
	if info.Full {
		binary.LittleEndian.PutUint32(hdr[36:], flagFull)
	}
	cw.Write(hdr[:])
	var ib [4]byte
	for _, i := range idx {
		if err := ctx.Err(); err != nil && cw.err == nil {
			cw.err = err
		}
		binary.LittleEndian.PutUint32(ib[:], uint32(i))
		cw.Write(ib[:])
		cw.Write(mem[i*Page : (i+1)*Page])
	}
	binary.LittleEndian.PutUint32(ib[:], h.Sum32())
	if cw.err == nil {
		_, cw.err = w.Write(ib[:])
		cw.n += 4
	}
	if cw.err != nil {
		return cw.n, fmt.Errorf("writing image %d: %w", info.Seq, cw.err)
	}
	return cw.n, nil
}

type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(b []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
	return n, err
}

// image is a read and verified image.
type image struct {
	info  Info
	pages []int
	data  []byte // len(pages) * Page
}

// readImage reads and verifies one image (magic, sizes, page order, CRC).
// maxLength bounds the range it accepts, so that a corrupt header cannot
// make it allocate without bound. It stops with ctx's error when ctx
// ends, looking between pages.
func readImage(ctx context.Context, r io.Reader, maxLength int) (*image, error) {
	h := crc32.New(castagnoli)
	tr := io.TeeReader(r, h)
	var hdr [headerSize]byte
	if _, err := io.ReadFull(tr, hdr[:]); err != nil {
		return nil, fmt.Errorf("%w: header: %w", ErrCorrupt, unexpected(err))
	}
	if !bytes.Equal(hdr[:8], imageMagic[:]) {
		return nil, fmt.Errorf("%w: not a checkpoint image (magic %q)", ErrCorrupt, hdr[:8])
	}
	im := &image{info: Info{
		Seq:    binary.LittleEndian.Uint64(hdr[8:]),
		Off:    int(binary.LittleEndian.Uint64(hdr[16:])),
		Length: int(binary.LittleEndian.Uint64(hdr[24:])),
		Pages:  int(binary.LittleEndian.Uint32(hdr[32:])),
		Full:   binary.LittleEndian.Uint32(hdr[36:])&flagFull != 0,
	}}
	in := im.info
	switch {
	case binary.LittleEndian.Uint32(hdr[36:])&^flagFull != 0:
		return nil, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, binary.LittleEndian.Uint32(hdr[36:]))
	case in.Off < 0 || in.Off%Page != 0 || in.Length <= 0 || in.Length%Page != 0 || in.Length > maxLength:
		return nil, fmt.Errorf("%w: range [%d, +%d) (at most %d bytes, whole pages)", ErrCorrupt, in.Off, in.Length, maxLength)
	case in.Pages > in.Length/Page || (in.Full && in.Pages != in.Length/Page):
		return nil, fmt.Errorf("%w: %d pages in a range of %d (full %v)", ErrCorrupt, in.Pages, in.Length/Page, in.Full)
	}
	im.pages = make([]int, in.Pages)
	im.data = make([]byte, in.Pages*Page)
	var ib [4]byte
	for k := range im.pages {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(tr, ib[:]); err != nil {
			return nil, fmt.Errorf("%w: page %d of %d: %w", ErrCorrupt, k, in.Pages, unexpected(err))
		}
		i := int(binary.LittleEndian.Uint32(ib[:]))
		if i >= in.Length/Page || (k > 0 && i <= im.pages[k-1]) {
			return nil, fmt.Errorf("%w: page index %d (entry %d) out of order or range", ErrCorrupt, i, k)
		}
		im.pages[k] = i
		if _, err := io.ReadFull(tr, im.data[k*Page:(k+1)*Page]); err != nil {
			return nil, fmt.Errorf("%w: page %d of %d: %w", ErrCorrupt, k, in.Pages, unexpected(err))
		}
	}
	sum := h.Sum32()
	if _, err := io.ReadFull(r, ib[:]); err != nil {
		return nil, fmt.Errorf("%w: checksum: %w", ErrCorrupt, unexpected(err))
	}
	if got := binary.LittleEndian.Uint32(ib[:]); got != sum {
		return nil, fmt.Errorf("%w: checksum %#x, computed %#x", ErrCorrupt, got, sum)
	}
	im.info.Bytes = ImageSize(in.Pages)
	return im, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Restore rebuilds a range of memory from its images: the first must be a
// full image, each next one the incremental image that followed it (seq
// +1, same range). dst is the range's bytes (len(dst) == Info.Length; it
// may be a target's memory slice or any buffer). Every image is read and
// verified before dst is touched, so on error dst is unchanged. It returns
// the last image's Info.
//
// If ctx is already done, Restore returns ctx's error, wrapped, and reads
// nothing; if ctx ends while it reads (it looks between pages), it
// returns ctx's error and dst is unchanged. Other errors wrap ErrCorrupt
// (a damaged, truncated or foreign image), ErrSequence (missing, repeated
// or out-of-order images, another range), ErrInvalid (no images, dst of
// the wrong size), or a reader's error.
func Restore(ctx context.Context, dst []byte, images ...io.Reader) (Info, error) {
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("checkpoint: restore: %w", err)
	}
	if len(images) == 0 {
		return Info{}, fmt.Errorf("%w: no images", ErrInvalid)
	}
	ims := make([]*image, len(images))
	for k, r := range images {
		im, err := readImage(ctx, r, len(dst))
		if err != nil {
			return Info{}, fmt.Errorf("checkpoint: restore: image %d: %w", k, err)
		}
		switch {
		case k == 0 && !im.info.Full:
			return Info{}, fmt.Errorf("%w: the first image (seq %d) is incremental, need a full one", ErrSequence, im.info.Seq)
		case k > 0 && im.info.Seq != ims[k-1].info.Seq+1:
			return Info{}, fmt.Errorf("%w: image %d has seq %d after seq %d", ErrSequence, k, im.info.Seq, ims[k-1].info.Seq)
		case k > 0 && (im.info.Off != ims[0].info.Off || im.info.Length != ims[0].info.Length):
			return Info{}, fmt.Errorf("%w: image %d covers [%d, +%d), the first [%d, +%d)", ErrSequence, k, im.info.Off, im.info.Length, ims[0].info.Off, ims[0].info.Length)
		}
		ims[k] = im
	}
	if ims[0].info.Length != len(dst) {
		return Info{}, fmt.Errorf("%w: images of %d bytes, destination of %d", ErrInvalid, ims[0].info.Length, len(dst))
	}
	for _, im := range ims {
		for k, i := range im.pages {
			copy(dst[i*Page:(i+1)*Page], im.data[k*Page:(k+1)*Page])
		}
	}
	return ims[len(ims)-1].info, nil
}
