// Command jbmtcat serves a file's bytes to peers through JBMT (pkg/jbmt)
// and reads them from another host with gets, like a netcat for one-sided
// reads from memory nobody pinned.
//
// Serve a file (mapped, never read or pinned as a whole: each get pins the
// pages it reads, for as long as it reads them, so the file may be larger
// than the host's memory). It prints the region's token and size, then
// serves until it gets SIGINT or SIGTERM:
//
//	jbmtcat -serve /data/big.img
//	token 0700000001000000c0ffee... size 4294967296
//
// Read it from another host (to standard output, in gets of -chunk
// bytes):
//
//	jbmtcat -get 10.77.0.1 -token 0700000001000000c0ffee... -size 4294967296 > copy.img
//
// jbmtcat exits non-zero with the failing call's error: a wrong or revoked
// token, a range past the region, a peer that is gone.
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/jbmt"
)

func main() {
	serve := flag.String("serve", "", "file to serve")
	get := flag.String("get", "", "IPv4 address of the host to read from")
	token := flag.String("token", "", "get: the region's token, in hex, as -serve prints it")
	size := flag.Int64("size", 0, "get: bytes to read")
	off := flag.Uint64("off", 0, "get: where in the region to start")
	chunk := flag.Int("chunk", 4<<20, "get: bytes per get")
	flag.Parse()
	var err error
	switch {
	case *serve != "" && *get == "":
		err = serveFile(*serve)
	case *get != "" && *serve == "" && *size > 0 && *chunk > 0:
		err = getFile(*get, *token, *off, *size, *chunk)
	default:
		fmt.Fprintln(os.Stderr, "jbmtcat: give -serve FILE, or -get ADDR -token T -size N (see -h)")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "jbmtcat:", err)
		os.Exit(1)
	}
}

func serveFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() == 0 {
		return fmt.Errorf("%s is empty", path)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap %s: %w", path, err)
	}
	defer unix.Munmap(mem)
	s, err := jbmt.Open(nil)
	if err != nil {
		return err
	}
	defer s.Close()
	r, err := s.Register(mem, jbmt.Read)
	if err != nil {
		return err
	}
	defer r.Close()
	tok, _ := r.Token().MarshalBinary()
	fmt.Printf("token %s size %d\n", hex.EncodeToString(tok), len(mem))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	return nil
}

func getFile(addr, token string, off uint64, size int64, chunk int) error {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return fmt.Errorf("-get: %w", err)
	}
	b, err := hex.DecodeString(token)
	if err != nil {
		return fmt.Errorf("-token: %w", err)
	}
	var tok jbmt.Token
	if err := tok.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("-token: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	s, err := jbmt.Open(nil)
	if err != nil {
		return err
	}
	defer s.Close()
	p, err := s.Dial(ctx, netip.AddrPortFrom(a, 0))
	if err != nil {
		return err
	}
	out := bufio.NewWriterSize(os.Stdout, chunk)
	buf := make([]byte, chunk)
	for done := int64(0); done < size; {
		n := int(min(int64(chunk), size-done))
		if _, err := p.Get(ctx, buf[:n], tok, off+uint64(done)); err != nil {
			if errors.Is(err, jbmt.ErrRange) {
				return fmt.Errorf("at %d: %w (is -size right?)", done, err)
			}
			return fmt.Errorf("at %d: %w", done, err)
		}
		if _, err := out.Write(buf[:n]); err != nil {
			return err
		}
		done += int64(n)
	}
	return out.Flush()
}
