// Package logging builds rvmad's log/slog logger.
package logging

import (
	"fmt"
	"io"
	"log/slog"
)

// New returns a logger writing format ("text" or "json") to w, at the level
// held by level (changeable later, e.g. on SIGHUP). It fails on an unknown
// format.
func New(w io.Writer, format string, level *slog.LevelVar) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}

// ParseLevel maps debug, info, warn and error to slog levels; it fails on
// anything else.
func ParseLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
}
