package rvma

import (
	"errors"
	"sync"
	"testing"
)

func TestMailboxTable(t *testing.T) {
	tb := newMailboxTable[string](3)
	s1, i1, err := tb.Add(0x10, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tb.Add(0x10, "dup"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("duplicate mailbox: %v", err)
	}
	tb.Add(0x20, "b")
	tb.Add(0x30, "c")
	if _, _, err := tb.Add(0x40, "d"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("beyond the limit: %v", err)
	}
	if s, inc, v, ok := tb.Lookup(0x10); !ok || s != s1 || inc != i1 || v != "a" {
		t.Fatal("lookup")
	}
	if mb, _, v, ok := tb.Slot(s1); !ok || mb != 0x10 || v != "a" {
		t.Fatal("slot")
	}
	if tb.Free(s1, i1+1) {
		t.Fatal("freed with the wrong incarnation")
	}
	if !tb.Free(s1, i1) || tb.Free(s1, i1) {
		t.Fatal("free not exactly once")
	}
	if _, _, _, ok := tb.Lookup(0x10); ok {
		t.Fatal("freed mailbox found")
	}
	if _, _, _, ok := tb.Slot(s1); ok {
		t.Fatal("freed slot found")
	}
	s4, i4, err := tb.Add(0x40, "d")
	if err != nil || s4 != s1 || i4 != i1+1 {
		t.Fatalf("slot %d incarnation %d: a reused slot must get a new incarnation", s4, i4)
	}
	if _, _, _, ok := tb.Slot(99); ok || tb.Free(99, 0) {
		t.Fatal("slot out of range")
	}
	if tb.Len() != 3 || Mailbox(0x11FF0011).String() != "0x11ff0011" {
		t.Fatal("len or string")
	}
}

func TestMailboxTableConcurrent(t *testing.T) {
	tb := newMailboxTable[int](0)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				mb := Mailbox(g<<20 | i)
				s, inc, err := tb.Add(mb, i)
				if err != nil {
					t.Error(err)
					return
				}
				if _, _, v, ok := tb.Lookup(mb); !ok || v != i {
					t.Errorf("lookup %v", mb)
					return
				}
				if i%2 == 0 && !tb.Free(s, inc) {
					t.Error("free")
					return
				}
			}
		}()
	}
	wg.Wait()
	if tb.Len() != 8*250 {
		t.Fatalf("%d windows", tb.Len())
	}
}
