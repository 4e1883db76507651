package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/config"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/inventory"
	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sysfs"
)

// cmdDevices prints the RDMA inventory. Parts that cannot be read are
// reported on stderr and make the exit status 1, after printing the rest.
func cmdDevices(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("devices", stderr)
	asJSON := fs.Bool("json", false, "print JSON instead of tables")
	root := fs.String("sysfs-root", config.DefaultSysfsRoot, "`dir` where sysfs is mounted")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c := config.Default()
	c.SysfsRoot = *root
	if err := config.Validate(c); err != nil {
		return usageError{err}
	}
	inv, err := inventory.Read(sysfs.New(*root))
	if errors.Is(err, sysfs.ErrNoRDMA) {
		return err
	}
	var werr error
	if *asJSON {
		werr = inventory.WriteJSON(stdout, inv)
	} else {
		werr = inventory.WriteTable(stdout, inv)
	}
	if werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("inventory incomplete: %w", err)
	}
	return nil
}
