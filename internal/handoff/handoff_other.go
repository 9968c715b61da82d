//go:build !linux

package handoff

import (
	"context"
	"log/slog"
)

// Handler: see server_linux.go.
type Handler func(ctx context.Context, r *Request) (code int, declined bool)

// Server: no hand-off socket on this system.
type Server struct{}

// Listen serves no socket on this system.
func Listen(string, *slog.Logger) (*Server, error) { return nil, nil }

// Serve: see server_linux.go.
func (*Server) Serve(context.Context, Handler) error { return nil }
