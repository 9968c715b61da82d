package engine

import (
	"context"
	"slices"
	"time"

	"github.com/delegate-dev/delegate"
)

// Where the store tells the processes sharing it which jobs started or
// ended (delegate.JobFeed: PostgreSQL's LISTEN/NOTIFY), a server hears a
// job another server drives end as it commits: its waiters (wait_job, a
// task's result, a progress report) wake at once, not at the next poll.
// The poll stays behind it, every Config.ChangePoll (watchFinishes, and
// each waiter's own read), for a notification lost while the feed's
// connection is down.

// readPoll is how often a waiter reads a job again without a wake-up:
// four polls of the followers' where nothing tells of other processes'
// changes, ChangePoll at least where the store does.
func readPoll(cfg Config, store delegate.Store) time.Duration {
	poll := 4 * cfg.PollInterval
	if _, ok := store.(delegate.JobFeed); ok {
		poll = max(poll, cfg.ChangePoll)
	}
	return poll
}

// listen follows the store's feed until ctx ends, connecting again (each
// wait twice the last, up to retryMax) when it fails.
func (m *maintenance) listen(ctx context.Context, feed delegate.JobFeed) {
	wait, first := retryFirst, true
	for {
		err := feed.FollowJobs(ctx, func() {
			if !first {
				// What changed while it was not listening is not told:
				// the waiters read again.
				m.jobs.notify("")
			}
			first, wait = false, retryFirst
		}, func(id string, status delegate.Status) { m.heard(ctx, id, status) })
		if ctx.Err() != nil {
			return
		}
		m.log.Warn("the store's job feed failed: other servers' changes are read by polling until it is back",
			"err", err, "poll", m.cfg.ChangePoll, "retry in", wait)
		if !sleepCtx(ctx, wait) {
			return
		}
		wait = nextWait(wait)
	}
}

// heard is what another process did to job id (it started running, or
// ended): where this engine drives the job, or indexes its callback
// token, an end is taken as watchFinishes takes it; the job's waiters
// and the watchers are woken.
func (m *maintenance) heard(ctx context.Context, id string, status delegate.Status) {
	if status.Terminal() {
		h := m.runs.handle(id)
		if (h != nil && h.end.Load() == nil) || slices.Contains(m.tokens.ids(), id) {
			if j, err := m.store.GetJob(ctx, id); err == nil && j.Status.Terminal() {
				m.jobs.foreign.Add(1) // callbacks re-read the status of the jobs they index
				m.jobs.ended(j)
			}
		}
	}
	m.jobs.heard(id)
}
