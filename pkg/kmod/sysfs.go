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
	err := readCounters(dir, "active access", []counterFile{
		{"hooks_armed", &armed}, {"domains", &st.Domains}, {"mrs", &st.MRs}, {"pages", &st.Pages},
		{"entries", &st.Entries}, {"bytes", &st.Bytes}, {"data_bytes", &st.DataBytes},
		{"writes", &st.Writes}, {"reads", &st.Reads}, {"atomics", &st.Atomics},
		{"hidden_writes", &st.HiddenWrites}, {"zeroed_reads", &st.ZeroedReads},
		{"refused_writes", &st.RefusedWrites}, {"refused_atomics", &st.RefusedAtomics},
		{"lost_reads", &st.LostReads}, {"missed", &st.Missed},
	})
	if err != nil {
		return Stats{}, err
	}
	st.HooksArmed = armed != 0
	return st, nil
}

type counterFile struct {
	name string
	v    *uint64
}

// readCounters reads each file of dir into its counter: one decimal value.
func readCounters(dir, what string, files []counterFile) error {
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			return fmt.Errorf("kmod: %s counters: %w", what, err)
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return fmt.Errorf("kmod: %s: %w", filepath.Join(dir, f.name), err)
		}
		*f.v = v
	}
	return nil
}

// MailboxSysfsDir is where the module publishes its counted-mailbox
// counters, one decimal file per MailboxStats field (packets, bytes,
// published, refused, unparsed, nomem, windows, ranges, mrs, translated,
// untranslated).
const MailboxSysfsDir = "/sys/kernel/rdmaplus/rvma"

// MailboxStats are the module-wide counters of the counted mailboxes.
type MailboxStats struct {
	Packets   uint64 // write packets placed into open buffers
	Bytes     uint64 // bytes placed
	Published uint64 // records published
	Refused   uint64 // write packets refused (gate closed, straddling an edge, wrong key, NoMem)
	Unparsed  uint64 // placed packets whose opcode was not found: must stay 0
	NoMem     uint64 // first packets refused because their message's key could not be kept (no memory)
	Windows   uint64 // live windows, all processes
	Ranges    uint64 // gated ranges, pending and published
	MRs       uint64 // memory regions with a gated range
	// Translated counts write messages to a mailbox key the module
	// rewrote to their buffer; Untranslated those it could not (no open
	// buffer of their generation, or too long for it), which rxe refused.
	Translated, Untranslated uint64
}

// MailboxStatsFromSysfs reads the counters from MailboxSysfsDir under root
// ("" or "/" for the running system). It returns an error wrapping
// os.ErrNotExist when the module is not loaded or lacks one of the files
// (a module older than this package), or one naming the file that could
// not be parsed.
func MailboxStatsFromSysfs(root string) (MailboxStats, error) {
	return MailboxStatsFromDir(filepath.Join(root, MailboxSysfsDir))
}

// MailboxStatsFromDir reads the counters from dir, the module's mailbox
// counter directory (MailboxSysfsDir, or its place under another sysfs
// mount). Errors as for MailboxStatsFromSysfs.
func MailboxStatsFromDir(dir string) (MailboxStats, error) {
	var st MailboxStats
	err := readCounters(dir, "mailbox", []counterFile{
		{"packets", &st.Packets}, {"bytes", &st.Bytes}, {"published", &st.Published},
		{"refused", &st.Refused}, {"unparsed", &st.Unparsed}, {"nomem", &st.NoMem},
		{"windows", &st.Windows}, {"ranges", &st.Ranges}, {"mrs", &st.MRs},
		{"translated", &st.Translated}, {"untranslated", &st.Untranslated},
	})
	if err != nil {
		return MailboxStats{}, err
	}
	return st, nil
}
