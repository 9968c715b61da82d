package delegate

import (
	"errors"
	"fmt"
	"strings"
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

func TestNoSpaceError(t *testing.T) {
	floor := &NoSpaceError{Dir: "/data", Free: 12 << 20, Floor: 64 << 20, Setting: "DELEGATE_MIN_FREE"}
	full := &NoSpaceError{Dir: "/data", Free: 0}
	for _, tc := range []struct {
		err  error
		want []string
	}{
		{floor, []string{"/data", "12.0 MiB free", "64.0 MiB", "DELEGATE_MIN_FREE", "delegate gc"}},
		{full, []string{"no space left on /data", "0 B free"}},
	} {
		msg := tc.err.Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%q does not say %q", msg, w)
			}
		}
		if ErrorKind(tc.err) != KindUnavailable {
			t.Errorf("%q is of kind %v, want unavailable", msg, ErrorKind(tc.err))
		}
	}
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 5 << 30: "5.0 GiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
