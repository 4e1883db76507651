package verbs_test

import "net/netip"

func netipAddrPort(s string) netip.AddrPort {
	if s == "" {
		return netip.AddrPort{}
	}
	return netip.MustParseAddrPort(s)
}
