package delegate_test

import (
	"testing"

	"github.com/delegate-dev/delegate"
)

// TestExitRule: the exit code is the process's, the reason apart, and
// every reader shows them the same way.
func TestExitRule(t *testing.T) {
	code := func(n int) *int { return &n }
	for _, tc := range []struct {
		status delegate.Status
		exit   *int
		oom    bool
		reason delegate.ExitReason
		text   string
	}{
		{delegate.StatusRunning, nil, false, "", "–"},
		{delegate.StatusSuccess, code(0), false, delegate.ExitReasonExited, "0"},
		{delegate.StatusFailed, code(3), false, delegate.ExitReasonExited, "3"},
		{delegate.StatusFailed, code(139), false, delegate.ExitReasonExited, "139"}, // a crash: the error names the signal
		{delegate.StatusFailed, code(137), true, delegate.ExitReasonOOM, "137 (oom)"},
		{delegate.StatusTimeout, code(137), false, delegate.ExitReasonTimeout, "137 (timeout)"},
		{delegate.StatusCancelled, code(137), false, delegate.ExitReasonCancelled, "137 (cancelled)"},
		{delegate.StatusCancelled, nil, false, delegate.ExitReasonCancelled, "– (cancelled)"}, // before it started
		{delegate.StatusFailed, nil, false, delegate.ExitReasonNone, "–"},                     // the sandbox failed
	} {
		r := delegate.ExitReasonOf(tc.status, tc.exit, tc.oom)
		if r != tc.reason || delegate.ExitText(tc.exit, r) != tc.text {
			t.Errorf("%s %v oom=%v: reason %q text %q; want %q %q", tc.status, tc.exit, tc.oom, r, delegate.ExitText(tc.exit, r), tc.reason, tc.text)
		}
	}
}
