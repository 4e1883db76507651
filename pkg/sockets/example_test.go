package sockets_test

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/rdmaplus/rdmaplus/pkg/sockets"
)

// A server and a client in one program. Where both hosts run rvmad with
// its sockets broker and have an RDMA device, the bytes move onto RDMA
// after the connection is made; elsewhere (as here, with no broker at
// the socket named) the connection simply stays on TCP.
func Example() {
	opts := &sockets.Options{Socket: "/nonexistent/sockets.sock", WaitAttach: true}
	l, err := sockets.Listen("tcp4", "127.0.0.1:0", opts)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo until the client shuts its writing
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sockets.Dial(ctx, "tcp4", l.Addr().String(), opts)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	c.Write([]byte("hello over anchored sockets"))
	c.CloseWrite()
	b, err := io.ReadAll(c)
	fmt.Printf("%s (%v)\n", b, err)
	p := c.Path()
	fmt.Println("read:", p.Read, "write:", p.Write, "fallbacks:", c.Stats().Fallbacks)
	// Output:
	// hello over anchored sockets (<nil>)
	// read: tcp write: tcp fallbacks: map[no_daemon:1]
}
