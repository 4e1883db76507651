package sysfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// GID is one populated entry of a port's GID table.
type GID struct {
	Index  int    `json:"index"`
	GID    string `json:"gid"`              // as sysfs prints it
	Type   string `json:"type,omitempty"`   // "RoCE v2", "IB/RoCE v1"; empty on InfiniBand
	Netdev string `json:"netdev,omitempty"` // RoCE only
}

const zeroGID = "0000:0000:0000:0000:0000:0000:0000:0000"

// GIDs returns the populated GID entries of dev's port, by index. Empty
// entries (all zeros) are skipped. It fails when the GID table cannot be
// listed; an entry whose type or netdev is unreadable keeps those empty.
func (f FS) GIDs(dev string, port int) ([]GID, error) {
	dir := f.PortDir(dev, port)
	ents, err := os.ReadDir(filepath.Join(dir, "gids"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sysfs: %w", err)
	}
	var out []GID
	for _, e := range ents {
		idx, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		g, err := readAttr(filepath.Join(dir, "gids", e.Name()))
		if err != nil || g == zeroGID || g == "" {
			continue
		}
		t, _ := readAttr(filepath.Join(dir, "gid_attrs", "types", e.Name()))
		nd, _ := readAttr(filepath.Join(dir, "gid_attrs", "ndevs", e.Name()))
		out = append(out, GID{Index: idx, GID: g, Type: t, Netdev: nd})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}
