//go:build !linux

package handoff

import (
	"context"
	"log/slog"
)

// Try hands nothing off on this system: the commands run in process.
func Try([]string) (int, bool) { return 0, false }

// Handler: see server_linux.go.
type Handler func(ctx context.Context, r *Request) (code int, declined bool)

// Server: no hand-off socket on this system.
type Server struct{}

// Listen serves no socket on this system.
func Listen(string, *slog.Logger) (*Server, error) { return nil, nil }

// Serve: see server_linux.go.
func (*Server) Serve(context.Context, Handler) error { return nil }
