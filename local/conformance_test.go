//go:build linux

package local

import (
	"testing"

	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
)

// TestContract runs the sandbox contract's suite against the local
// backend, for real, with the helpers this test binary has (C with cgo;
// CGO_ENABLED=0 runs it with the Go ones).
func TestContract(t *testing.T) {
	canRun(t)
	sandboxtest.Run(t, sandboxtest.Harness{
		New:      func(t *testing.T) sandbox.Backend { return newBackend(t, 0) },
		Commands: true,
		Restart: func(t *testing.T, b sandbox.Backend) sandbox.Backend {
			again, err := New(Config{Dir: b.(*Backend).dir})
			if err != nil {
				t.Fatalf("New over the same directory: %v", err)
			}
			return again
		},
	})
}
