// Command rvmad is the rdmaplus host daemon. It inventories the host's RDMA
// devices, provisions SoftRoCE links when told to, and exports every port
// counter the kernel offers as Prometheus metrics, with health endpoints.
// Services of later subsystems plug into it (see internal/service).
//
// Usage:
//
//	rvmad [serve] [flags]         run the daemon (the default)
//	rvmad devices [--json]        print the RDMA inventory
//	rvmad lint [--url URL]        lint the metrics with promlint
//	rvmad sockets [--json]        list the connections under the sockets shim
//	rvmad version                 print the version
//
// Exit status: 0 on success and after a clean shutdown, 1 when running
// fails (port in use, missing device, failed provisioning, shutdown over
// time), 2 on a usage or configuration error.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// usageError marks errors that are the operator's input (bad flag, bad
// config): exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches the subcommand and turns errors into a one-line message
// and an exit status; nothing below it panics on operator input.
func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		err = cmdServe(args, stderr)
	case "devices":
		err = cmdDevices(args, stdout, stderr)
	case "lint":
		err = cmdLint(args, stdout, stderr)
	case "sockets":
		err = cmdSockets(args, stdout, stderr)
	case "version":
		err = cmdVersion(args, stdout, stderr)
	case "help":
		fmt.Fprint(stdout, usageText)
		return exitOK
	default:
		fmt.Fprintf(stderr, "rvmad: unknown command %q\n%s", cmd, usageText)
		return exitUsage
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "rvmad %s: %v\n", cmd, err)
		return exitUsage
	}
	if err != nil {
		fmt.Fprintf(stderr, "rvmad %s: %v\n", cmd, err)
		return exitFail
	}
	return exitOK
}

const usageText = `usage:
  rvmad [serve] [flags]    run the daemon (rvmad serve -h for the flags)
  rvmad devices [--json]   print the RDMA device inventory
  rvmad lint [--url URL]   check the metrics with the Prometheus linter
  rvmad sockets [--json]   list the connections of processes under the sockets shim
  rvmad version            print the version
`

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("rvmad "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args and rejects positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	return nil
}
