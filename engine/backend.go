package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/delegate-dev/delegate/sandbox"
)

// backendRef holds the engine's backend, or opens it with
// Config.OpenBackend when the engine was made without one (a command-line
// tool that only needs it to stop an orphaned job).
type backendRef struct {
	open func(ctx context.Context) (sandbox.Backend, error)

	mu   sync.Mutex
	b    sandbox.Backend
	mine bool // b was opened here, and is closed here
}

// close closes the backend if this engine opened it itself.
func (br *backendRef) close() error {
	br.mu.Lock()
	defer br.mu.Unlock()
	if br.mine && br.b != nil {
		return br.b.Close()
	}
	return nil
}

// get returns the backend, nil if there is none (yet).
func (br *backendRef) get() sandbox.Backend {
	br.mu.Lock()
	defer br.mu.Unlock()
	return br.b
}

// opened returns the backend, opening it if need be.
func (br *backendRef) opened(ctx context.Context) (sandbox.Backend, error) {
	if b := br.get(); b != nil {
		return b, nil
	}
	if br.open == nil {
		return nil, errors.New("this engine has no sandbox backend")
	}
	b, err := br.open(ctx)
	if err != nil {
		return nil, fmt.Errorf("open the sandbox backend: %w", err)
	}
	br.mu.Lock()
	defer br.mu.Unlock()
	if br.b == nil {
		br.b, br.mine = b, true
	} else {
		b.Close() // another call opened one first
	}
	return br.b, nil
}
