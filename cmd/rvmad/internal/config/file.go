package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
)

// ErrUnknownField is wrapped by the error LoadFile returns for a key the
// config file must not have (usually a typo).
var ErrUnknownField = errors.New("unknown field")

// LoadFile reads the JSON config file at path over base and returns the
// result; keys absent from the file keep base's values. It fails when the
// file cannot be read, is not a JSON object, has an unknown key, or a key
// whose value has the wrong type; the error names the file and the key.
// LoadFile does not validate values: call Validate.
func LoadFile(path string, base Config) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return base, fmt.Errorf("config file: %w", err)
	}
	cfg, err := Parse(data, base)
	if err != nil {
		return base, fmt.Errorf("config file %s: %w", path, err)
	}
	return cfg, nil
}

// Parse is LoadFile on bytes already read.
func Parse(data []byte, base Config) (Config, error) {
	cfg := base.Clone()
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return base, fmt.Errorf("not a JSON object: %w", describeJSONError(data, err))
	}
	if raw == nil {
		return base, errors.New("not a JSON object: null")
	}
	fields := map[string]any{
		"listen":                &cfg.Listen,
		"log_level":             &cfg.LogLevel,
		"log_format":            &cfg.LogFormat,
		"sysfs_root":            &cfg.SysfsRoot,
		"devices":               &cfg.Devices,
		"rxe":                   &cfg.RXE,
		"remove_created_links":  &cfg.RemoveCreatedLinks,
		"shutdown_timeout":      &cfg.ShutdownTimeout,
		"jbmt_pin_budget_pages": &cfg.JBMTPinBudgetPages,
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		dst, ok := fields[k]
		if !ok {
			return base, fmt.Errorf("field %q: %w (known: %s)", k, ErrUnknownField, knownKeys(fields))
		}
		if k == "rxe" {
			if err := decodeRXE(raw[k], &cfg.RXE); err != nil {
				return base, fmt.Errorf("field %q: %w", k, err)
			}
			continue
		}
		if err := json.Unmarshal(raw[k], dst); err != nil {
			return base, fmt.Errorf("field %q: %w", k, describeJSONError(raw[k], err))
		}
	}
	return cfg, nil
}

// decodeRXE reads the rxe list strictly, so a misspelt "netdev" is an error
// rather than an empty value.
func decodeRXE(raw json.RawMessage, dst *[]RXELink) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var links []RXELink
	if err := dec.Decode(&links); err != nil {
		return describeJSONError(raw, err)
	}
	*dst = links
	return nil
}

func knownKeys(fields map[string]any) string {
	ks := make([]string, 0, len(fields))
	for k := range fields {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}

// describeJSONError adds the line number to syntax errors.
func describeJSONError(data []byte, err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		line := 1 + bytes.Count(data[:min(int(se.Offset), len(data))], []byte("\n"))
		return fmt.Errorf("line %d: %w", line, err)
	}
	return err
}
