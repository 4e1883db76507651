package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sockets"
)

// cmdSockets lists the connections of processes under the sockets shim,
// as the running rvmad reads them from their statistics segments: the
// caller's own processes, or every process for root (rvmad tells them
// apart by the credentials of the Unix socket). It fails when rvmad's
// sockets broker cannot be reached.
func cmdSockets(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sockets", stderr)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	path := fs.String("socket", config.DefaultSocketsSocket, "`path` of rvmad's sockets Unix socket (sockets.socket)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	conns, err := sockets.List(*path)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if conns == nil {
			conns = []sockets.Conn{}
		}
		return enc.Encode(conns)
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PID\tCOMMAND\tLOCAL\tREMOTE\tSTATE\tPATH\tTCP_IN\tTCP_OUT\tRDMA_IN\tRDMA_OUT\tLAST_REASON\t")
	for _, c := range conns {
		reason := c.LastReason
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t\n", c.PID, c.Comm, c.Local, c.Remote,
			c.State, c.Path, c.TCPIn, c.TCPOut, c.RDMAIn, c.RDMAOut, reason)
	}
	return tw.Flush()
}
