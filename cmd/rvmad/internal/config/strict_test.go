package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseIsStrict feeds Parse the files encoding/json alone would accept
// silently: each must be a one-line error naming the place and wrapping the
// reason.
func TestParseIsStrict(t *testing.T) {
	cases := []struct {
		name, in string
		want     []string // all in the message
		is       error    // wrapped, if not nil
	}{
		{"trailing garbage", `{"log_level":"debug"} }}} not json`, []string{"line 1", "one JSON object and nothing after it"}, ErrTrailingData},
		{"trailing garbage line", "{\"log_level\":\"debug\"}\n\n}}}", []string{"line 3"}, ErrTrailingData},
		{"second object", `{"log_level":"debug"} {"log_level":"error"}`, []string{"one JSON object", `found "{"`}, ErrTrailingData},
		{"second value", `{"log_level":"debug"} 5`, []string{"found 5"}, ErrTrailingData},
		{"null string", `{"log_level": null}`, []string{`field "log_level"`, "null"}, ErrNull},
		{"null bool", `{"remove_created_links": null}`, []string{`field "remove_created_links"`}, ErrNull},
		{"null number", `{"jbmt_pin_budget_pages": null}`, []string{`field "jbmt_pin_budget_pages"`}, ErrNull},
		{"null duration", `{"shutdown_timeout": null}`, []string{`field "shutdown_timeout"`}, ErrNull},
		{"null list", `{"devices": null}`, []string{`field "devices"`}, ErrNull},
		{"null list item", `{"devices": ["rxe0", null]}`, []string{`field "devices" at [1]`}, ErrNull},
		{"null rxe", `{"rxe": null}`, []string{`field "rxe"`}, ErrNull},
		{"null rxe item", `{"rxe": [null]}`, []string{`field "rxe" at [0]`}, ErrNull},
		{"null rxe name", `{"rxe": [{"name": null, "netdev": "eth0"}]}`, []string{`field "rxe" at [0].name`}, ErrNull},
		{"null unknown key", `{"lisen": null}`, []string{`field "lisen"`}, ErrNull},
		{"top key case", `{"Log_Level": "debug"}`, []string{`field "Log_Level"`, `did you mean "log_level"`}, ErrUnknownField},
		{"rxe key case", `{"rxe": [{"Name": "rxe0", "netdev": "eth0"}]}`, []string{`field "rxe" at [0]`, `key "Name"`, `did you mean "name"`}, ErrUnknownField},
		{"rxe key case 2", `{"rxe": [{"name": "rxe0", "netdev": "eth0"}, {"name": "rxe1", "NETDEV": "eth1"}]}`, []string{`field "rxe" at [1]`, `"NETDEV"`}, ErrUnknownField},
		{"rxe key typo", `{"rxe": [{"name": "r", "netdve": "e"}]}`, []string{`field "rxe" at [0]`, `"netdve"`, "known: name, netdev"}, ErrUnknownField},
		{"rxe not a list", `{"rxe": {"name": "r", "netdev": "e"}}`, []string{`field "rxe"`, "want a list"}, nil},
		{"duplicate key", `{"listen": ":1", "listen": ":2"}`, []string{`field "listen"`}, ErrDuplicateKey},
		{"duplicate nested key", `{"rxe": [{"name": "a", "name": "b", "netdev": "e"}]}`, []string{`field "rxe" at [0].name`}, ErrDuplicateKey},
		{"empty file", ``, []string{"empty"}, nil},
		{"unterminated", `{"listen": ":1"`, []string{"not a JSON object", "end of file"}, nil},
		{"bad nested syntax", "{\"rxe\": [\n{\"name\" \"a\"}]}", []string{`field "rxe" at [0]`, "line 2"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.in), Default())
			if err == nil {
				t.Fatalf("accepted: %+v", cfg)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("not one line: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q lacks %q", msg, w)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("%v does not wrap %v", err, tc.is)
			}
			if cfg.LogLevel != DefaultLogLevel || cfg.Listen != DefaultListen {
				t.Errorf("rejected file changed the base: %+v", cfg)
			}
		})
	}
}

// TestParseStrictAcceptsGood checks the strict pass leaves good files alone:
// white space around the object, nested lists, an empty object.
func TestParseStrictAcceptsGood(t *testing.T) {
	for _, in := range []string{
		"\n  {}  \n\n",
		`{"devices": [], "rxe": []}`,
		"{\"rxe\": [{\"name\": \"rxe0\", \"netdev\": \"eth0\"}, {\"netdev\": \"eth1\", \"name\": \"rxe1\"}]}\n",
		`{"log_level": "debug", "remove_created_links": false, "jbmt_pin_budget_pages": 64}`,
	} {
		if _, err := Parse([]byte(in), Default()); err != nil {
			t.Errorf("Parse(%q): %v", in, err)
		}
	}
}

// loadWith parses args into a fresh flag set and runs Load.
func loadWith(t *testing.T, args ...string) (Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	f := BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return f.Load()
}

func TestEmptyFlagValues(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--device", ""}, "flag --device: empty device name"},
		{[]string{"--device", "rxe0,,rxe1"}, `flag --device: empty device name in "rxe0,,rxe1"`},
		{[]string{"--device", "rxe0,"}, "flag --device"},
		{[]string{"--device", "rxe0", "--device", " "}, "flag --device"},
		{[]string{"--rxe", ""}, "flag --rxe: empty"},
		{[]string{"--rxe", "rxe0:eth0,"}, "flag --rxe: empty"},
		{[]string{"--config", ""}, "flag --config: empty file name"},
	}
	for _, tc := range cases {
		_, err := loadWith(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: got %v, want one line with %q", tc.args, err, tc.want)
		}
	}
	// Non-empty values still work, white space around items trimmed.
	cfg, err := loadWith(t, "--device", " rxe0 , mlx5_0", "--device", "mlx5_1")
	if err != nil || strings.Join(cfg.Devices, ",") != "rxe0,mlx5_0,mlx5_1" {
		t.Fatalf("devices %q, %v", cfg.Devices, err)
	}
}

func TestSysfsRootMustExist(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope")
	_, err := loadWith(t, "--sysfs-root", missing)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "sysfs_root" || fe.Flag != "sysfs-root" || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing root: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "--sysfs-root") || !strings.Contains(msg, missing) || strings.Contains(msg, "\n") {
		t.Fatalf("message %q", msg)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadWith(t, "--sysfs-root", file); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("file as root: %v", err)
	}
	// From the config file, the error names the file too.
	p := filepath.Join(dir, "rvmad.json")
	if err := os.WriteFile(p, []byte(`{"sysfs_root": "`+missing+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadWith(t, "--config", p); err == nil || !strings.Contains(err.Error(), "sysfs_root") || !strings.Contains(err.Error(), p) {
		t.Fatalf("missing root in the file: %v", err)
	}
	if _, err := loadWith(t, "--sysfs-root", dir); err != nil {
		t.Fatalf("existing root: %v", err)
	}
}

// TestLoadFileStrict checks the strict errors reach Load with the file's
// name, so the daemon's start and SIGHUP report them.
func TestLoadFileStrict(t *testing.T) {
	p := filepath.Join(t.TempDir(), "rvmad.json")
	if err := os.WriteFile(p, []byte(`{"log_level":"debug"} }}} not json`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := loadWith(t, "--config", p)
	if !errors.Is(err, ErrTrailingData) || !strings.Contains(err.Error(), p) {
		t.Fatalf("got %v", err)
	}
}
