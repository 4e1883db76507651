package kmod

import (
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/kmod/internal/uapi"
)

// The Go mirrors must match the C header byte for byte.
func TestABIMatchesHeader(t *testing.T) {
	eq := func(name string, got, want uintptr) {
		t.Helper()
		if got != want {
			t.Errorf("%s: Go %d (%#x), header %d (%#x)", name, got, got, want, want)
		}
	}
	if uapi.ABIVersion != ABIVersion {
		t.Errorf("ABI: Go %d, header %d", ABIVersion, uapi.ABIVersion)
	}
	if uapi.MaxDomains != MaxDomains || uapi.Bits != 0x3f {
		t.Errorf("limits: %d domains, bits %#x", uapi.MaxDomains, uapi.Bits)
	}
	if uapi.Adaptive != notifyAdaptive || uint64(uapi.IntervalMax) != uint64(time.Hour/time.Microsecond) {
		t.Errorf("notify: adaptive flag %#x, interval max %d µs", uapi.Adaptive, uapi.IntervalMax)
	}
	eq("sizeof version", unsafe.Sizeof(rawVersion{}), uapi.SizeVersion)
	eq("sizeof create", unsafe.Sizeof(rawCreate{}), uapi.SizeCreate)
	eq("sizeof domain", unsafe.Sizeof(rawDomain{}), uapi.SizeDomain)
	eq("sizeof notify", unsafe.Sizeof(rawNotify{}), uapi.SizeNotify)
	eq("sizeof arm", unsafe.Sizeof(rawArm{}), uapi.SizeArm)
	eq("sizeof stats", unsafe.Sizeof(rawStats{}), uapi.SizeStats)
	eq("sizeof entry", unsafe.Sizeof(rawEntry{}), uapi.SizeEntry)
	eq("entry header", EntryHeader, uapi.SizeEntry)
	eq("ioc version", iocVersion, uapi.IocVersion)
	eq("ioc create", iocDomainCreate, uapi.IocCreate)
	eq("ioc destroy", iocDomainDestroy, uapi.IocDestroy)
	eq("ioc notify", iocNotify, uapi.IocNotify)
	eq("ioc arm", iocArm, uapi.IocArm)
	eq("ioc disarm", iocDisarm, uapi.IocDisarm)
	eq("ioc stats", iocStats, uapi.IocStats)
	eq("ring head", offHead, uapi.OffHead)
	eq("ring head_seq", offHeadSeq, uapi.OffHeadSeq)
	eq("ring refused", offRefused, uapi.OffRefused)
	eq("ring lost", offLost, uapi.OffLost)
	eq("ring tail", offTail, uapi.OffTail)
	eq("entry data_len", unsafe.Offsetof(rawEntry{}.DataLen), uapi.EntryDataLen)
	eq("entry value", unsafe.Offsetof(rawEntry{}.Value), uapi.EntryValue)
}

func TestBitsString(t *testing.T) {
	for b, want := range map[Bits]string{W | R: "W|R", WL | WLD: "WL|WLD", 0: "0x0", R | RLD | 0x40: "R|RLD|0x40"} {
		if got := b.String(); got != want {
			t.Errorf("%#x: %q, want %q", uint32(b), got, want)
		}
	}
}

func TestOpenWithoutModule(t *testing.T) {
	d, err := Open()
	if err == nil {
		d.Close()
		t.Skip("the module is loaded here")
	}
	if !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("Open without the module: %v, want ErrNotLoaded", err)
	}
}
