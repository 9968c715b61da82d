package delegate

import "strconv"

// The one rule for a finished job's exit, which every reader follows (the
// MCP result, the CLI's commands, the dashboard):
//
//   - exit_code is the status the job's process ended with, as the kernel
//     reported it: 0–255 when it exited, 128+N when signal N killed it,
//     whoever sent the signal (delegate kills a timed-out or cancelled job
//     with SIGKILL: 137). It is absent when no process ended that delegate
//     saw: the command never started (its sandbox failed), or the end was
//     lost with the sandbox.
//   - exit_reason says why it ended, apart: ExitReason.
//
// A command that ends with a job's status (`delegate run`, `delegate jobs
// result`) maps the two to its own exit status, as timeout(1) and a
// shell do: the exit code when the job exited (or was killed for its
// memory), 124 for a timeout, 130 for a cancel, and 125 when delegate
// failed the job before it had an exit code.
type ExitReason string

const (
	// ExitReasonExited: the process ended on its own; exit_code is its
	// status (above 128, a signal it did not get from delegate, such as a
	// crash: the job's error names it).
	ExitReasonExited ExitReason = "exited"
	// ExitReasonOOM: the kernel killed it at the job's memory limit.
	ExitReasonOOM ExitReason = "oom"
	// ExitReasonTimeout: delegate killed it at the job's timeout.
	ExitReasonTimeout ExitReason = "timeout"
	// ExitReasonCancelled: delegate killed it (or never started it) on
	// request.
	ExitReasonCancelled ExitReason = "cancelled"
	// ExitReasonNone: there is no exit status: the command never started
	// (its sandbox failed) or its end was lost; the job's error says why.
	ExitReasonNone ExitReason = "none"
)

// ExitReasonOf is the reason of a job that ended with status, exit code
// and OOM flag; "" for a job that has not ended.
func ExitReasonOf(status Status, exitCode *int, oomKilled bool) ExitReason {
	switch {
	case !status.Terminal():
		return ""
	case status == StatusTimeout:
		return ExitReasonTimeout
	case status == StatusCancelled:
		return ExitReasonCancelled
	case oomKilled:
		return ExitReasonOOM
	case exitCode == nil:
		return ExitReasonNone
	}
	return ExitReasonExited
}

// ExitText shows an exit code and its reason the way every human-facing
// reader does: "3", "137 (timeout)", "– (cancelled)"; "–" for a job
// that has not ended.
func ExitText(exitCode *int, reason ExitReason) string {
	code := "–"
	if exitCode != nil {
		code = strconv.Itoa(*exitCode)
	}
	if reason == "" || reason == ExitReasonExited || reason == ExitReasonNone && exitCode == nil {
		return code
	}
	return code + " (" + string(reason) + ")"
}
