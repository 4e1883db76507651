package perftest

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// keyMsgSize is the size of perftest's queue-pair description with a GID
// (KEY_MSG_SIZE_GID): "lid:out_reads:qpn:psn:rkey:vaddr:g0:...:g15:srqn:"
// in hex, NUL-padded.
const keyMsgSize = 108

// dest is perftest's struct pingpong_dest as it crosses the side channel.
type dest struct {
	LID      uint16
	OutReads int
	QPN      uint32
	PSN      uint32
	RKey     uint32
	VAddr    uint64
	GID      verbs.GID
	SRQN     uint32
}

// marshal formats d as perftest does (KEY_PRINT_FMT_GID), padded to
// keyMsgSize bytes.
func (d dest) marshal() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x:", d.LID, d.OutReads, d.QPN, d.PSN, d.RKey, d.VAddr)
	for _, g := range d.GID {
		fmt.Fprintf(&b, "%02x:", g)
	}
	fmt.Fprintf(&b, "%08x:", d.SRQN)
	out := make([]byte, keyMsgSize)
	copy(out, b.String())
	return out
}

// widths are the hex digits of each field of a key message.
var widths = [...]int{4, 4, 6, 6, 8, 16, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 8}

// looksLikeKey reports whether m starts like a perftest queue-pair
// description ("hhhh:hhhh:hhhhhh:"), whatever its length.
func looksLikeKey(m []byte) bool {
	f := bytes.SplitN(m, []byte(":"), 4)
	if len(f) < 4 {
		return false
	}
	for i, w := range widths[:3] {
		if len(f[i]) != w || !isHex(f[i]) {
			return false
		}
	}
	return true
}

// parseDest parses a key message of keyMsgSize bytes.
func parseDest(m []byte) (dest, error) {
	var d dest
	if len(m) != keyMsgSize {
		return d, fmt.Errorf("queue-pair description of %d bytes, want %d (a client without a GID?)", len(m), keyMsgSize)
	}
	text, _, _ := bytes.Cut(m, []byte{0})
	f := strings.Split(string(text), ":")
	if len(f) != len(widths)+1 || f[len(widths)] != "" {
		return d, fmt.Errorf("queue-pair description %q: %d fields, want %d", text, len(f)-1, len(widths))
	}
	v := make([]uint64, len(widths))
	for i, w := range widths {
		if len(f[i]) != w || !isHex([]byte(f[i])) {
			return d, fmt.Errorf("queue-pair description %q: field %d is not %d hex digits", text, i, w)
		}
		v[i], _ = strconv.ParseUint(f[i], 16, 64)
	}
	d = dest{LID: uint16(v[0]), OutReads: int(v[1]), QPN: uint32(v[2]), PSN: uint32(v[3]),
		RKey: uint32(v[4]), VAddr: v[5], SRQN: uint32(v[22])}
	for i := range d.GID {
		d.GID[i] = byte(v[6+i])
	}
	return d, nil
}

func isHex(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return len(b) > 0
}

// parseMTU recognises the MTU message: the port's active MTU as an
// ibv_mtu number (1 for 256 bytes .. 5 for 4096) in decimal, NUL-padded
// to at most 4 bytes.
func parseMTU(m []byte) (verbs.MTU, bool) {
	if len(m) < 2 || len(m) > 4 || m[0] < '1' || m[0] > '5' {
		return 0, false
	}
	for _, c := range m[1:] {
		if c != 0 {
			return 0, false
		}
	}
	return verbs.MTU(m[0] - '0'), true
}

// doneMsg is what each side sends last.
var doneMsg = []byte("done\x00")
