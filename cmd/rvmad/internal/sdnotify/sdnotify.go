// Package sdnotify tells systemd about the daemon's state (Type=notify)
// through $NOTIFY_SOCKET. Outside systemd every call is a no-op.
package sdnotify

import (
	"fmt"
	"net"
	"os"
)

// Notify sends state (e.g. "READY=1", "STOPPING=1") to systemd. It returns
// nil when $NOTIFY_SOCKET is unset and an error when the socket cannot be
// written.
func Notify(state string) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	return nil
}
