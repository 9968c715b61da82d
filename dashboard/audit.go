package dashboard

import (
	"net/http"
	"time"

	"github.com/delegate-dev/delegate"
)

// The audit trail's page: who did what, newest first. The operator sees
// everyone's entries; a principal signed in with a token of its own, its
// own (the store's filter).

type auditView struct {
	Entries []delegate.AuditEntry
	Now     time.Time
	// Operator: the viewer sees every principal's entries.
	Operator bool
}

func (d *dash) auditPage(w http.ResponseWriter, r *http.Request) {
	f := delegate.AuditFilter{Principal: r.URL.Query().Get("principal"), Limit: delegate.MaxPageSize}
	entries, err := d.audit.Audit(r.Context(), f)
	if err != nil {
		d.serviceError(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "audit", auditView{Entries: entries, Now: time.Now(), Operator: delegate.PrincipalOf(r.Context()).Admin()})
}
