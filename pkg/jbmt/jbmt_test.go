package jbmt

import (
	"errors"
	"testing"
)

func TestTokenRoundTrip(t *testing.T) {
	in := Token{ID: 0xabcdef, Gen: 7, Key: 0x0123456789abcdef, Rights: Read | Write}
	b, err := in.MarshalBinary()
	if err != nil || len(b) != TokenSize {
		t.Fatalf("MarshalBinary: %d bytes, %v", len(b), err)
	}
	var out Token
	if err := out.UnmarshalBinary(b); err != nil || out != in {
		t.Fatalf("UnmarshalBinary: %+v, %v; want %+v", out, err, in)
	}
}

func TestTokenMalformed(t *testing.T) {
	good, _ := Token{ID: 1, Gen: 1, Key: 1, Rights: Read}.MarshalBinary()
	bad := func(name string, b []byte) {
		t.Helper()
		var tok Token
		if err := tok.UnmarshalBinary(b); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
		if tok != (Token{}) {
			t.Errorf("%s: token changed to %+v", name, tok)
		}
	}
	bad("short", good[:TokenSize-1])
	bad("long", append(append([]byte(nil), good...), 0))
	for _, c := range []struct {
		name string
		tok  Token
	}{
		{"id 0", Token{ID: 0, Rights: Read}},
		{"id beyond the module's", Token{ID: 1 << 24, Rights: Read}},
		{"no rights", Token{ID: 1}},
		{"unknown rights", Token{ID: 1, Rights: 4}},
	} {
		b, _ := c.tok.MarshalBinary()
		bad(c.name, b)
	}
}

func TestAlloc(t *testing.T) {
	if _, err := Alloc(0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Alloc(0): %v", err)
	}
	b, err := Alloc(1 << 30) // no swap reserved: fine on any host
	if err != nil {
		t.Fatal(err)
	}
	b[0], b[len(b)-1] = 1, 2
	if err := Free(b); err != nil {
		t.Fatal(err)
	}
}
