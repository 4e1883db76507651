// Package server is rvmad's HTTP side: /metrics, /healthz and /readyz.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadyFunc reports readiness: nil when ready, else why not.
type ReadyFunc func(ctx context.Context) error

// Handler returns the HTTP handler: /metrics serves g (errors in single
// collectors do not fail the scrape; they are counted in
// rvmad_scrape_errors_total), /healthz answers 200 while the process
// serves, /readyz 200 when ready() is nil and 503 with the reasons
// otherwise, and / a short index.
func Handler(g prometheus.Gatherer, ready ReadyFunc, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelError),
		ErrorHandling: promhttp.ContinueOnError,
		Timeout:       30 * time.Second,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := ready(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready:\n%v\n", err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<html><head><title>rvmad</title></head><body><h1>rvmad</h1>
<p><a href="/metrics">/metrics</a> <a href="/healthz">/healthz</a> <a href="/readyz">/readyz</a></p></body></html>
`)
	})
	return mux
}

// Server serves the handler on a listener the caller opened (so a port in
// use is reported before anything else starts).
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan error
}

// Listen opens the TCP listener for addr. The error names the address and
// wraps the system's (e.g. syscall.EADDRINUSE).
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s: %w", addr, err)
	}
	return ln, nil
}

// Serve starts serving h on ln in a goroutine.
func Serve(ln net.Listener, h http.Handler, log *slog.Logger) *Server {
	s := &Server{
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      40 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		ln:   ln,
		done: make(chan error, 1),
	}
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	return s
}

// Addr is the address actually listened on (useful with port 0).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Done delivers the error that made Serve stop (nil after Shutdown).
func (s *Server) Done() <-chan error { return s.done }

// Shutdown stops accepting, waits for requests in flight until ctx ends,
// then closes what is left. It returns ctx's error if it had to cut
// requests short.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		s.srv.Close()
		return fmt.Errorf("http shutdown: %w", err)
	}
	return nil
}
