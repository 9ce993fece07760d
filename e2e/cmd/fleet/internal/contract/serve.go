package contract

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Serve prints the ready line for ln on stdout, then serves h on ln until
// ctx ends: the control endpoint every child process runs.
func Serve(ctx context.Context, stdout io.Writer, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	if err := json.NewEncoder(stdout).Encode(Ready{Control: ln.Addr().String()}); err != nil {
		_ = ln.Close()
		return fmt.Errorf("writing ready line: %w", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving control endpoint: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// WriteJSON answers a control request with v.
func WriteJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
