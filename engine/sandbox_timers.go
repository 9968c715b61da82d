package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// sandboxTimers is the part that keeps the timers of kept sandboxes (a
// tick every Config.SandboxTick): idle past its idle timeout, a sandbox
// is paused (or, on a backend that cannot pause, it goes); paused past
// its pause timeout, or past its lifetime, it goes. It adopts the
// sandboxes of engines that died. Every timer is a time in the store.
type sandboxTimers struct {
	cfg      Config
	log      *slog.Logger
	owner    string
	sbs      delegate.SandboxStore
	ref      *backendRef
	jobs     *jobWriter
	machines *machines
	keeper   sandboxEnder
}

// sandboxEnder is what the timers ask of the keeper: a sandbox ended, or
// recorded gone.
type sandboxEnder interface {
	end(ctx context.Context, id string, state delegate.SandboxState, reason string) (*delegate.Sandbox, bool, error)
	gone(ctx context.Context, sb *delegate.Sandbox, reason string)
}

// tick keeps the timers of the sandboxes this engine keeps, and adopts
// those of engines that died: idle past its idle timeout, a sandbox is
// paused (or, on a backend that cannot pause, it goes); paused past its
// pause timeout, or past its lifetime, it goes.
func (k *sandboxTimers) tick(ctx context.Context) {
	b := k.ref.get()
	if b == nil {
		return
	}
	live, err := k.sbs.ListSandboxes(ctx, true, delegate.MaxPageSize)
	if err != nil {
		k.log.Warn("list sandboxes", "err", err)
		return
	}
	now := time.Now()
	for _, sb := range live {
		if sb.Backend != b.Name() {
			continue
		}
		if sb.Owner != k.owner {
			if sb.Owner != "" && k.cfg.OwnerAlive(sb.Owner) {
				continue // another live engine keeps its timers
			}
			adopted, err := k.sbs.UpdateSandbox(ctx, sb.ID, func(s *delegate.Sandbox) error {
				if s.Owner != sb.Owner {
					return errSkip
				}
				s.Owner = k.owner
				return nil
			})
			if err != nil {
				continue
			}
			k.log.Info("sandbox adopted", "sandbox", sb.ID, "previous_owner", sb.Owner)
			sb = *adopted
			if _, err := b.Recover(ctx, sb.Instance); errors.Is(err, sandbox.ErrGone) {
				k.keeper.gone(ctx, &sb, "its machine did not survive a server restart")
				continue
			}
		}
		switch {
		case !now.Before(sb.ExpiresAt):
			k.keeper.end(ctx, sb.ID, delegate.SandboxGone, fmt.Sprintf("its lifetime ended at %s", sb.ExpiresAt.Format(time.RFC3339)))
		case sb.State == delegate.SandboxPaused && now.Sub(sb.PausedAt) >= sb.PauseTimeout:
			k.keeper.end(ctx, sb.ID, delegate.SandboxGone, fmt.Sprintf("paused for %s, its pause timeout", sb.PauseTimeout))
		case sb.State == delegate.SandboxIdle && sb.Running == 0 && now.Sub(sb.LastUsedAt) >= sb.IdleTimeout:
			k.pause(ctx, b, &sb)
		}
	}
}

// pause pauses an idle sandbox, or ends it where its backend cannot.
func (k *sandboxTimers) pause(ctx context.Context, b sandbox.Backend, sb *delegate.Sandbox) {
	if !b.Capabilities().Pause {
		k.keeper.end(ctx, sb.ID, delegate.SandboxGone, fmt.Sprintf("idle for %s, its idle timeout (the %s backend cannot pause)", sb.IdleTimeout, b.Name()))
		return
	}
	unlock := k.machines.lock(sb.ID)
	defer unlock()
	// Still idle? A command may have come since the list was read.
	cur, err := k.sbs.GetSandboxUncounted(ctx, sb.ID)
	if err != nil || cur.State != delegate.SandboxIdle || cur.Running > 0 || time.Since(cur.LastUsedAt) < cur.IdleTimeout {
		return
	}
	inst, err := b.Recover(ctx, cur.Instance)
	if err == nil {
		if pz, ok := inst.(sandbox.Pauser); ok {
			err = pz.Pause(ctx)
		}
	}
	if errors.Is(err, sandbox.ErrGone) {
		k.keeper.gone(ctx, cur, "its machine is gone")
		return
	}
	if err != nil {
		k.log.Warn("pause an idle sandbox", "sandbox", sb.ID, "err", err)
		return
	}
	k.sbs.UpdateSandbox(ctx, sb.ID, func(s *delegate.Sandbox) error {
		s.State, s.PausedAt = delegate.SandboxPaused, time.Now().UTC()
		return nil
	})
	k.log.Info("sandbox paused", "sandbox", sb.ID, "idle", cur.IdleTimeout)
	k.jobs.wake()
}
