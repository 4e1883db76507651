package config

import (
	"errors"
	"strings"
	"testing"
)

func TestSocketsDefaults(t *testing.T) {
	c := Default()
	if c.Sockets.Enabled || c.Sockets.Socket != "/run/rvmad/sockets.sock" || c.Sockets.PairingPort != 7473 || c.Sockets.MaxPerUID != DefaultSocketsMaxPerUID {
		t.Fatalf("defaults %+v", c.Sockets)
	}
	if err := Validate(c); err != nil {
		t.Fatal(err)
	}
}

func TestSocketsParse(t *testing.T) {
	c, err := Parse([]byte(`{"sockets": {"enabled": true, "pairing_port": 8000}}`), Default())
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultSockets()
	want.Enabled, want.PairingPort = true, 8000
	if c.Sockets != want {
		t.Fatalf("%+v, want %+v (keys left out keep their defaults)", c.Sockets, want)
	}
	c, err = Parse([]byte(`{"sockets": {"socket": "/tmp/s.sock", "max_registrations_per_uid": 5, "enabled": false}}`), Default())
	if err != nil || c.Sockets.Socket != "/tmp/s.sock" || c.Sockets.MaxPerUID != 5 {
		t.Fatalf("%+v, %v", c.Sockets, err)
	}
}

func TestSocketsParseStrict(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		is   error
	}{
		{`{"sockets": {"enabeld": true}}`, []string{`field "sockets" at enabeld`, "known: enabled, max_registrations_per_uid, pairing_port, socket"}, ErrUnknownField},
		{`{"sockets": {"Enabled": true}}`, []string{`did you mean "enabled"`}, ErrUnknownField},
		{`{"sockets": {"enabled": null}}`, []string{`field "sockets" at enabled`}, ErrNull},
		{`{"sockets": null}`, []string{`field "sockets"`}, ErrNull},
		{`{"sockets": {"pairing_port": 1, "pairing_port": 2}}`, []string{`field "sockets" at pairing_port`}, ErrDuplicateKey},
		{`{"sockets": {"pairing_port": "7473"}}`, []string{`field "sockets"`, "pairing_port"}, nil},
		{`{"sockets": true}`, []string{`field "sockets"`, "want an object"}, nil},
	} {
		_, err := Parse([]byte(tc.in), Default())
		if err == nil {
			t.Errorf("%s accepted", tc.in)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", tc.in, err, w)
			}
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: %v does not wrap %v", tc.in, err, tc.is)
		}
	}
}

func TestSocketsValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Sockets)
		want string
	}{
		{func(s *Sockets) { s.Socket = "run/s.sock" }, `invalid sockets.socket "run/s.sock": want an absolute path`},
		{func(s *Sockets) { s.Socket = "/" + strings.Repeat("a", 107) }, "107 bytes"},
		{func(s *Sockets) { s.PairingPort = 0 }, "invalid sockets.pairing_port"},
		{func(s *Sockets) { s.PairingPort = 65536 }, "invalid sockets.pairing_port"},
		{func(s *Sockets) { s.MaxPerUID = 0 }, "invalid sockets.max_registrations_per_uid"},
		{func(s *Sockets) { s.MaxPerUID = MaxSocketsMaxPerUID + 1 }, "invalid sockets.max_registrations_per_uid"},
	} {
		c := Default()
		tc.edit(&c.Sockets)
		err := Validate(c)
		var fe *FieldError
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &fe) {
			t.Errorf("%+v: %v, want %q", c.Sockets, err, tc.want)
		}
	}
}
