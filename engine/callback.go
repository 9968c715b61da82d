package engine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
)

// newToken makes a job's callback token and the hash that is stored. The
// token itself exists only in the job's environment.
func newToken() (token, hash string) {
	var b [32]byte
	rand.Read(b[:])
	token = "dlg_" + hex.EncodeToString(b[:])
	return token, hashToken(token)
}

func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// A callback is authenticated against an index of the running jobs'
// token hashes kept in memory; a job this engine has not seen (another
// process — serve, delegate run — sharing the data dir and the callback
// port may have started it) is looked up in the store once and then kept.
// The comparison is constant-time over the SHA-256 of the token.

// tokenEntry is what a callback needs to know about a job, without a store
// read: its token hash, whether it has finished, how to record its reports.
type tokenEntry struct {
	hash     [sha256.Size]byte
	timeline bool // statusMode keeps a timeline
	redact   *redactor

	mu      sync.Mutex
	status  delegate.Status
	foreign int64 // jobWriter.foreign when status was read
}

// callbacks is the part that authenticates and applies what jobs report
// through the callback endpoints, from an index of the running jobs' token
// hashes. It has its own locks (the index's, and one per entry).
type callbacks struct {
	store    delegate.Store
	jobs     *jobWriter
	progress *progressWriter
	secret   func(name string) (string, bool)
	tokens   *tokenIndex
}

type tokenIndex struct {
	mu   sync.RWMutex
	byID map[string]*tokenEntry
}

func newTokenIndex() *tokenIndex { return &tokenIndex{byID: make(map[string]*tokenEntry)} }

func (x *tokenIndex) get(id string) *tokenEntry {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.byID[id]
}

func (x *tokenIndex) put(id string, ent *tokenEntry) {
	x.mu.Lock()
	x.byID[id] = ent
	x.mu.Unlock()
}

func (x *tokenIndex) forget(id string) {
	x.mu.Lock()
	delete(x.byID, id)
	x.mu.Unlock()
}

func (x *tokenIndex) ids() []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	ids := make([]string, 0, len(x.byID))
	for id := range x.byID {
		ids = append(ids, id)
	}
	return ids
}

// byHash finds the job whose token has this hash, among those indexed.
func (x *tokenIndex) byHash(sum [sha256.Size]byte) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, ent := range x.byID {
		if subtle.ConstantTimeCompare(ent.hash[:], sum[:]) == 1 {
			return true
		}
	}
	return false
}

// indexJob makes the index entry of a job that has a token.
func (c *callbacks) indexJob(j *delegate.Job, foreign int64) (*tokenEntry, bool) {
	raw, err := hex.DecodeString(j.TokenHash)
	if err != nil || len(raw) != sha256.Size {
		return nil, false
	}
	ent := &tokenEntry{
		timeline: j.Manifest.StatusMode != delegate.StatusModeSimple,
		redact:   redactorFor(j.Manifest, c.secret),
		status:   j.Status,
		foreign:  foreign,
	}
	copy(ent.hash[:], raw)
	return ent, true
}

// tokenEntry returns the index entry of job id, reading the store for a
// job not indexed yet; nil when the job does not exist or has no token.
func (c *callbacks) tokenEntry(ctx context.Context, id string) (*tokenEntry, error) {
	if ent := c.tokens.get(id); ent != nil {
		return ent, nil
	}
	foreign := c.jobs.foreign.Load()
	job, err := c.store.GetJob(ctx, id)
	if errors.Is(err, delegate.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ent, ok := c.indexJob(job, foreign)
	if !ok {
		return nil, nil // no token yet: nothing can authenticate
	}
	if !job.Status.Terminal() {
		c.tokens.put(id, ent)
	}
	return ent, nil
}

// currentStatus is the job's status, read again from the store only if a
// job has finished somewhere since it was last read (another process may
// have cancelled this one).
func (c *callbacks) currentStatus(ctx context.Context, id string, ent *tokenEntry) (delegate.Status, error) {
	now := c.jobs.foreign.Load()
	ent.mu.Lock()
	st, seen := ent.status, ent.foreign
	ent.mu.Unlock()
	if st.Terminal() || seen == now {
		return st, nil
	}
	job, err := c.store.GetJob(ctx, id)
	if err != nil {
		return "", err
	}
	ent.mu.Lock()
	ent.status, ent.foreign = job.Status, now
	ent.mu.Unlock()
	if job.Status.Terminal() {
		c.tokens.forget(id)
	}
	return job.Status, nil
}

// Authenticate checks a job's token (delegate.CallbackService).
func (c *callbacks) Authenticate(ctx context.Context, id, token string) error {
	_, err := c.authenticate(ctx, id, token)
	return err
}

// authenticate returns the job's token entry if token is its token.
func (c *callbacks) authenticate(ctx context.Context, id, token string) (*tokenEntry, error) {
	if token == "" {
		return nil, delegate.ErrUnauthenticated
	}
	sum := sha256.Sum256([]byte(token))
	ent, err := c.tokenEntry(ctx, id)
	if err != nil {
		return nil, err
	}
	if ent == nil {
		return nil, delegate.ErrUnauthenticated // do not tell strangers which ids exist
	}
	if subtle.ConstantTimeCompare(sum[:], ent.hash[:]) != 1 {
		// Do tell a job that it used its own token on another job's
		// endpoint.
		if c.tokens.byHash(sum) {
			return nil, delegate.ErrForbidden
		}
		if others, _, err := c.store.ListJobs(ctx, delegate.JobFilter{TokenHash: hex.EncodeToString(sum[:]), Limit: 1}); err == nil && len(others) == 1 {
			return nil, delegate.ErrForbidden
		}
		return nil, delegate.ErrUnauthenticated
	}
	return ent, nil
}

// Callback authenticates a report from a job and applies it. A status or a
// heartbeat is coalesced in memory (see progressBuffer) and answered at
// once: the job returned then carries its ID, Status, Progress and
// LastHeartbeat only. A completion is stored before Callback returns, and
// moves the job along the state machine only: it can never bring back a
// job that was cancelled or timed out.
func (c *callbacks) Callback(ctx context.Context, id, token string, rep delegate.Report) (*delegate.Job, error) {
	ent, err := c.authenticate(ctx, id, token)
	if err != nil {
		return nil, err
	}
	status, err := c.currentStatus(ctx, id, ent)
	if err != nil {
		return nil, err
	}
	if status.Terminal() {
		job, err := c.store.GetJob(ctx, id)
		if err != nil {
			return nil, err
		}
		return job, fmt.Errorf("job %s is %s: %w; nothing to report", id, job.Status, delegate.ErrTerminal)
	}
	now := c.jobs.lease.wall() // the store's clock where servers share it: another may judge this heartbeat
	switch rep.Kind {
	case delegate.ReportHeartbeat:
		c.progress.report(id, "", nil, ent.timeline, now)
	case delegate.ReportStatus:
		c.progress.report(id, ent.redact.string(clip(rep.Progress)), nil, ent.timeline, now)
	case delegate.ReportComplete:
		return c.complete(ctx, id, ent, rep, now)
	default:
		return nil, fmt.Errorf("%w: unknown report kind %q", delegate.ErrInvalid, rep.Kind)
	}
	job := &delegate.Job{ID: id, Status: status, LastHeartbeat: now}
	c.progress.overlay(job)
	return job, nil
}

// complete records a job's own verdict, durably, before it answers.
func (c *callbacks) complete(ctx context.Context, id string, ent *tokenEntry, rep delegate.Report, now time.Time) (*delegate.Job, error) {
	status, reason := delegate.StatusSuccess, ""
	if !rep.Success {
		status, reason = delegate.StatusFailed, "the job reported failure"
		if rep.Error != "" {
			reason = "the job reported failure: " + clip(rep.Error)
		}
	}
	result := ent.redact.string(clipResult(rep.Result))
	reason = ent.redact.string(reason)
	// A request cut off by its client must not leave the job half-reported.
	ctx = context.WithoutCancel(ctx)
	c.progress.flushJob(ctx, id)
	job, err := c.jobs.update(notOwner(ctx), id, func(j *delegate.Job) error {
		if j.Status.Terminal() {
			return fmt.Errorf("job %s is %s: %w; nothing to report", id, j.Status, delegate.ErrTerminal)
		}
		if j.Status != delegate.StatusRunning {
			return fmt.Errorf("job %s is %s, not running: %w", id, j.Status, delegate.ErrInvalidTransition)
		}
		j.Status, j.Error, j.Result, j.FinishedAt, j.LastHeartbeat = status, reason, result, now, now
		j.Progress = string(status)
		if rep.ExitCode != nil && j.ExitCode == nil {
			c := *rep.ExitCode
			j.ExitCode = &c
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ent.mu.Lock()
	ent.status = job.Status
	ent.mu.Unlock()
	// The job's follower sees the terminal status: it lets the process
	// exit on its own for a moment, then stops whatever still runs.
	return job, nil
}

func redactorFor(m delegate.Manifest, secret func(string) (string, bool)) *redactor {
	var values []string
	for _, name := range m.Secrets {
		if v, ok := secret(name); ok {
			values = append(values, v)
		}
	}
	return newRedactor(values)
}

// index lets callbacks made with the job's token in (job, as stored, has
// the token's hash).
func (c *callbacks) index(job *delegate.Job) {
	if ent, ok := c.indexJob(job, c.jobs.foreign.Load()); ok {
		c.tokens.put(job.ID, ent)
	}
}
