package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

// TestMaxima: a manifest that asks for more than the operator's maxima
// gets a field error naming the maximum and its setting; one within them
// runs.
func TestMaxima(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{Maxima: engine.Maxima{CPU: 2, MemoryBytes: 8 << 30, DiskBytes: 3 << 29, TimeoutSeconds: 600}})
	timeout := func(n int) *int { return &n }
	for _, tc := range []struct {
		name string
		res  *delegate.Resources
		t    *int
		want string // "" = accepted
	}{
		{"within", &delegate.Resources{CPU: 2, Memory: "8G", Disk: "1536M"}, timeout(600), ""},
		{"defaults", nil, nil, ""},
		{"cpu", &delegate.Resources{CPU: 128}, nil, "manifest.resources.cpu: must be at most 2 cores on this server (DELEGATE_MAX_CPU; got 128)"},
		{"memory", &delegate.Resources{Memory: "1T"}, nil, "manifest.resources.memory: must be at most 8G on this server (DELEGATE_MAX_MEMORY; got 1T)"},
		{"disk", &delegate.Resources{Disk: "2G"}, nil, "manifest.resources.disk: must be at most 1536M on this server (DELEGATE_MAX_DISK; got 2G)"},
		{"timeout", nil, timeout(86400), "manifest.timeout: must be at most 600 seconds on this server (DELEGATE_MAX_TIMEOUT; got 86400)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := script("true")
			m.Resources, m.Timeout = tc.res, tc.t
			j, err := f.eng.Submit(context.Background(), m, delegate.SubmitOptions{})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				f.started().Finish(sandbox.Exit{})
				f.wait(f.eng, j.ID)
				return
			}
			var fe *delegate.FieldError
			if !errors.As(err, &fe) || !errors.Is(err, delegate.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a field error %q", err, tc.want)
			}
		})
	}
}
