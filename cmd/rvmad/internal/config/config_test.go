package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDefaultIsValid(t *testing.T) {
	if err := Validate(Default()); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	cases := []struct {
		name  string
		mod   func(*Config)
		field string
	}{
		{"listen no port", func(c *Config) { c.Listen = "localhost" }, "listen"},
		{"listen bad port", func(c *Config) { c.Listen = ":99999" }, "listen"},
		{"listen bad host", func(c *Config) { c.Listen = "bad host!:80" }, "listen"},
		{"log level", func(c *Config) { c.LogLevel = "verbose" }, "log_level"},
		{"log format", func(c *Config) { c.LogFormat = "xml" }, "log_format"},
		{"sysfs relative", func(c *Config) { c.SysfsRoot = "sys" }, "sysfs_root"},
		{"device slash", func(c *Config) { c.Devices = []string{"a/b"} }, "devices[0]"},
		{"device twice", func(c *Config) { c.Devices = []string{"rxe0", "rxe0"} }, "devices[1]"},
		{"rxe name empty", func(c *Config) { c.RXE = []RXELink{{Name: "", Netdev: "eth0"}} }, "rxe[0].name"},
		{"rxe netdev long", func(c *Config) { c.RXE = []RXELink{{Name: "rxe0", Netdev: "averyveryverylongname"}} }, "rxe[0].netdev"},
		{"rxe netdev twice", func(c *Config) { c.RXE = []RXELink{{"rxe0", "eth0"}, {"rxe1", "eth0"}} }, "rxe[1].netdev"},
		{"rxe name twice", func(c *Config) { c.RXE = []RXELink{{"rxe0", "eth0"}, {"rxe0", "eth1"}} }, "rxe[1].name"},
		{"timeout zero", func(c *Config) { c.ShutdownTimeout = 0 }, "shutdown_timeout"},
		{"timeout huge", func(c *Config) { c.ShutdownTimeout = Duration(time.Hour) }, "shutdown_timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mod(&c)
			err := Validate(c)
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("want a *FieldError, got %v", err)
			}
			if fe.Field != tc.field {
				t.Fatalf("field = %q, want %q (%v)", fe.Field, tc.field, err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("message %q does not name %q", err, tc.field)
			}
		})
	}
}

func TestValidateReportsAllProblems(t *testing.T) {
	c := Default()
	c.LogLevel, c.LogFormat = "x", "y"
	err := Validate(c)
	if !strings.Contains(err.Error(), "log_level") || !strings.Contains(err.Error(), "log_format") {
		t.Fatalf("want both fields named, got %v", err)
	}
}

func TestParse(t *testing.T) {
	cfg, err := Parse([]byte(`{"listen": "127.0.0.1:9999", "rxe": [{"name": "rxe0", "netdev": "eth0"}],
		"remove_created_links": false, "shutdown_timeout": "3s", "devices": ["mlx5_0"]}`), Default())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9999" || len(cfg.RXE) != 1 || cfg.RXE[0] != (RXELink{"rxe0", "eth0"}) ||
		cfg.RemoveCreatedLinks || cfg.ShutdownTimeout.D() != 3*time.Second || cfg.Devices[0] != "mlx5_0" {
		t.Fatalf("parsed %+v", cfg)
	}
	if cfg.LogLevel != DefaultLogLevel {
		t.Fatalf("absent key changed: %+v", cfg)
	}
}

func TestParseErrorsNameTheKey(t *testing.T) {
	cases := map[string]string{
		`{"lisen": ":1"}`:                         `"lisen"`,
		`{"listen": 80}`:                          `"listen"`,
		`{"shutdown_timeout": 10}`:                `"shutdown_timeout"`,
		`{"shutdown_timeout": "ten"}`:             `"shutdown_timeout"`,
		`{"jbmt_pin_budget_pages": -1}`:           `"jbmt_pin_budget_pages"`,
		`{"jbmt_pin_budget_pages": "64"}`:         `"jbmt_pin_budget_pages"`,
		`{"rxe": [{"name": "r", "netdve": "e"}]}`: `"rxe"`,
		"{\n\"listen\": ,}":                       "line 2",
		`[]`:                                      "not a JSON object",
		`null`:                                    "not a JSON object",
	}
	for in, want := range cases {
		_, err := Parse([]byte(in), Default())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%s) = %v, want mention of %s", in, err, want)
		}
	}
	_, err := Parse([]byte(`{"lisen": ":1"}`), Default())
	if !errors.Is(err, ErrUnknownField) {
		t.Errorf("unknown key: %v does not wrap ErrUnknownField", err)
	}
}

func TestFlagsWinOverFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "rvmad.json")
	if err := os.WriteFile(p, []byte(`{"listen": ":1111", "log_level": "debug", "rxe": [{"name":"a","netdev":"b"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	f := BindFlags(fs)
	if err := fs.Parse([]string{"--config", p, "--listen", ":2222", "--rxe", "rxe0:eth0,rxe1:eth1", "--device", "x"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.Load()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != ":2222" || cfg.LogLevel != "debug" || len(cfg.RXE) != 2 || cfg.RXE[1] != (RXELink{"rxe1", "eth1"}) {
		t.Fatalf("got %+v", cfg)
	}
	if got := cfg.RequiredDevices(); strings.Join(got, ",") != "x,rxe0,rxe1" {
		t.Fatalf("RequiredDevices = %v", got)
	}
	// A bad value in the file is reported with the file's name.
	if err := os.WriteFile(p, []byte(`{"log_format": "xml"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = f.Load()
	if err == nil || !strings.Contains(err.Error(), "log_format") || !strings.Contains(err.Error(), p) {
		t.Fatalf("want log_format and %s named, got %v", p, err)
	}
}

func TestBadRXEFlag(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	f := BindFlags(fs)
	if err := fs.Parse([]string{"--rxe", "rxe0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Load(); err == nil || !strings.Contains(err.Error(), "--rxe") {
		t.Fatalf("want --rxe error, got %v", err)
	}
}

func TestMissingConfigFile(t *testing.T) {
	_, err := LoadFile(filepath.Join(t.TempDir(), "nope.json"), Default())
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("want ErrNotExist, got %v", err)
	}
}
