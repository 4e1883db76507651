package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
)

// Defaults of the sockets section.
const (
	DefaultSocketsSocket      = "/run/rvmad/sockets.sock"
	DefaultSocketsPairingPort = 7473
	DefaultSocketsMaxPerUID   = 16384
	// MaxSocketsMaxPerUID bounds max_registrations_per_uid: each
	// registration costs the broker about 200 bytes.
	MaxSocketsMaxPerUID = 1 << 20
)

// Sockets configures the sockets service, the broker of sockets over RDMA
// (docs/sockets.md): the config file's "sockets" object.
type Sockets struct {
	// Enabled runs the broker; off, the service does nothing and
	// programs under the shim stay on TCP.
	Enabled bool `json:"enabled"`
	// Socket is the path of the Unix socket local programs use (mode
	// 0666: every user may).
	Socket string `json:"socket"`
	// PairingPort is the TCP port the rvmads of two hosts pair
	// connections over; every host uses the same.
	PairingPort int `json:"pairing_port"`
	// MaxPerUID caps the connections the processes of one user may have
	// registered at once.
	MaxPerUID int `json:"max_registrations_per_uid"`
}

// DefaultSockets returns the sockets section rvmad runs with when told
// nothing: disabled.
func DefaultSockets() Sockets {
	return Sockets{Socket: DefaultSocketsSocket, PairingPort: DefaultSocketsPairingPort, MaxPerUID: DefaultSocketsMaxPerUID}
}

// socketsKeys are the keys of the "sockets" object, as Sockets' JSON tags.
var socketsKeys = []string{"enabled", "max_registrations_per_uid", "pairing_port", "socket"}

// decodeSockets reads the "sockets" object strictly over dst: keys are
// case-sensitive and unknown ones are errors; keys left out keep dst's
// values. An error begins with the place, as " at key: ..." or ": ...",
// to follow the field's name.
func decodeSockets(raw json.RawMessage, dst *Sockets) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return fmt.Errorf(": want an object: %w", describeJSONError(raw, err))
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !contains(socketsKeys, k) {
			return fmt.Errorf(" at %s: %w", k, unknownKey(k, socketsKeys))
		}
	}
	s := *dst
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf(": %w", describeJSONError(raw, err))
	}
	*dst = s
	return nil
}

// validateSockets checks the sockets section's values (also when it is
// disabled, so that enabling it later does not meet an old mistake).
func validateSockets(s Sockets) []error {
	var errs []error
	bad := func(key, value string, err error) {
		errs = append(errs, &FieldError{Field: "sockets." + key, Value: value, Err: err})
	}
	switch {
	case s.Socket == "" || !filepath.IsAbs(s.Socket):
		bad("socket", s.Socket, errors.New("want an absolute path"))
	case len(s.Socket) > 107: // sun_path holds 108 bytes with the NUL
		bad("socket", s.Socket, errors.New("longer than the 107 bytes of a Unix socket path"))
	}
	if s.PairingPort < 1 || s.PairingPort > 65535 {
		bad("pairing_port", fmt.Sprint(s.PairingPort), errors.New("want a port from 1 to 65535"))
	}
	if s.MaxPerUID < 1 || s.MaxPerUID > MaxSocketsMaxPerUID {
		bad("max_registrations_per_uid", fmt.Sprint(s.MaxPerUID), fmt.Errorf("want 1 to %d", MaxSocketsMaxPerUID))
	}
	return errs
}
