package kmod

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SysfsDir is where the module publishes its Active Access counters, one
// decimal file per Stats field (hooks_armed, domains, mrs, pages, entries,
// bytes, data_bytes, writes, reads, atomics, hidden_writes, zeroed_reads,
// refused_writes, refused_atomics, lost_reads, missed).
const SysfsDir = "/sys/kernel/rdmaplus/aa"

// StatsFromSysfs reads the counters from SysfsDir under root ("" or "/"
// for the running system, a fixture tree in tests) without opening the
// device. It returns an error wrapping os.ErrNotExist when the module is
// not loaded, or one naming the file that could not be parsed.
func StatsFromSysfs(root string) (Stats, error) {
	return StatsFromDir(filepath.Join(root, SysfsDir))
}

// StatsFromDir reads the counters from dir, the module's counter
// directory (SysfsDir, or its place under another sysfs mount). Errors as
// for StatsFromSysfs.
func StatsFromDir(dir string) (Stats, error) {
	var st Stats
	var armed uint64
	for _, f := range []struct {
		name string
		v    *uint64
	}{
		{"hooks_armed", &armed}, {"domains", &st.Domains}, {"mrs", &st.MRs}, {"pages", &st.Pages},
		{"entries", &st.Entries}, {"bytes", &st.Bytes}, {"data_bytes", &st.DataBytes},
		{"writes", &st.Writes}, {"reads", &st.Reads}, {"atomics", &st.Atomics},
		{"hidden_writes", &st.HiddenWrites}, {"zeroed_reads", &st.ZeroedReads},
		{"refused_writes", &st.RefusedWrites}, {"refused_atomics", &st.RefusedAtomics},
		{"lost_reads", &st.LostReads}, {"missed", &st.Missed},
	} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			return Stats{}, fmt.Errorf("kmod: active access counters: %w", err)
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return Stats{}, fmt.Errorf("kmod: %s: %w", filepath.Join(dir, f.name), err)
		}
		*f.v = v
	}
	st.HooksArmed = armed != 0
	return st, nil
}
