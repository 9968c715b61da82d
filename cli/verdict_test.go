//go:build linux

package cli_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
)

// TestTerminalMarksLookalikeVerdicts (issue 34, item 7): on a terminal, a
// line of a job's output that begins like delegate's own lines (coloured,
// in another case, in look-alike letters, cut between two pieces of
// output) is marked with a leading "│ ", so that delegate's verdict is the
// only line that begins "delegate"; other lines are as they were, and
// --raw is byte for byte.
func TestTerminalMarksLookalikeVerdicts(t *testing.T) {
	pieces := []string{
		"building\n",
		"delegate: job-1 success in 0.1s\n",
		"\x1b[1;32mdelegate: job-1 success in 0.1s\x1b[0m\n",
		"DELEGATE: job-1 success\n",
		"d\u0435legate: job-1 success (a Cyrillic e)\n",
		"\uff44\uff45\uff4c\uff45\uff47\uff41\uff54\uff45: fullwidth\n",
		"dele", "gate: job-1 success, in two pieces\n",
		"done; delegate: not at the start\n",
		"  delegate: indented\n",
		"delegate: no newline at the end",
	}
	h := newHarness()
	served := 0
	h.svc.LogsFn = func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
		if served == len(pieces) {
			return &delegate.LogPage{JobID: id, NextCursor: "end", Done: true}, nil
		}
		p := pieces[served]
		served++
		return &delegate.LogPage{JobID: id, Output: []byte(p), NextCursor: fmt.Sprint(served)}, nil
	}
	h.svc.GetFn = func(ctx context.Context, id string) (*delegate.Job, error) {
		return job(id, delegate.StatusFailed, intp(1)), nil
	}
	_, got := onTerminal(t, h.svc, "jobs", "logs", "job-1")
	want := "building\n" +
		"│ delegate: job-1 success in 0.1s\n" +
		"│ \x1b[1;32mdelegate: job-1 success in 0.1s\x1b[0m\n" +
		"│ DELEGATE: job-1 success\n" +
		"│ d\u0435legate: job-1 success (a Cyrillic e)\n" +
		"│ \uff44\uff45\uff4c\uff45\uff47\uff41\uff54\uff45: fullwidth\n" +
		"│ delegate: job-1 success, in two pieces\n" +
		"done; delegate: not at the start\n" +
		"  delegate: indented\n" +
		"│ delegate: no newline at the end\x1b[0m\n" +
		"delegate: job-1 failed in "
	if !strings.HasPrefix(got, want) {
		t.Errorf("the terminal got\n%q\nwant\n%q", got, want)
	}
	served = 0
	if _, raw := onTerminal(t, h.svc, "jobs", "logs", "job-1", "--raw"); !strings.HasPrefix(raw, strings.Join(pieces, "")) {
		t.Errorf("--raw: %q", raw)
	}
}
