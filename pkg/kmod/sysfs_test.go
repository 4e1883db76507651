package kmod

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestStatsFromSysfs(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, SysfsDir)
	if _, err := StatsFromSysfs(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("without the module: %v", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, n := range []string{"hooks_armed", "domains", "mrs", "pages", "entries", "bytes", "data_bytes",
		"writes", "reads", "atomics", "hidden_writes", "zeroed_reads", "refused_writes", "refused_atomics",
		"lost_reads", "missed"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(string(rune('0'+i%10))+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, err := StatsFromSysfs(root)
	if err != nil {
		t.Fatal(err)
	}
	if st.HooksArmed || st.Domains != 1 || st.Pages != 3 || st.RefusedWrites != 2 || st.Missed != 5 {
		t.Fatalf("%+v", st)
	}
	os.WriteFile(filepath.Join(dir, "pages"), []byte("x\n"), 0o644)
	if _, err := StatsFromSysfs(root); err == nil {
		t.Fatal("garbage accepted")
	}
}

func TestMailboxStatsFromSysfs(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, MailboxSysfsDir)
	if _, err := MailboxStatsFromSysfs(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("without the module: %v", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, n := range []string{"packets", "bytes", "published", "refused", "unparsed", "nomem", "windows", "ranges", "mrs", "translated", "untranslated"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, err := MailboxStatsFromSysfs(root)
	if err != nil {
		t.Fatal(err)
	}
	if st != (MailboxStats{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}) {
		t.Fatalf("%+v", st)
	}
	os.WriteFile(filepath.Join(dir, "ranges"), []byte("x\n"), 0o644)
	if _, err := MailboxStatsFromSysfs(root); err == nil {
		t.Fatal("garbage accepted")
	}
}
