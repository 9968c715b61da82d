package engine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
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

// Callback authenticates a report from a job and applies it. A completion
// moves the job along the state machine only: it can never bring back a
// job that was cancelled or timed out.
func (e *Engine) Callback(ctx context.Context, id, token string, rep delegate.Report) (*delegate.Job, error) {
	if token == "" {
		return nil, delegate.ErrUnauthenticated
	}
	job, err := e.store.GetJob(ctx, id)
	if err != nil {
		if errors.Is(err, delegate.ErrNotFound) {
			return nil, delegate.ErrUnauthenticated // do not tell strangers which ids exist
		}
		return nil, err
	}
	hash := hashToken(token)
	if job.TokenHash == "" || subtle.ConstantTimeCompare([]byte(hash), []byte(job.TokenHash)) != 1 {
		if others, _, err := e.store.ListJobs(ctx, delegate.JobFilter{TokenHash: hash, Limit: 1}); err == nil && len(others) == 1 {
			return nil, delegate.ErrForbidden
		}
		return nil, delegate.ErrUnauthenticated
	}
	if job.Status.Terminal() {
		return job, fmt.Errorf("job %s is %s: %w; nothing to report", id, job.Status, delegate.ErrTerminal)
	}
	redact := e.redactorFor(job.Manifest)
	switch rep.Kind {
	case delegate.ReportHeartbeat:
		e.report(ctx, id, job.Manifest, "", nil)
	case delegate.ReportStatus:
		e.report(ctx, id, job.Manifest, redact.string(clip(rep.Progress)), nil)
	case delegate.ReportComplete:
		status, reason := delegate.StatusSuccess, ""
		if !rep.Success {
			status, reason = delegate.StatusFailed, "the job reported failure"
			if rep.Error != "" {
				reason = "the job reported failure: " + clip(rep.Error)
			}
		}
		result := redact.string(clipResult(rep.Result))
		reason = redact.string(reason)
		now := time.Now().UTC()
		job, err = e.update(ctx, id, func(j *delegate.Job) error {
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
		// The job's follower sees the terminal status: it lets the process
		// exit on its own for a moment, then stops whatever still runs.
		return job, nil
	default:
		return nil, fmt.Errorf("%w: unknown report kind %q", delegate.ErrInvalid, rep.Kind)
	}
	return e.store.GetJob(ctx, id)
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
		j, err := e.store.GetJob(ctx, id)
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
