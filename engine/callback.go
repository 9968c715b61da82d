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
	foreign int64 // Engine.foreign when status was read
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
func (e *Engine) indexJob(j *delegate.Job, foreign int64) (*tokenEntry, bool) {
	raw, err := hex.DecodeString(j.TokenHash)
	if err != nil || len(raw) != sha256.Size {
		return nil, false
	}
	ent := &tokenEntry{
		timeline: j.Manifest.StatusMode != delegate.StatusModeSimple,
		redact:   e.redactorFor(j.Manifest),
		status:   j.Status,
		foreign:  foreign,
	}
	copy(ent.hash[:], raw)
	return ent, true
}

// tokenEntry returns the index entry of job id, reading the store for a
// job not indexed yet; nil when the job does not exist or has no token.
func (e *Engine) tokenEntry(ctx context.Context, id string) (*tokenEntry, error) {
	if ent := e.tokens.get(id); ent != nil {
		return ent, nil
	}
	foreign := e.foreign.Load()
	job, err := e.store.GetJob(ctx, id)
	if errors.Is(err, delegate.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ent, ok := e.indexJob(job, foreign)
	if !ok {
		return nil, nil // no token yet: nothing can authenticate
	}
	if !job.Status.Terminal() {
		e.tokens.put(id, ent)
	}
	return ent, nil
}

// currentStatus is the job's status, read again from the store only if a
// job has finished somewhere since it was last read (another process may
// have cancelled this one).
func (e *Engine) currentStatus(ctx context.Context, id string, ent *tokenEntry) (delegate.Status, error) {
	now := e.foreign.Load()
	ent.mu.Lock()
	st, seen := ent.status, ent.foreign
	ent.mu.Unlock()
	if st.Terminal() || seen == now {
		return st, nil
	}
	job, err := e.store.GetJob(ctx, id)
	if err != nil {
		return "", err
	}
	ent.mu.Lock()
	ent.status, ent.foreign = job.Status, now
	ent.mu.Unlock()
	if job.Status.Terminal() {
		e.tokens.forget(id)
	}
	return job.Status, nil
}

// Authenticate implements delegate.JobService.
func (e *Engine) Authenticate(ctx context.Context, id, token string) error {
	_, err := e.authenticate(ctx, id, token)
	return err
}

// authenticate returns the job's token entry if token is its token.
func (e *Engine) authenticate(ctx context.Context, id, token string) (*tokenEntry, error) {
	if token == "" {
		return nil, delegate.ErrUnauthenticated
	}
	sum := sha256.Sum256([]byte(token))
	ent, err := e.tokenEntry(ctx, id)
	if err != nil {
		return nil, err
	}
	if ent == nil {
		return nil, delegate.ErrUnauthenticated // do not tell strangers which ids exist
	}
	if subtle.ConstantTimeCompare(sum[:], ent.hash[:]) != 1 {
		// Do tell a job that it used its own token on another job's
		// endpoint.
		if e.tokens.byHash(sum) {
			return nil, delegate.ErrForbidden
		}
		if others, _, err := e.store.ListJobs(ctx, delegate.JobFilter{TokenHash: hex.EncodeToString(sum[:]), Limit: 1}); err == nil && len(others) == 1 {
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
func (e *Engine) Callback(ctx context.Context, id, token string, rep delegate.Report) (*delegate.Job, error) {
	ent, err := e.authenticate(ctx, id, token)
	if err != nil {
		return nil, err
	}
	status, err := e.currentStatus(ctx, id, ent)
	if err != nil {
		return nil, err
	}
	if status.Terminal() {
		job, err := e.store.GetJob(ctx, id)
		if err != nil {
			return nil, err
		}
		return job, fmt.Errorf("job %s is %s: %w; nothing to report", id, job.Status, delegate.ErrTerminal)
	}
	now := time.Now().UTC()
	switch rep.Kind {
	case delegate.ReportHeartbeat:
		e.progress.report(id, "", nil, ent.timeline, now)
	case delegate.ReportStatus:
		e.progress.report(id, ent.redact.string(clip(rep.Progress)), nil, ent.timeline, now)
	case delegate.ReportComplete:
		return e.complete(ctx, id, ent, rep, now)
	default:
		return nil, fmt.Errorf("%w: unknown report kind %q", delegate.ErrInvalid, rep.Kind)
	}
	job := &delegate.Job{ID: id, Status: status, LastHeartbeat: now}
	e.progress.overlay(job)
	return job, nil
}

// complete records a job's own verdict, durably, before it answers.
func (e *Engine) complete(ctx context.Context, id string, ent *tokenEntry, rep delegate.Report, now time.Time) (*delegate.Job, error) {
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
	e.flushJob(ctx, id)
	job, err := e.update(ctx, id, func(j *delegate.Job) error {
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
	e.ended(id, job.Status)
	// The job's follower sees the terminal status: it lets the process
	// exit on its own for a moment, then stops whatever still runs.
	return job, nil
}

func (e *Engine) redactorFor(m delegate.Manifest) *redactor {
	var values []string
	for _, name := range m.Secrets {
		if v, ok := e.cfg.Secret(name); ok {
			values = append(values, v)
		}
	}
	return newRedactor(values)
}

// checkHeartbeats fails the running jobs this engine drives whose last sign
// of life is older than the threshold, and destroys their sandboxes.
func (e *Engine) checkHeartbeats(ctx context.Context) {
	e.mu.Lock()
	ids := make([]string, 0, len(e.runs))
	for id := range e.runs {
		ids = append(ids, id)
	}
	e.mu.Unlock()
	now := time.Now()
	for _, id := range ids {
		j, err := e.Get(ctx, id)
		if err != nil || j.Status != delegate.StatusRunning {
			continue
		}
		last := j.LastHeartbeat
		if last.IsZero() {
			last = j.StartedAt
		}
		if now.Sub(last) < e.cfg.HeartbeatThreshold {
			continue
		}
		reason := fmt.Sprintf("lost heartbeat: no sign of life for %s (HEARTBEAT_THRESHOLD_SECONDS=%d)",
			now.Sub(last).Round(time.Second), int(e.cfg.HeartbeatThreshold.Seconds()))
		e.log.Warn("job lost its heartbeat", "job", id, "last", last)
		e.finish(id, delegate.StatusFailed, reason, nil)
		e.mu.Lock()
		if r := e.runs[id]; r != nil {
			r.killNow() // the follower kills the process and destroys the sandbox
		}
		e.mu.Unlock()
	}
}
