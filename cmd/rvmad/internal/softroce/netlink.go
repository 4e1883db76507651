package softroce

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/sysfs"
)

// Netlink is the real Kernel: RDMA netlink through
// github.com/vishvananda/netlink, parents read from sysfs. Adding and
// deleting links needs CAP_NET_ADMIN.
type Netlink struct {
	FS sysfs.FS
}

// RDMADevices lists the RDMA devices over RDMA netlink (`rdma dev show`).
func (n Netlink) RDMADevices() ([]string, error) {
	links, err := netlink.RdmaLinkList()
	if err != nil {
		return nil, fmt.Errorf("rdma netlink: %w", err)
	}
	names := make([]string, 0, len(links))
	for _, l := range links {
		names = append(names, l.Attrs.Name)
	}
	return names, nil
}

// Parent reads <dev>/parent (rxe and siw have it) and tells rxe from siw by
// its node type: rxe is a CA (1), siw an RNIC (4).
func (n Netlink) Parent(dev string) (string, bool, error) {
	d, err := n.FS.Device(dev)
	if err != nil {
		return "", false, err
	}
	return d.Parent, d.Parent != "" && len(d.NodeType) > 0 && d.NodeType[0] == '1', nil
}

// NetdevExists asks rtnetlink.
func (n Netlink) NetdevExists(netdev string) (bool, error) {
	_, err := netlink.LinkByName(netdev)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("rtnetlink: %w", err)
	}
	return true, nil
}

// AddRXE creates a SoftRoCE link.
func (n Netlink) AddRXE(name, netdev string) error { return netlink.RdmaLinkAdd(name, "rxe", netdev) }

// Del deletes an RDMA link.
func (n Netlink) Del(name string) error { return netlink.RdmaLinkDel(name) }

// addHint explains the usual causes of a refused `rdma link add`.
func addHint(err error) string {
	switch {
	case errors.Is(err, syscall.EPERM):
		return " (rvmad needs CAP_NET_ADMIN to add links)"
	case errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.EINVAL):
		return " (is the rdma_rxe module loaded? modprobe rdma_rxe; without crc32_generic the kernel also answers ENOENT)"
	case errors.Is(err, syscall.EEXIST):
		return " (the netdev already carries an rxe link)"
	}
	return ""
}
