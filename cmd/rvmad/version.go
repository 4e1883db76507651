package main

import (
	"fmt"
	"io"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/buildinfo"
)

// cmdVersion prints the version line.
func cmdVersion(args []string, stdout, stderr io.Writer) error {
	if err := parseFlags(newFlagSet("version", stderr), args); err != nil {
		return err
	}
	fmt.Fprintln(stdout, buildinfo.String())
	return nil
}
