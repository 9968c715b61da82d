package delegate

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound: no job (or artifact, or sandbox) by that id or name.
	// A *NotFoundError says which.
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
	// ErrConflict: the request is well formed but collides with the state
	// of what it names (ErrInvalidTransition is one).
	ErrConflict = errors.New("conflict")
	// ErrUnavailable: something delegate needs (the sandbox backend, the
	// store) does not answer now; the same request may work later.
	ErrUnavailable = errors.New("unavailable")
)

// Kind is what sort of failure an error is, which is all an adapter needs
// to answer it: an HTTP status, an MCP tool message, an exit code. Each
// adapter keeps one small table from Kind to its answer.
type Kind uint8

const (
	// KindInternal is an error of no kind of ours: a bug, or a dependency
	// failing in its own words (SQL, the Proxmox API). Adapters log it in
	// full and tell their caller only what failed and what to do.
	KindInternal Kind = iota
	KindNotFound
	KindInvalid
	KindNotFinished
	KindTerminal
	KindUnauthenticated
	KindForbidden
	KindConflict
	KindUnavailable
)

var kindNames = [...]string{"internal", "not found", "invalid", "not finished", "terminal", "unauthenticated",
	"forbidden", "conflict", "unavailable"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// kinds are matched in this order: the first sentinel err wraps decides.
var kinds = []struct {
	err  error
	kind Kind
}{
	{ErrUnauthenticated, KindUnauthenticated},
	{ErrForbidden, KindForbidden},
	{ErrNotFound, KindNotFound},
	{ErrTerminal, KindTerminal},
	{ErrNotFinished, KindNotFinished},
	{ErrInvalidTransition, KindConflict},
	{ErrConflict, KindConflict},
	{ErrInvalid, KindInvalid},
	{ErrUnavailable, KindUnavailable},
}

// ParseKind is the kind named name (its String); KindInternal for a name
// of no kind.
func ParseKind(name string) Kind {
	for k, n := range kindNames {
		if n == name {
			return Kind(k)
		}
	}
	return KindInternal
}

// Sentinel is the error of this package that errors of kind k wrap (nil
// for KindInternal): an error that crossed to another process by its kind
// (a forwarded command's refusal) is made to wrap it again there.
func (k Kind) Sentinel() error {
	for i := len(kinds) - 1; i >= 0; i-- { // ErrConflict before ErrInvalidTransition
		if kinds[i].kind == k {
			return kinds[i].err
		}
	}
	return nil
}

// ErrorKind classifies err by the sentinel of this package it wraps;
// KindInternal when it wraps none (and for nil, which is no failure to
// classify: check err first).
func ErrorKind(err error) Kind {
	if err == nil {
		return KindInternal
	}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.kind
		}
	}
	return KindInternal
}

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

// NotFoundError says what was not found, so that the caller knows which
// of the ids or names it gave is wrong: `job "job-x": not found`,
// `artifact "out.txt" of job job-x: not found`. It wraps ErrNotFound.
type NotFoundError struct {
	// Resource is what was looked for: "job", "artifact".
	Resource string
	// ID is its id or name, as given.
	ID string
	// Of is what it belongs to, as words ("job job-x"); "" for a job.
	Of string
	// Reason replaces "not found" when there is more to say (an artifact
	// that was listed but not kept: "not kept: larger than …").
	Reason string
	// There, if set, says what does exist instead ("the job's artifacts:
	// out.txt, log.txt"), so that a typo is seen at once.
	There string
}

func (e *NotFoundError) Error() string {
	s := fmt.Sprintf("%s %q", e.Resource, e.ID)
	if e.Of != "" {
		s += " of " + e.Of
	}
	if e.Reason != "" {
		return s + ": " + e.Reason
	}
	if e.There != "" {
		return s + ": not found (" + e.There + ")"
	}
	return s + ": not found"
}

// Unwrap lets errors.Is(err, ErrNotFound) match every NotFoundError.
func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// JobNotFound is the error for a job id that names no job.
func JobNotFound(id string) *NotFoundError { return &NotFoundError{Resource: "job", ID: id} }

// ArtifactNotFound is the error for a name that names no artifact of job.
func ArtifactNotFound(job, name string) *NotFoundError {
	return &NotFoundError{Resource: "artifact", ID: name, Of: "job " + job}
}

// IdempotencyConflictError: an idempotency key was sent again with a
// manifest other than the one it was first sent with. Returning the first
// job would hand the caller the result of work it did not ask for, and
// running the new manifest would break the key's promise, so the
// submission is refused (as payment APIs refuse a key reused with other
// parameters). It wraps ErrConflict.
type IdempotencyConflictError struct {
	Key   string
	JobID string // the job the key was first used for
}

func (e *IdempotencyConflictError) Error() string {
	return fmt.Sprintf("idempotency_key %q was used for job %s with a different manifest: a retry must send the same manifest; "+
		"use a new key for other work (or read job %s)", e.Key, e.JobID, e.JobID)
}

// Unwrap lets errors.Is(err, ErrConflict) match.
func (e *IdempotencyConflictError) Unwrap() error { return ErrConflict }
