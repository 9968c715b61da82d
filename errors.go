package delegate

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound: no job (or sandbox) with that id.
	ErrNotFound = errors.New("not found")
	// ErrInvalidTransition: the state machine forbids the change.
	ErrInvalidTransition = errors.New("invalid status transition")
	// ErrTerminal: the job has finished; its status is final, and a late
	// callback has nothing left to report.
	ErrTerminal = errors.New("job already finished")
	// ErrNotFinished: a result was asked for before the job ended.
	ErrNotFinished = errors.New("job not finished")
	// ErrInvalid: bad input (manifest, config, arguments).
	ErrInvalid = errors.New("invalid input")
	// ErrUnauthenticated: a callback came without a token, or with one no
	// job has.
	ErrUnauthenticated = errors.New("missing or unknown job token")
	// ErrForbidden: a callback's token belongs to another job.
	ErrForbidden = errors.New("token belongs to another job")
)

// FieldError names the field that is wrong and the rule it breaks, so that
// the caller (often an AI agent) knows exactly what to change.
type FieldError struct {
	Field string // JSON path, e.g. "manifest.resources.memory"
	Rule  string // what the value must be, e.g. "must be like 512M or 2G"
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Rule) }

// Unwrap lets errors.Is(err, ErrInvalid) match every field error.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Rule: fmt.Sprintf(format, args...)}
}
