// Package inventory describes the host's RDMA devices (devices, ports, port
// state, MTU, rate, GIDs and their netdevs, character devices) for
// `rvmad devices`, as a table or as JSON.
package inventory

import (
	"errors"
	"fmt"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sysfs"
)

// Inventory is every RDMA device of a host.
type Inventory struct {
	Devices []Device `json:"devices"`
}

// Device is one RDMA device.
type Device struct {
	sysfs.DeviceInfo
	Ports       []Port   `json:"ports"`
	CharDevices []string `json:"char_devices"`
}

// Port is one port and its populated GIDs.
type Port struct {
	sysfs.PortInfo
	GIDs []sysfs.GID `json:"gids"`
}

// Read builds the inventory of the sysfs at fs. It fails with
// sysfs.ErrNoRDMA when there is no RDMA subsystem; a device or port that
// cannot be read is left out and reported in the error (joined), next to
// everything that could be read.
func Read(fs sysfs.FS) (Inventory, error) {
	inv := Inventory{Devices: []Device{}}
	names, err := fs.Devices()
	if err != nil {
		return inv, err
	}
	var errs []error
	for _, name := range names {
		info, err := fs.Device(name)
		if err != nil {
			errs = append(errs, err)
			if errors.Is(err, sysfs.ErrNoDevice) {
				continue // vanished meanwhile
			}
		}
		d := Device{DeviceInfo: info, Ports: []Port{}, CharDevices: fs.CharDevices(name)}
		if d.CharDevices == nil {
			d.CharDevices = []string{}
		}
		ports, err := fs.Ports(name)
		if err != nil {
			errs = append(errs, err)
		}
		for _, p := range ports {
			pi, err := fs.Port(name, p)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s port %d: %w", name, p, err))
				continue
			}
			pi.Rate, pi.RateBytes, err = fs.PortRate(name, p)
			if err != nil && pi.Rate == "" {
				errs = append(errs, fmt.Errorf("%s port %d: %w", name, p, err))
			}
			gids, err := fs.GIDs(name, p)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s port %d: %w", name, p, err))
			}
			if gids == nil {
				gids = []sysfs.GID{}
			}
			d.Ports = append(d.Ports, Port{PortInfo: pi, GIDs: gids})
		}
		inv.Devices = append(inv.Devices, d)
	}
	return inv, errors.Join(errs...)
}
