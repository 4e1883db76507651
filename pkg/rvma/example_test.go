package rvma_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/rdmaplus/rdmaplus/pkg/rvma"
	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// deviceAddr returns the IPv4 address of the first RDMA device (the RoCE
// v2 GID at index 1 on rxe): where an endpoint on it listens.
func deviceAddr() netip.Addr {
	dev, err := verbs.Open("")
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()
	gid, err := dev.RoCEv2GID(1, nil)
	if err != nil {
		log.Fatal(err)
	}
	ip, _ := netip.AddrFromSlice(gid.GID.IP().To4())
	return ip
}

// A receiver opens a window on a mailbox, posts a buffer and waits for
// its completion; a sender puts to the mailbox by the receiver's address,
// in two pieces and in reverse order. The sender never sees a buffer
// address or key. (Both endpoints are in this process here; usually they
// are on different hosts.)
func Example_put() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ip := deviceAddr()

	// The receiver.
	rx, err := rvma.Listen(ctx, netip.AddrPortFrom(ip, 7471), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer rx.Close()
	const mailbox = rvma.Mailbox(0x11FF0011)
	w, err := rx.InitWindow(mailbox, &rvma.WindowOptions{Threshold: 11}) // an epoch is 11 bytes
	if err != nil {
		log.Fatal(err)
	}
	mem, err := rx.Alloc(64) // registered memory, off the Go heap
	if err != nil {
		log.Fatal(err)
	}
	p, err := w.Post(ctx, mem, nil)
	if err != nil {
		log.Fatal(err)
	}

	// The sender knows only the receiver's address and the mailbox.
	tx, err := rvma.Listen(ctx, netip.AddrPortFrom(ip, 7472), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Close()
	second := tx.PutAsync(ctx, rx.Addr(), mailbox, 6, []byte("world"))
	if err := tx.Put(ctx, rx.Addr(), mailbox, 0, []byte("hello ")); err != nil {
		log.Fatal(err)
	}
	if err := second.Wait(ctx); err != nil {
		log.Fatal(err)
	}

	// The completion: the buffer's address and true length.
	rec, err := p.Wait(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("epoch %d: %q in %d puts\n", rec.Epoch, p.Bytes()[:rec.Len], rec.Ops)
	// The lab test TestLabExamples checks it prints:
	// epoch 0: "hello world" in 2 puts
}

// Two senders fill every epoch of one window together, as neighbours do
// in a halo exchange, and the window promises each one's share: each
// sender moves to the next epoch once it has put its share, without
// waiting to be told that the epoch completed.
func ExampleWindowOptions_share() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ip := deviceAddr()

	rx, err := rvma.Listen(ctx, netip.AddrPortFrom(ip, 7484), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer rx.Close()
	const mailbox = rvma.Mailbox(0x4A10)
	// An epoch is 10 bytes: 5 from each sender.
	w, err := rx.InitWindow(mailbox, &rvma.WindowOptions{Threshold: 10, Share: 5})
	if err != nil {
		log.Fatal(err)
	}
	mem, err := rx.Alloc(3 * 10)
	if err != nil {
		log.Fatal(err)
	}
	var posted []*rvma.Posted
	for i := 0; i < 3; i++ {
		p, err := w.Post(ctx, mem[i*10:(i+1)*10], nil)
		if err != nil {
			log.Fatal(err)
		}
		posted = append(posted, p)
	}

	// Each sender puts its half of three epochs, without waiting for them.
	var ops []*rvma.PutOp
	for i, half := range []string{"ping ", "pong!"} {
		tx, err := rvma.Listen(ctx, netip.AddrPortFrom(ip, uint16(7485+i)), nil)
		if err != nil {
			log.Fatal(err)
		}
		defer tx.Close()
		for epoch := 0; epoch < 3; epoch++ {
			ops = append(ops, tx.PutAsync(ctx, rx.Addr(), mailbox, uint64(5*i), []byte(half)))
		}
	}
	for _, op := range ops {
		if err := op.Wait(ctx); err != nil {
			log.Fatal(err)
		}
	}
	for _, p := range posted {
		rec, err := p.Wait(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("epoch %d: %q\n", rec.Epoch, p.Bytes()[:rec.Len])
	}
	// The lab test TestLabExamples checks it prints:
	// epoch 0: "ping pong!"
	// epoch 1: "ping pong!"
	// epoch 2: "ping pong!"
}

// A program that owns an endpoint exports its counters with a Collector;
// here one scrape is printed in the Prometheus text format.
func ExampleNewCollector() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ep, err := rvma.Listen(ctx, netip.AddrPortFrom(deviceAddr(), 7473), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer ep.Close()
	if _, err := ep.InitWindow(0x42, &rvma.WindowOptions{}); err != nil {
		log.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(rvma.NewCollector(ep))
	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	enc := expfmt.NewEncoder(os.Stdout, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range families {
		if mf.GetName() == "rvma_window_buffers_posted" {
			if err := enc.Encode(mf); err != nil {
				log.Fatal(err)
			}
		}
	}
}
