package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/delegate-dev/delegate"
)

// Kept sandboxes: GET /sandboxes lists them (with ?all=1 those gone
// too), GET /sandboxes/{id} shows one, POST /sandboxes/{id}/release
// destroys one; each view is followed live as the job pages are. They are
// served with Services.Sandboxes (the engine, as cmd/ wires it).

// sandboxPages serve the kept sandboxes' pages, with the dashboard's
// sign-in, rendering and live views.
type sandboxPages struct{ *dash }

func (d *sandboxPages) addRoutes(mux *http.ServeMux, csrf *http.CrossOriginProtection) {
	mux.Handle("GET /sandboxes", d.guard(d.sandboxes))
	mux.Handle("GET /sandboxes/events", d.guard(d.sandboxesEvents))
	mux.Handle("GET /sandboxes/{id}", d.guard(d.sandbox))
	mux.Handle("GET /sandboxes/{id}/events", d.guard(d.sandboxEvents))
	mux.Handle("POST /sandboxes/{id}/release", csrf.Handler(d.guard(d.release)))
}

// sandboxURL is a sandbox's page.
func sandboxURL(id string) string { return "/sandboxes/" + url.PathEscape(id) }

// since is how long ago t was, to the minute (a live view renders again
// only when what it shows changes): "<1m", "12m", "3h07m", "2d04h".
func since(t, now time.Time) string {
	if t.IsZero() {
		return "–"
	}
	m := int64(now.Sub(t) / time.Minute)
	switch {
	case m < 1:
		return "<1m"
	case m < 60:
		return fmt.Sprintf("%dm", m)
	case m < 48*60:
		return fmt.Sprintf("%dh%02dm", m/60, m%60)
	}
	return fmt.Sprintf("%dd%02dh", m/(24*60), m%(24*60)/60)
}

// idle is how long a sandbox has waited for a command ("–" while one
// runs, or once it is gone).
func idle(sb delegate.Sandbox, now time.Time) string {
	if sb.State != delegate.SandboxIdle && sb.State != delegate.SandboxPaused {
		return "–"
	}
	return since(sb.LastUsedAt, now)
}

// sandboxesView is the list of kept sandboxes.
type sandboxesView struct {
	All       bool
	Sandboxes []delegate.Sandbox
	Now       time.Time
	LiveURL   string
	// Viewer is whom the page is for: another principal's sandboxes (the
	// operator sees them) are named.
	Viewer string
}

func (d *sandboxPages) readSandboxes(ctx context.Context, all bool) (sandboxesView, error) {
	list, err := d.sbx.ListSandboxes(ctx, delegate.SandboxListOptions{All: all})
	if err != nil {
		return sandboxesView{}, err
	}
	live := "/sandboxes/events"
	if all {
		live += "?all=1"
	}
	return sandboxesView{Viewer: delegate.OwnerOf(ctx), All: all, Sandboxes: list, Now: time.Now(), LiveURL: live}, nil
}

func (d *sandboxPages) sandboxes(w http.ResponseWriter, r *http.Request) {
	v, err := d.readSandboxes(r.Context(), r.URL.Query().Get("all") != "")
	if err != nil {
		d.serviceError(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "sandboxes", v)
}

func (d *sandboxPages) sandboxesEvents(w http.ResponseWriter, r *http.Request) {
	all := r.URL.Query().Get("all") != ""
	if _, err := d.readSandboxes(r.Context(), all); err != nil {
		d.serviceError(w, r, err)
		return
	}
	s := newEventStream(w)
	var sent string
	// A sandbox changes when a command in it does: any job's change, or
	// the poll, renders the list again.
	d.follow(r.Context(), s, "", func() (bool, error) {
		v, err := d.readSandboxes(r.Context(), all)
		if err != nil {
			return false, err
		}
		html, err := d.fragment("sandboxes", "sandboxes-live", v)
		if err != nil {
			return false, err
		}
		if html != sent {
			sent = html
			return false, s.send("html", map[string]string{"html": html})
		}
		return false, nil
	})
}

// sandboxView is one kept sandbox's page.
type sandboxView struct {
	Sandbox *delegate.Sandbox
	Now     time.Time
	Notice  string
	LiveURL string
	// Checkpoints are the sandbox's, each with the forks made from it:
	// the tree its page draws under it, and above it (Source) the
	// sandbox it was forked from, if it is one.
	Checkpoints []delegate.Checkpoint
	Source      string
}

// readSandbox reads a sandbox and its tree of checkpoints and forks.
func (d *sandboxPages) readSandbox(ctx context.Context, id string) (sandboxView, error) {
	sb, err := d.sbx.GetSandbox(ctx, id)
	if err != nil {
		return sandboxView{}, err
	}
	v := sandboxView{Sandbox: sb, Now: time.Now()}
	if sb.From != "" {
		v.Source, _ = delegate.CheckpointSandbox("from", sb.From)
	}
	if d.cps != nil && len(sb.Checkpoints) > 0 {
		if v.Checkpoints, err = d.cps.ListCheckpoints(ctx, sb.ID); err != nil {
			return sandboxView{}, err
		}
	}
	return v, nil
}

// sandboxNotices are what a redirect may ask the sandbox page to say.
var sandboxNotices = map[string]string{
	"released": "Released: its processes are killed and its files destroyed.",
	"gone":     "It was gone already: nothing was released.",
}

func (d *sandboxPages) sandbox(w http.ResponseWriter, r *http.Request) {
	v, err := d.readSandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		d.serviceError(w, r, err)
		return
	}
	v.Notice, v.LiveURL = sandboxNotices[r.URL.Query().Get("notice")], sandboxURL(v.Sandbox.ID)+"/events"
	d.render(w, r, http.StatusOK, "sandbox", v)
}

// sandboxEvents follows a sandbox's page until it is gone.
func (d *sandboxPages) sandboxEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, err := d.sbx.GetSandbox(r.Context(), id); err != nil {
		d.serviceError(w, r, err)
		return
	}
	s := newEventStream(w)
	var sent string
	d.follow(r.Context(), s, "", func() (bool, error) {
		v, err := d.readSandbox(r.Context(), id)
		if err != nil {
			return false, err
		}
		sb := v.Sandbox
		html, err := d.fragment("sandbox", "sandbox-live", v)
		if err != nil {
			return false, err
		}
		if html != sent {
			sent = html
			if err := s.send("html", map[string]string{"html": html}); err != nil {
				return false, err
			}
		}
		return sb.State.Terminal(), nil
	})
}

func (d *sandboxPages) release(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sb, released, err := d.sbx.ReleaseSandbox(r.Context(), id)
	if err != nil {
		d.serviceError(w, r, err)
		return
	}
	notice := "gone"
	if released {
		notice = "released"
		d.log.Info("dashboard: sandbox released", "sandbox", sb.ID, "remote", r.RemoteAddr)
	}
	http.Redirect(w, r, sandboxURL(sb.ID)+"?notice="+notice, http.StatusSeeOther)
}
