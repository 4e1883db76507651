package sysfs

import (
	"path/filepath"
	"sync"

	"github.com/Mellanox/rdmamap"
)

// rdmamapMu serialises every use of rdmamap in this process: rdmamap reads
// its sysfs paths from package variables, which withRdmamap repoints at an
// FS's root for the duration of one call. Nothing else in rvmad may call
// rdmamap directly.
var rdmamapMu sync.Mutex

func (f FS) withRdmamap(fn func()) {
	rdmamapMu.Lock()
	defer rdmamapMu.Unlock()
	class, ucm, umad, uverbs := rdmamap.RdmaClassDir, rdmamap.RdmaIbUcmDir, rdmamap.RdmaUmadDir, rdmamap.RdmaUverbsDir
	defer func() {
		rdmamap.RdmaClassDir, rdmamap.RdmaIbUcmDir, rdmamap.RdmaUmadDir, rdmamap.RdmaUverbsDir = class, ucm, umad, uverbs
	}()
	rdmamap.RdmaClassDir = filepath.Join(f.Root, "class", "infiniband")
	rdmamap.RdmaIbUcmDir = filepath.Join(f.Root, "class", "infiniband_cm")
	rdmamap.RdmaUmadDir = filepath.Join(f.Root, "class", "infiniband_mad")
	rdmamap.RdmaUverbsDir = filepath.Join(f.Root, "class", "infiniband_verbs")
	fn()
}

// These run with rdmamapMu held.
func rdmamapDeviceList() []string            { return rdmamap.GetRdmaDeviceList() }
func rdmamapPorts(dev string) []string       { return rdmamap.GetPorts(dev) }
func rdmamapCharDevices(dev string) []string { return rdmamap.GetRdmaCharDevices(dev) }
