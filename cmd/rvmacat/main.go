// Command rvmacat moves data through RVMA mailboxes (pkg/rvma), like a
// netcat for one-sided puts: a receiver opens a window on a mailbox and
// prints every completed buffer; a sender puts its standard input to the
// mailbox of a receiver it knows only by address.
//
// Receive two epochs of 32 bytes on mailbox 0x11FF0011:
//
//	rvmacat -l 10.77.0.1:7471 -mailbox 0x11FF0011 -threshold 32 -epochs 2
//
// Put 32 bytes from another host, in pieces of 8 bytes issued last piece
// first (the receiver counts bytes, whatever order they land in):
//
//	head -c 32 /dev/urandom | rvmacat -local 10.77.0.2:7472 -mailbox 0x11FF0011 -piece 8 -reverse 10.77.0.1:7471
//
// The receiver prints, per epoch, the completion record (epoch, address,
// length, puts, flags) and the bytes, quoted; with -metrics it then prints
// the window's Prometheus metrics. rvmacat exits non-zero with the error
// of the failing call (a put to a closed or unknown mailbox, a peer that
// is gone, no buffer posted before -timeout).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
)

func main() {
	var (
		listen    = flag.String("l", "", "receive: the address to listen on (an IP of an RDMA device, and a port)")
		local     = flag.String("local", "", "send: the address this endpoint listens on")
		mailbox   = flag.String("mailbox", "0x11FF0011", "the mailbox address (decimal or 0x hex)")
		threshold = flag.Uint64("threshold", 0, "receive: bytes per epoch (default: the buffer size)")
		bufSize   = flag.Int("size", 4096, "receive: bytes per buffer")
		buffers   = flag.Int("buffers", 4, "receive: buffers posted to the window")
		epochs    = flag.Int("epochs", 1, "receive: epochs to wait for before exiting")
		metrics   = flag.Bool("metrics", false, "receive: print the endpoint's metrics before exiting")
		piece     = flag.Int("piece", 0, "send: bytes per put (default: everything in one put)")
		reverse   = flag.Bool("reverse", false, "send: issue the pieces last first")
		offset    = flag.Uint64("offset", 0, "send: offset in the receiver's buffer of the first byte")
		timeout   = flag.Duration("timeout", time.Minute, "give up after this long")
	)
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("rvmacat: ")
	mb, err := strconv.ParseUint(*mailbox, 0, 64)
	if err != nil {
		log.Fatalf("-mailbox: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	switch {
	case *listen != "" && flag.NArg() == 0:
		err = receive(ctx, *listen, rvma.Mailbox(mb), *threshold, *bufSize, *buffers, *epochs, *metrics)
	case *listen == "" && *local != "" && flag.NArg() == 1:
		err = send(ctx, *local, flag.Arg(0), rvma.Mailbox(mb), *offset, *piece, *reverse)
	default:
		fmt.Fprintln(os.Stderr, "usage: rvmacat -l ADDR:PORT [receive flags]  |  rvmacat -local ADDR:PORT [send flags] DEST:PORT < data")
		flag.PrintDefaults()
		os.Exit(2)
	}
	if err != nil {
		log.Fatal(err)
	}
}

func receive(ctx context.Context, addr string, mb rvma.Mailbox, threshold uint64, size, buffers, epochs int, metrics bool) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return fmt.Errorf("-l: %w", err)
	}
	ep, err := rvma.Listen(ctx, ap, nil)
	if err != nil {
		return err
	}
	defer ep.Close()
	w, err := ep.InitWindow(mb, &rvma.WindowOptions{Threshold: threshold})
	if err != nil {
		return err
	}
	mem, err := ep.Alloc(size * buffers)
	if err != nil {
		return err
	}
	var posted []*rvma.Posted
	for i := 0; i < buffers; i++ {
		p, err := w.Post(ctx, mem[i*size:(i+1)*size], nil)
		if err != nil {
			return err
		}
		posted = append(posted, p)
	}
	fmt.Printf("listening on %v, mailbox %v: %d buffers of %d bytes posted\n", ep.Addr(), mb, buffers, size)
	for e := 0; e < epochs; e++ {
		p := posted[e%buffers]
		rec, err := p.Wait(ctx)
		if err != nil {
			return err
		}
		data := p.Bytes()[:rec.Len]
		fmt.Printf("epoch %d complete: addr %#x, %d bytes in %d puts, flags %v\n  %q\n", rec.Epoch, rec.Addr, rec.Len, rec.Ops, rec.Flags, data)
		if err := p.Release(ctx); err != nil {
			return err
		}
	}
	if metrics {
		reg := prometheus.NewRegistry()
		reg.MustRegister(rvma.NewCollector(ep))
		mfs, err := reg.Gather()
		if err != nil {
			return err
		}
		enc := expfmt.NewEncoder(os.Stdout, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				return err
			}
		}
	}
	return w.Close()
}

func send(ctx context.Context, local, dst string, mb rvma.Mailbox, off uint64, piece int, reverse bool) error {
	lp, err := netip.ParseAddrPort(local)
	if err != nil {
		return fmt.Errorf("-local: %w", err)
	}
	dp, err := netip.ParseAddrPort(dst)
	if err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	if len(data) == 0 {
		return errors.New("nothing to put: standard input is empty")
	}
	ep, err := rvma.Listen(ctx, lp, nil)
	if err != nil {
		return err
	}
	defer ep.Close()
	if piece <= 0 || piece > len(data) {
		piece = len(data)
	}
	var starts []int
	for s := 0; s < len(data); s += piece {
		starts = append(starts, s)
	}
	if reverse {
		for i, j := 0, len(starts)-1; i < j; i, j = i+1, j-1 {
			starts[i], starts[j] = starts[j], starts[i]
		}
	}
	var ops []*rvma.PutOp
	for _, s := range starts {
		chunk := data[s:min(s+piece, len(data))]
		ops = append(ops, ep.PutAsync(ctx, dp, mb, off+uint64(s), bytes.Clone(chunk)))
	}
	for i, op := range ops {
		if err := op.Wait(ctx); err != nil {
			return fmt.Errorf("put %d of %d: %w", i+1, len(ops), err)
		}
	}
	fmt.Printf("put %d bytes to %v mailbox %v in %d puts (%s order)\n", len(data), dp, mb, len(ops), map[bool]string{false: "forward", true: "reverse"}[reverse])
	return nil
}
