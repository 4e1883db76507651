package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// ErrUnknownField is wrapped by the error LoadFile returns for a key the
// config file must not have (usually a typo, or a key in another case).
var ErrUnknownField = errors.New("unknown field")

// ErrNull is wrapped by the error LoadFile returns for a null value: a key
// is either given a value or left out (then it keeps its default).
var ErrNull = errors.New("null is not allowed")

// ErrDuplicateKey is wrapped by the error LoadFile returns for a key given
// twice in the same object.
var ErrDuplicateKey = errors.New("key given twice")

// ErrTrailingData is wrapped by the error LoadFile returns when the file
// has anything but white space after its JSON object.
var ErrTrailingData = errors.New("the file must hold one JSON object and nothing after it")

// LoadFile reads the JSON config file at path over base and returns the
// result; keys absent from the file keep base's values. It fails when the
// file cannot be read, is not exactly one JSON object, has an unknown key
// (keys are case-sensitive, in nested objects too), a key given twice, a
// null, or a key whose value has the wrong type; the error names the file
// and the key. LoadFile does not validate values: call Validate.
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

// rxeKeys are the keys of an element of "rxe", as RXELink's JSON tags.
var rxeKeys = []string{"name", "netdev"}

// Parse is LoadFile on bytes already read.
func Parse(data []byte, base Config) (Config, error) {
	if err := checkStructure(data); err != nil {
		return base, err
	}
	cfg := base.Clone()
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		// checkStructure accepted it, so this does not happen.
		return base, fmt.Errorf("not a JSON object: %w", describeJSONError(data, err))
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
		"sockets":               &cfg.Sockets,
	}
	known := make([]string, 0, len(fields))
	for k := range fields {
		known = append(known, k)
	}
	sort.Strings(known)
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		dst, ok := fields[k]
		if !ok {
			return base, fmt.Errorf("field %q: %w", k, unknownKey(k, known))
		}
		if k == "sockets" {
			if err := decodeSockets(raw[k], &cfg.Sockets); err != nil {
				return base, fmt.Errorf("field %q%w", k, err)
			}
			continue
		}
		if k == "rxe" {
			if err := decodeRXE(raw[k], &cfg.RXE); err != nil {
				return base, fmt.Errorf("field %q%w", k, err)
			}
			continue
		}
		if err := json.Unmarshal(raw[k], dst); err != nil {
			return base, fmt.Errorf("field %q: %w", k, describeJSONError(raw[k], err))
		}
	}
	return cfg, nil
}

// unknownKey explains why key is not one of known (sorted): a key in
// another case gets the right spelling, any other the list of keys.
func unknownKey(key string, known []string) error {
	for _, k := range known {
		if strings.EqualFold(k, key) {
			return fmt.Errorf("%w (keys are case-sensitive: did you mean %q?)", ErrUnknownField, k)
		}
	}
	return fmt.Errorf("%w (known: %s)", ErrUnknownField, strings.Join(known, ", "))
}

// decodeRXE reads the rxe list strictly: encoding/json matches keys without
// regard to case and leaves missing ones empty, so each element's keys are
// checked first against RXELink's. An error begins with the element, as
// " at [i]: ...", to follow the field's name.
func decodeRXE(raw json.RawMessage, dst *[]RXELink) error {
	var elems []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return fmt.Errorf(": want a list of {\"name\", \"netdev\"} objects: %w", describeJSONError(raw, err))
	}
	for i, e := range elems {
		keys := make([]string, 0, len(e))
		for k := range e {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !contains(rxeKeys, k) {
				return fmt.Errorf(" at [%d]: key %q: %w", i, k, unknownKey(k, rxeKeys))
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var links []RXELink
	if err := dec.Decode(&links); err != nil {
		return fmt.Errorf(": %w", describeJSONError(raw, err))
	}
	*dst = links
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// checkStructure walks the tokens of data and fails, naming the place, when
// data is not one JSON object followed by nothing but white space, or when
// any value in it is null or any object has a key twice (encoding/json
// would take null as "keep the default" and the last of two keys without a
// word).
func checkStructure(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err == io.EOF {
		return errors.New("not a JSON object: the file is empty")
	}
	if err != nil {
		return fmt.Errorf("not a JSON object: %w", describeJSONError(data, err))
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("not a JSON object: the file starts with %s", describeToken(tok))
	}
	if err := walkObject(dec, data, ""); err != nil {
		return err
	}
	end := dec.InputOffset()
	tok, err = dec.Token()
	switch {
	case err == io.EOF:
		return nil
	case err != nil:
		return fmt.Errorf("line %d: %w: %w", lineAt(data, end), ErrTrailingData, err)
	default:
		return fmt.Errorf("line %d: %w; found %s", lineAt(data, end), ErrTrailingData, describeToken(tok))
	}
}

// walkObject reads an object's members after its '{' and its '}'. path is
// where the object is: "" for the file's top level, else a top-level key
// followed by indexes and keys.
func walkObject(dec *json.Decoder, data []byte, path string) error {
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return syntaxError(data, path, err)
		}
		key, ok := tok.(string)
		if !ok { // the decoder allows only strings as keys
			return fmt.Errorf("%s: want a key, found %s", where(path), describeToken(tok))
		}
		sub := path + "." + key
		if path == "" {
			sub = key
		}
		if seen[key] {
			return fmt.Errorf("%s: %w", where(sub), ErrDuplicateKey)
		}
		seen[key] = true
		if err := walkValue(dec, data, sub); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return syntaxError(data, path, err)
	}
	return nil
}

// walkValue reads one value at path.
func walkValue(dec *json.Decoder, data []byte, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(data, path, err)
	}
	switch tok {
	case nil:
		if !strings.ContainsAny(path, ".[") {
			return fmt.Errorf("%s: %w (leave the key out for its default)", where(path), ErrNull)
		}
		return fmt.Errorf("%s: %w", where(path), ErrNull)
	case json.Delim('{'):
		return walkObject(dec, data, path)
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if err := walkValue(dec, data, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return syntaxError(data, path, err)
		}
	}
	return nil
}

// where names path in an error: `field "rxe" at [0].name` for a nested
// place, `field "listen"` for a top-level key.
func where(path string) string {
	top, rest := path, ""
	if i := strings.IndexAny(path, ".["); i >= 0 {
		top, rest = path[:i], strings.TrimPrefix(path[i:], ".")
	}
	if rest == "" {
		return fmt.Sprintf("field %q", top)
	}
	return fmt.Sprintf("field %q at %s", top, rest)
}

// syntaxError reports a malformed file with the line of the fault and, when
// known, the field it was in.
func syntaxError(data []byte, path string, err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = errors.New("unexpected end of file")
	}
	err = describeJSONError(data, err)
	if path == "" {
		return fmt.Errorf("not a JSON object: %w", err)
	}
	return fmt.Errorf("%s: %w", where(path), err)
}

func describeToken(tok json.Token) string {
	switch v := tok.(type) {
	case nil:
		return "null"
	case json.Delim:
		return fmt.Sprintf("%q", string(v))
	case string:
		return fmt.Sprintf("the string %q", v)
	default:
		return fmt.Sprintf("%v", v)
	}
}

// lineAt returns the line of the first character that is not white space
// at or after offset.
func lineAt(data []byte, offset int64) int {
	i := min(int(offset), len(data))
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r' || data[i] == '\n') {
		i++
	}
	return 1 + bytes.Count(data[:i], []byte("\n"))
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
