package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
)

// Adoption where servers share the store (Config.Leases): the jobs of a
// server whose lease expired are taken over through the store
// (ServerStore.AdoptJobs: a batch at a time, each at its epoch plus one,
// rows another server is adopting skipped), then resumed as after a
// restart (maintenance.resume).

// adoptBatch is how many jobs one store call adopts; resumeAtOnce how
// many of them are taken up at once.
const (
	adoptBatch   = 50
	resumeAtOnce = 8
)

// adoptLeased adopts the jobs of orphans' owners.
func (m *maintenance) adoptLeased(ctx context.Context, orphans []*delegate.Job) {
	l := m.jobs.lease
	if !l.trusted() || l.draining.Load() {
		return // this server may be the dead one (woken from a pause), or leaving
	}
	seen := map[string]bool{}
	var owners []string
	for _, j := range orphans {
		if seen[j.Owner] {
			continue
		}
		seen[j.Owner] = true
		owners = append(owners, j.Owner)
		// A server of this host whose process is gone is dead now, its
		// lease not yet run out: ended, so that the store lets its jobs go.
		if s, ok := l.server(j.Owner); ok && l.sameHost(s, j.Owner) && !l.fallback(j.Owner) && l.now().Before(s.ExpiresAt) {
			if err := m.store.ExpireServer(ctx, j.Owner); err != nil {
				m.log.Warn("end the lease of a server gone from this host", "server", j.Owner, "err", err)
			}
		}
	}
	m.adoptFrom(ctx, owners)
}

// adoptDead adopts the jobs of the servers whose leases have expired (as
// last read): run at every renewal, so that a dead server's jobs go on
// within a lease and a renewal of its death.
func (m *maintenance) adoptDead(ctx context.Context) {
	l := m.jobs.lease
	if l.dead.Load() && !l.stopped.Load() { // lost, not ended: it may register again
		m.rejoin(ctx)
		return
	}
	if !l.trusted() || l.draining.Load() {
		return
	}
	if dead := l.deadOwners(); len(dead) > 0 {
		m.adoptFrom(ctx, dead)
	}
}

// adoptFrom adopts the unfinished jobs of owners, a batch at a time.
func (m *maintenance) adoptFrom(ctx context.Context, owners []string) {
	l := m.jobs.lease
	for len(owners) > 0 && ctx.Err() == nil {
		adopted, err := m.store.AdoptJobs(ctx, m.owner, owners, adoptBatch)
		if err != nil {
			if errors.Is(err, delegate.ErrLeaseLost) {
				l.lose(err.Error())
			} else if ctx.Err() == nil {
				m.log.Warn("adopt jobs", "err", err)
			}
			return
		}
		for _, a := range adopted {
			l.adoptions.Add(1)
			m.log.Info("job adopted from a server whose lease expired", "job", a.Job.ID, "previous_owner", a.From,
				"status", a.Job.Status, "epoch", a.Job.Epoch)
		}
		m.takeUp(ctx, adopted)
		if len(adopted) < adoptBatch {
			return
		}
	}
}

// takeUp holds jobs adopted (or taken back) at their new epochs and
// resumes them, a few at a time: re-attaching is a few calls to the
// backend each (a Proxmox VM's agent), and a dead server's jobs have
// waited a lease already.
func (m *maintenance) takeUp(ctx context.Context, adopted []delegate.Adopted) {
	for _, a := range adopted {
		m.jobs.lease.hold(a.Job.ID, a.Job.Epoch)
		m.jobs.notify(a.Job.ID)
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, resumeAtOnce)
	for _, a := range adopted {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			m.resume(ctx, a.Job, a.From)
		})
	}
	wg.Wait()
}

// rejoin registers this server again once it lost its lease (it was cut
// from the store, or paused, and reaches the store again), and once it
// has let go of every job it gave up (so that no run of before writes
// beside the one it takes back): a new lease, and of its jobs those no
// other server adopted meanwhile taken back at their next epoch and
// resumed as adopted ones; those another adopted stay the adopter's, its
// writes of before refused by their epochs.
func (m *maintenance) rejoin(ctx context.Context) {
	if len(m.runs.driven()) > 0 {
		return
	}
	l := m.jobs.lease
	t0 := time.Now()
	srv, back, err := m.store.RejoinServer(ctx, l.me, l.cfg.TTL)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("register again after the lease was lost", "err", err)
		}
		return
	}
	l.rejoined(ctx, t0, srv, len(back))
	m.takeUp(ctx, back)
}

// elsewhere fails an adopted job whose sandbox is a local one on another
// host: no server here can reach it. It says whether it did.
func (m *maintenance) elsewhere(ctx context.Context, job *delegate.Job, from string) bool {
	l := m.jobs.lease
	if l == nil || job.Backend != "local" || job.Status == delegate.StatusPending || l.onThisHost(from) {
		return false
	}
	_, host := l.hostOf(from)
	here, _ := os.Hostname()
	reason := fmt.Sprintf("its server %s on host %s stopped, and a local sandbox can be taken over only on its own host "+
		"(this server is on %s, host id %s): run local jobs again, or use a backend every server reaches (Proxmox)",
		from, host, here, l.me.HostID)
	m.log.Warn("failing an adopted local job of another host", "job", job.ID, "previous_owner", from)
	m.end.finish(job.ID, delegate.StatusFailed, reason, nil)
	return true
}

// retry queues again a job caught provisioning whose command provably
// never started (no start token was recorded), once: its half-made
// sandbox is rolled back first. It says whether it did.
func (m *maintenance) retry(ctx context.Context, job *delegate.Job) bool {
	if m.jobs.lease == nil || job.Manifest.Sandbox != "" || job.StartToken != "" || job.Attempts >= 2 {
		return false
	}
	if job.SandboxID != "" {
		m.end.rollback(job.ID, job.SandboxID)
	}
	if job.Sandbox != "" {
		m.keeper.end(ctx, job.Sandbox, delegate.SandboxGone, "the job that made it was interrupted while it was provisioned; it is provisioned again")
	}
	_, err := m.jobs.update(ctx, job.ID, func(j *delegate.Job) error {
		if j.Status != delegate.StatusProvisioning {
			return errSkip
		}
		j.Status, j.SandboxID, j.ExecID, j.Sandbox = delegate.StatusPending, "", "", ""
		j.Progress = "queued again: its server stopped before its command started"
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			m.log.Warn("queue an interrupted job again", "job", job.ID, "err", err)
		}
		return errors.Is(err, errSkip)
	}
	m.log.Info("job interrupted while provisioning queued again (its command never started)", "job", job.ID, "attempts", job.Attempts)
	m.sched.enqueue(job.ID)
	return true
}

// interrupted is why a job caught provisioning that is not retried fails.
func (m *maintenance) interrupted(job *delegate.Job) string {
	switch {
	case m.jobs.lease == nil || job.Manifest.Sandbox != "":
		return "the server stopped while the sandbox was being provisioned; submit the job again"
	case job.StartToken != "":
		return "its server stopped while the command was being started: it may have started, so it is not started twice; submit the job again"
	default:
		return fmt.Sprintf("its servers stopped while it was provisioned, %d times: it is not tried again; submit the job again", job.Attempts)
	}
}

// PoolKeeper says whether this server keeps the warm pool: always when it
// is alone on its store; where servers share it, while it holds the
// pool's term (asked for from the first call on).
func (e *Engine) PoolKeeper() bool {
	if e.leases == nil {
		return true
	}
	e.leases.wantPool.Store(true)
	return e.leases.pool.Load() && e.leases.trusted()
}

// keptElsewhere refuses a command for a local kept sandbox on another
// host: only a server on its host reaches it. A holder this server has not
// seen yet (it started since the last renewal) is looked up in the store. The error names the server
// that holds it, and where it serves (field names what the client gave:
// manifest.sandbox, sandbox_id); holder is that server while its lease is
// live (a command may be forwarded to it), nil when it is gone.
func keptElsewhere(ctx context.Context, l *leaser, sb *delegate.Sandbox, field string) (holder *delegate.Server, refusal *delegate.FieldError) {
	if l == nil || sb.Backend != "local" || sb.Owner == "" || sb.Owner == l.me.ID {
		return nil, nil
	}
	srv, ok := l.server(sb.Owner)
	if !ok {
		// A server that started since the last renewal read the leases.
		l.refresh(ctx)
		srv, ok = l.server(sb.Owner)
	}
	if l.onThisHost(sb.Owner) {
		return nil, nil
	}
	switch {
	case !ok || !l.alive(sb.Owner):
		_, host := l.hostOf(sb.Owner)
		return nil, &delegate.FieldError{Field: field, Rule: fmt.Sprintf(
			"sandbox %s is a local sandbox on host %s, whose server %s is gone: no server here can reach it; open a new sandbox", sb.ID, host, sb.Owner)}
	case srv.Addr != "":
		return &srv, &delegate.FieldError{Field: field, Rule: fmt.Sprintf(
			"sandbox %s is a local sandbox on host %s, held by server %s (%s): send the command to that server", sb.ID, srv.Host, srv.ID, srv.Addr)}
	default:
		return &srv, &delegate.FieldError{Field: field, Rule: fmt.Sprintf(
			"sandbox %s is a local sandbox on host %s, held by server %s: send the command to that server", sb.ID, srv.Host, srv.ID)}
	}
}

// ServerStats is this server's lease and adoptions (zero when it shares
// no store).
func (e *Engine) ServerStats() ServerStats {
	if e.leases == nil {
		return ServerStats{ID: e.owner}
	}
	return e.leases.stats()
}
