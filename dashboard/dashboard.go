// Package dashboard is delegate's web page for people: the list of jobs
// and each job's status, timeline, output and artifacts, updated live,
// with a cancel button. It is an adapter over delegate.JobService like the
// MCP tools: parse, call the service, render. Pages are rendered on the
// server with html/template (everything a job controls is escaped); the
// one script and the style sheet are embedded; no external resource is
// loaded, and the Content-Security-Policy says so to the browser.
package dashboard

import (
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/httpauth"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// contentSecurityPolicy allows this server's own script, style and live
// updates, and nothing else: no inline script, no other origin, no frames.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Options tune the dashboard.
type Options struct {
	// Token, if set, is asked for: as a bearer token, or once through
	// the sign-in form, which leaves a session cookie. nil: no sign-in
	// (a server on the loopback interface without DELEGATE_HTTP_TOKEN).
	Token *httpauth.Token
	// Guard, if set, admits requests instead (Token is then its shared
	// token): a person signs in with a token of delegate's own and sees
	// their own work; the operator sees everyone's, the principal named.
	Guard *httpauth.Guard
	// Poll is how often the live views read the jobs again, to see what
	// other processes sharing the data dir did; default 1s. Changes this
	// process makes are shown at once.
	Poll   time.Duration
	Logger *slog.Logger
}

// Services are the services the dashboard shows, each by name: cmd/
// wires them (the engine is every one), so that a service the engine
// stops implementing fails the build instead of leaving a page out. Jobs
// is required; a nil other leaves out what shows it.
type Services struct {
	Jobs delegate.JobService
	// Sandboxes: the kept sandboxes' pages (sandboxes.go).
	Sandboxes delegate.SandboxService
	// Questions: a running job's questions, and their answer forms.
	Questions delegate.QuestionService
	// Network: a job's denied connections and its network log.
	Network delegate.NetworkService
	// Principals: the audit trail's page (the operator's: everyone's
	// entries; a principal's: its own).
	Principals delegate.PrincipalService
	// Workspaces: a job's changed files' diff, and its patch.
	Workspaces delegate.WorkspaceService
	// Checkpoints: a kept sandbox's checkpoints and the forks made from
	// them, on its page (nil: not shown).
	Checkpoints delegate.CheckpointService
}

// Handler serves the dashboard: GET / (the job list), /jobs/{id} (a job),
// their live updates, downloads, cancel, and sign-in. Requests their
// context ends (the server's BaseContext) end the live streams.
func Handler(svc Services, opts Options) http.Handler {
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Guard == nil {
		opts.Guard = &httpauth.Guard{Shared: opts.Token, Open: opts.Token == nil}
	}
	d := &dash{svc: svc.Jobs, sbx: svc.Sandboxes, qs: svc.Questions, ns: svc.Network, ws: svc.Workspaces, cps: svc.Checkpoints, audit: svc.Principals, opts: opts, log: opts.Logger, pages: parsePages()}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // the embedded tree is part of the binary
	}
	// Cross-origin POSTs (a page elsewhere submitting a form here) are
	// refused: with the SameSite=Strict cookie, this keeps cancel and
	// sign-in from being triggered by another site.
	csrf := http.NewCrossOriginProtection()
	csrf.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.fail(w, r, http.StatusForbidden, "This form was sent from another site: refused.")
	}))

	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /login", d.loginPage)
	mux.Handle("POST /login", csrf.Handler(http.HandlerFunc(d.login)))
	mux.Handle("POST /logout", csrf.Handler(http.HandlerFunc(d.logout)))
	mux.Handle("GET /{$}", d.guard(d.list))
	mux.Handle("GET /events", d.guard(d.listEvents))
	mux.Handle("GET /jobs/{id}", d.guard(d.job))
	mux.Handle("GET /jobs/{id}/events", d.guard(d.jobEvents))
	mux.Handle("GET /jobs/{id}/output", d.guard(d.output))
	mux.Handle("GET /jobs/{id}/network", d.guard(d.network))
	(&changesPages{d}).addRoutes(mux)
	mux.Handle("GET /jobs/{id}/artifacts/{name...}", d.guard(d.artifact))
	mux.Handle("POST /jobs/{id}/cancel", csrf.Handler(d.guard(d.cancel)))
	mux.Handle("POST /jobs/{id}/questions/{qid}", csrf.Handler(d.guard(d.answer)))
	if d.audit != nil {
		mux.Handle("GET /audit", d.guard(d.auditPage))
	}
	if d.sbx != nil {
		(&sandboxPages{d}).addRoutes(mux, csrf)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		d.fail(w, r, http.StatusNotFound, "No such page.")
	})
	return headers(mux)
}

type dash struct {
	svc delegate.JobService
	sbx delegate.SandboxService    // nil: no kept sandboxes
	qs  delegate.QuestionService   // nil: takes no questions
	ns  delegate.NetworkService    // nil: keeps no network logs
	ws  delegate.WorkspaceService  // nil: no workspaces' diffs
	cps delegate.CheckpointService // nil: no checkpoints shown
	// audit reads the audit trail (nil: no such page).
	audit delegate.PrincipalService
	// The sandboxes' pages are sandboxPages' (sandboxes.go).
	opts  Options
	log   *slog.Logger
	pages map[string]*template.Template
}

// headers sets what every answer of the dashboard carries.
func headers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		if !strings.HasPrefix(r.URL.Path, "/static/") {
			h.Set("Cache-Control", "no-store") // job data: never from a cache
		}
		next.ServeHTTP(w, r)
	})
}

// guard lets a request through if it is signed in (or carries the token);
// a page request otherwise gets 401 and the sign-in form, anything else
// a plain 401.
func (d *dash) guard(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := d.principal(r)
		if err == nil {
			next(w, r.WithContext(delegate.WithPrincipal(r.Context(), p)))
			return
		}
		if delegate.ErrorKind(err) != delegate.KindUnauthenticated {
			d.serviceError(w, r, err)
			return
		}
		httpauth.Challenge(w, r)
		if r.Method == http.MethodGet && wantsHTML(r) {
			d.render(w, r, http.StatusUnauthorized, "login", loginView{Next: r.URL.RequestURI()})
			return
		}
		http.Error(w, "unauthorized: sign in at /login, or send Authorization: Bearer <DELEGATE_HTTP_TOKEN>", http.StatusUnauthorized)
	})
}

// principal is who r comes from: its bearer token, or its session, or
// (a server open on the loopback interface) the local operator. Each
// request reads its token again: a revoked one signs its browsers out.
func (d *dash) principal(r *http.Request) (*delegate.Principal, error) {
	g := d.opts.Guard
	if bearer := httpauth.BearerOf(r); bearer != "" {
		return g.Authenticate(r.Context(), bearer)
	}
	if _, err := r.Cookie(httpauth.CookieName); err == nil {
		p, err := g.SessionPrincipal(r.Context(), r)
		if err == nil || !g.Open {
			return p, err
		}
	}
	if g.Open {
		return delegate.Local(), nil
	}
	return nil, fmt.Errorf("not signed in: %w", delegate.ErrUnauthenticated)
}

// wantsHTML: a browser navigating (not a script's fetch or EventSource).
func wantsHTML(r *http.Request) bool {
	if r.Header.Get("Sec-Fetch-Mode") == "navigate" {
		return true
	}
	a := r.Header.Get("Accept")
	return strings.Contains(a, "text/html") || a == ""
}

type loginView struct {
	Next  string
	Error string
}

func (d *dash) loginPage(w http.ResponseWriter, r *http.Request) {
	next := localPath(r.URL.Query().Get("next"))
	if _, err := d.principal(r); err == nil {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	d.render(w, r, http.StatusOK, "login", loginView{Next: next})
}

func (d *dash) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		d.fail(w, r, http.StatusBadRequest, "The sign-in form could not be read.")
		return
	}
	next := localPath(r.PostForm.Get("next"))
	if d.opts.Guard.Open && d.opts.Guard.Tokens == nil {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	p, err := d.opts.Guard.SignIn(w, r, r.PostForm.Get("token"))
	if err != nil {
		d.log.Warn("dashboard: failed sign-in", "remote", r.RemoteAddr, "err", err)
		msg := "That is not the token this server was started with, nor a token of delegate's own that is valid now."
		if delegate.ErrorKind(err) != delegate.KindUnauthenticated {
			msg = "The server cannot check tokens now; try again in a minute."
		}
		d.render(w, r, http.StatusUnauthorized, "login", loginView{Next: next, Error: msg})
		return
	}
	d.log.Info("dashboard: signed in", "principal", p.Name, "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (d *dash) logout(w http.ResponseWriter, r *http.Request) {
	httpauth.EndSession(w, r)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// localPath keeps a redirect on this server: a path, not a URL that
// leads elsewhere ("//evil.example", "https://...", "/\evil").
func localPath(p string) string {
	if p == "" || p[0] != '/' || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\\r\n") {
		return "/"
	}
	u, err := url.Parse(p)
	if err != nil || u.Host != "" || u.Scheme != "" {
		return "/"
	}
	return p
}

// fail answers an error page (or plain text to a script).
func (d *dash) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	if !wantsHTML(r) {
		http.Error(w, msg, code)
		return
	}
	d.render(w, r, code, "error", errorView{Code: code, Status: http.StatusText(code), Message: msg})
}

type errorView struct {
	Code    int
	Status  string
	Message string
}

// serviceErrors is the one table from a service error's kind to the
// dashboard's answer: its status, and its words for people ("" for the
// error's own, which are ours for these kinds). A kind not here is the
// server's trouble: logged, and answered in a few words.
var serviceErrors = map[delegate.Kind]struct {
	code int
	msg  string
}{
	delegate.KindNotFound:    {http.StatusNotFound, ""},
	delegate.KindInvalid:     {http.StatusBadRequest, ""},
	delegate.KindNotFinished: {http.StatusConflict, ""},
	delegate.KindTerminal:    {http.StatusConflict, ""},
	delegate.KindConflict:    {http.StatusConflict, ""},
	delegate.KindUnavailable: {http.StatusServiceUnavailable, "The sandbox backend or the job store does not answer now; try again in a minute."},
}

// notFound is what a page says of what it did not find.
var notFound = map[string]string{"job": "No such job.", "artifact": "No such artifact.", "question": "No such question.",
	"sandbox": "No such sandbox."}

// serviceError answers what the service said, in words for people.
func (d *dash) serviceError(w http.ResponseWriter, r *http.Request, err error) {
	kind := delegate.ErrorKind(err)
	a, ok := serviceErrors[kind]
	switch {
	case kind == delegate.KindNotFound:
		msg := notFound["job"]
		var nf *delegate.NotFoundError
		if errors.As(err, &nf) {
			msg = notFound[nf.Resource]
			if msg == "" || nf.Reason != "" {
				msg = nf.Error()
			}
		}
		d.fail(w, r, a.code, msg)
	case ok && a.msg == "":
		d.fail(w, r, a.code, err.Error())
	case r.Context().Err() != nil:
		// The browser went away.
	case ok:
		d.log.Warn("dashboard", "path", r.URL.Path, "err", err)
		d.fail(w, r, a.code, a.msg)
	default:
		d.log.Error("dashboard", "path", r.URL.Path, "err", err)
		d.fail(w, r, http.StatusInternalServerError, "Something went wrong reading the jobs; the server's log says what.")
	}
}

// signedIn says whether to offer the sign-out button.
func (d *dash) signedIn(r *http.Request) bool {
	_, err := d.opts.Guard.SessionPrincipal(r.Context(), r)
	return err == nil
}

// jobURL is a job's page.
func jobURL(id string) string { return "/jobs/" + url.PathEscape(id) }

// artifactURL is an artifact's download, each segment of its name
// escaped (names are the job's to choose: "?", "#", "%" and ".." stay
// parts of the name).
func artifactURL(id, name string) string {
	segs := strings.Split(name, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return jobURL(id) + "/artifacts/" + strings.Join(segs, "/")
}

// listURL is the list with a filter and a page.
func listURL(status, cursor string) string {
	q := url.Values{}
	if status != "" {
		q.Set("status", status)
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if len(q) == 0 {
		return "/"
	}
	return "/?" + q.Encode()
}

func formatBytes(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}
