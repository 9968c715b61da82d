package engine

import (
	"time"

	"github.com/delegate-dev/delegate"
)

// Observer hears what this engine does, for metrics. It is called on the
// engine's goroutines: its methods must return at once.
//
// The engine calls it from two places only (one line each), so that the
// job's life stays readable: createSandbox in provision, and jobEnded in
// settle.
type Observer interface {
	// SandboxStarted: the backend created a sandbox in d.
	SandboxStarted(backend string, d time.Duration)
	// JobEnded: a job this engine ran has ended in status, after running
	// for ran (from its start to its end).
	JobEnded(backend string, status delegate.Status, ran time.Duration)
}
