package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/delegate-dev/delegate"
)

// auditor writes the audit trail: who did what that changes something,
// once it has succeeded. The trail is the store's, so every server
// sharing it writes to one. A write that fails is logged, not returned:
// the action itself has happened.
type auditor struct {
	store delegate.AuditStore
	log   *slog.Logger
}

var _ delegate.Recorder = auditor{}

// Record appends an entry for ctx's principal.
func (a auditor) Record(ctx context.Context, action delegate.AuditAction, target, detail string) {
	a.add(ctx, a.entry(ctx, action, target, detail))
}

// entry is the entry of an action by ctx's principal (nil: no trail).
func (a auditor) entry(ctx context.Context, action delegate.AuditAction, target, detail string) *delegate.AuditEntry {
	if a.store == nil {
		return nil
	}
	if len(detail) > delegate.MaxAuditDetail {
		detail = detail[:delegate.MaxAuditDetail]
	}
	return &delegate.AuditEntry{Time: time.Now().UTC(), Principal: delegate.OwnerOf(ctx), Action: action, Target: target, Detail: detail}
}

// add appends e (nil: nothing).
func (a auditor) add(ctx context.Context, e *delegate.AuditEntry) {
	if e == nil {
		return
	}
	// Written even when the request that did it has gone away.
	if err := a.store.AddAudit(context.WithoutCancel(ctx), e); err != nil {
		a.log.Error("audit trail: an entry was not written", "action", string(e.Action), "target", e.Target, "principal", e.Principal, "err", err)
	}
}
