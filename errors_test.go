package delegate

import (
	"errors"
	"fmt"
	"testing"
)

func TestErrorKind(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Kind
	}{
		{JobNotFound("job-x"), KindNotFound},
		{fmt.Errorf("get: %w", ArtifactNotFound("job-x", "a.txt")), KindNotFound},
		{&FieldError{Field: "limit", Rule: "must be positive"}, KindInvalid},
		{fmt.Errorf("job j is ephemeral: %w", ErrInvalid), KindInvalid},
		{fmt.Errorf("job j is running: %w", ErrNotFinished), KindNotFinished},
		{Transition(StatusCancelled, StatusRunning), KindTerminal},
		{Transition(StatusPending, StatusSuccess), KindConflict},
		{fmt.Errorf("x: %w", ErrConflict), KindConflict},
		{ErrUnauthenticated, KindUnauthenticated},
		{ErrForbidden, KindForbidden},
		{fmt.Errorf("proxmox: %w", ErrUnavailable), KindUnavailable},
		{errors.New("sql: database is closed"), KindInternal},
		{fmt.Errorf("submit: %w", errors.New("UNIQUE constraint failed: jobs.id")), KindInternal},
		{nil, KindInternal},
	} {
		if got := ErrorKind(tc.err); got != tc.want {
			t.Errorf("ErrorKind(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	if s := Kind(200).String(); s != "Kind(200)" {
		t.Errorf("an unknown kind prints %q", s)
	}
}

func TestNotFoundSaysWhat(t *testing.T) {
	for _, tc := range []struct {
		err  *NotFoundError
		want string
	}{
		{JobNotFound("job-x"), `job "job-x": not found`},
		{ArtifactNotFound("job-x", "out/a.txt"), `artifact "out/a.txt" of job job-x: not found`},
		{&NotFoundError{Resource: "artifact", ID: "big", Of: "job job-x", Reason: "not kept: larger than the 10 MiB per-file cap"},
			`artifact "big" of job job-x: not kept: larger than the 10 MiB per-file cap`},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%#v: %q, want %q", tc.err, got, tc.want)
		}
		if !errors.Is(tc.err, ErrNotFound) {
			t.Errorf("%q does not wrap ErrNotFound", tc.err)
		}
	}
}
