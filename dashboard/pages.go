package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/buildinfo"
)

// parsePages parses each page with the layout and the shared partials.
func parsePages() map[string]*template.Template {
	funcs := template.FuncMap{
		"jobURL":      jobURL,
		"sandboxURL":  sandboxURL,
		"since":       since,
		"idle":        idle,
		"artifactURL": artifactURL,
		"listURL":     listURL,
		"bytes":       formatBytes,
		"clock":       clock,
		"iso":         func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"duration":    formatDuration,
		"terminal":    func(s delegate.Status) bool { return s.Terminal() },
		"questionURL": questionURL,
		"fieldValue":  fieldValue,
		"enumName":    enumName,
		"inputType":   inputType,
		// The exit code and why it ended, by the rule every reader
		// follows (delegate.ExitReason).
		"exit": delegate.ExitText,
		"jobExit": func(j *delegate.Job) string {
			return delegate.ExitText(j.ExitCode, delegate.ExitReasonOf(j.Status, j.ExitCode, j.OOMKilled))
		},
	}
	pages := map[string]*template.Template{}
	for _, name := range []string{"list", "job", "login", "error", "sandboxes", "sandbox", "audit"} {
		pages[name] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS,
			"templates/layout.html", "templates/partials.html", "templates/"+name+".html"))
	}
	return pages
}

// whoOf names the principal a page is shown to.
func whoOf(r *http.Request) string {
	if p := delegate.PrincipalOf(r.Context()); p != nil {
		return p.Name
	}
	return ""
}

// render writes a whole page.
func (d *dash) render(w http.ResponseWriter, r *http.Request, code int, page string, data any) {
	var buf bytes.Buffer
	view := struct {
		Page     any
		SignedIn bool
		Version  string
		// Sandboxes: the service keeps sandboxes, the header links them.
		Sandboxes bool
		// Audit: the header links the audit trail.
		Audit bool
		// Who is the principal the page is shown to ("" on the sign-in
		// page).
		Who string
	}{data, d.signedIn(r), buildinfo.Version(), d.sbx != nil, d.audit != nil, whoOf(r)}
	if err := d.pages[page].ExecuteTemplate(&buf, "layout.html", view); err != nil {
		d.log.Error("dashboard: render", "page", page, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

// fragment renders one of a page's live parts to a string.
func (d *dash) fragment(page, name string, data any) (string, error) {
	var buf bytes.Buffer
	if err := d.pages[page].ExecuteTemplate(&buf, name, data); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// listView is the job list: a page of jobs, with its filter.
type listView struct {
	Status   delegate.Status
	Cursor   string
	Statuses []delegate.Status
	Jobs     []delegate.JobSummary
	Next     string // cursor of the next page
	Now      time.Time
	LiveURL  string
	// Viewer is whom the page is for: another principal's jobs (the
	// operator sees them) are named.
	Viewer string
}

// readList reads the page of jobs a request asks for.
func (d *dash) readList(ctx context.Context, status delegate.Status, cursor string) (listView, error) {
	page, err := d.svc.List(ctx, delegate.ListOptions{Status: status, Cursor: cursor})
	if err != nil {
		return listView{}, err
	}
	live := "/events"
	if q := strings.TrimPrefix(listURL(string(status), cursor), "/"); q != "" {
		live += q
	}
	return listView{Viewer: delegate.OwnerOf(ctx), Status: status, Cursor: cursor, Statuses: delegate.Statuses, Jobs: page.Jobs, Next: page.NextCursor,
		Now: time.Now(), LiveURL: live}, nil
}

func listQuery(r *http.Request) (delegate.Status, string) {
	q := r.URL.Query()
	return delegate.Status(q.Get("status")), q.Get("cursor")
}

func (d *dash) list(w http.ResponseWriter, r *http.Request) {
	status, cursor := listQuery(r)
	v, err := d.readList(r.Context(), status, cursor)
	if err != nil {
		d.serviceError(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "list", v)
}

// jobView is one job's page.
type jobView struct {
	Job      *delegate.Job
	Task     string
	Timeline []delegate.Event
	Simple   bool // statusMode simple: no timeline is kept
	Result   *delegate.JobResult
	// Output is the end of the job's log as text (stdout and stderr
	// interleaved, stderr marked), Shown its bytes, Kept the bytes of the
	// whole log, Cut whether Output is only its end.
	Output    []logPiece
	Shown     int64
	Kept      int64
	Cut       bool
	Artifacts []delegate.Artifact
	// LiveLog: the job runs in statusMode streaming, its output is
	// followed live.
	LiveLog bool
	Now     time.Time
	Notice  string
	LiveURL string
	// Questions are those the job waits for answers to (questions.go).
	Questions []delegate.Question
	// Network is the job's network log through the egress proxy: its
	// policy and counts, and its denied attempts (the whole log is
	// NetworkURL, as JSON).
	Network    *delegate.NetworkReport
	NetworkURL string
	// Changes are what the job changed in its workspace (the result's
	// summary), Diff the first page of their diff, DiffMore whether there
	// is more of it (the patch has all).
	Changes  *delegate.WorkspaceChanges
	Diff     string
	DiffMore bool
}

// readJob reads all a job's page shows.
func (d *dash) readJob(ctx context.Context, id string) (jobView, error) {
	j, err := d.svc.Get(ctx, id)
	if err != nil {
		return jobView{}, err
	}
	v := jobView{Job: j, Task: j.Manifest.Task, Simple: j.Manifest.StatusMode == delegate.StatusModeSimple, Now: time.Now(),
		LiveURL: jobURL(j.ID) + "/events"}
	if v.Task == "" && j.Manifest.Agent != nil {
		v.Task = j.Manifest.Agent.Command
	}
	if v.Timeline, err = d.svc.Timeline(ctx, id); err != nil {
		return jobView{}, err
	}
	if ns := d.ns; ns != nil && (j.Manifest.Network.Reaches() || j.Manifest.Sandbox != "") {
		rep, err := ns.Network(ctx, id, delegate.NetworkLogOptions{Denied: true, Limit: maxPageDenials})
		if err != nil && !errors.Is(err, delegate.ErrNotFound) {
			return jobView{}, err
		}
		v.Network, v.NetworkURL = rep, jobURL(j.ID)+"/network"
	}
	if !j.Status.Terminal() {
		v.LiveLog = j.Manifest.StatusMode == delegate.StatusModeStreaming
		if v.Questions, err = d.openQuestions(ctx, id); err != nil {
			return jobView{}, err
		}
		return v, nil
	}
	res, err := d.svc.Result(ctx, id, delegate.ResultOptions{})
	if errors.Is(err, delegate.ErrNotFinished) {
		return v, nil // it finished between the two reads: the next update shows it
	}
	if err != nil {
		return jobView{}, err
	}
	// The log's end, not the result's stdout: the page shows both
	// streams, in the order they were written.
	log, err := d.svc.Logs(ctx, id, delegate.LogOptions{Tail: true, MaxBytes: delegate.DefaultOutputTail})
	if err != nil {
		return jobView{}, err
	}
	v.Result, v.Artifacts, v.Changes = res, res.Artifacts, res.Changes
	if ws := d.ws; ws != nil && res.Changes != nil && len(res.Changes.Files) > 0 {
		page, err := ws.Diff(ctx, id, delegate.DiffOptions{})
		if err != nil && !errors.Is(err, delegate.ErrNotFound) {
			return jobView{}, err
		}
		if page != nil {
			v.Diff, v.DiffMore = page.Text, page.Next != 0
		}
	}
	v.Output = logPieces(log)
	v.Shown, v.Kept, v.Cut = int64(len(log.Output)), log.Offset+int64(len(log.Output)), log.Offset > 0
	return v, nil
}

// maxPageDenials is how many denied attempts a job's page lists.
const maxPageDenials = 50

// network serves a job's whole network log, as JSON.
func (d *dash) network(w http.ResponseWriter, r *http.Request) {
	ns := d.ns
	if ns == nil {
		d.fail(w, r, http.StatusNotFound, "This server keeps no network logs.")
		return
	}
	rep, err := ns.Network(r.Context(), r.PathValue("id"), delegate.NetworkLogOptions{Limit: delegate.MaxNetworkLog})
	if err != nil {
		d.serviceError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Disposition", attachment(rep.JobID+"-network.json"))
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(rep)
}

// logPiece is a piece of a log as the page shows it.
type logPiece struct {
	Text   string
	Stderr bool
}

// logPieces is a log page as text, piece by piece; a page without its
// streams is one piece.
func logPieces(l *delegate.LogPage) []logPiece {
	if len(l.Streams) == 0 {
		return []logPiece{{Text: strings.ToValidUTF8(string(l.Output), "\uFFFD")}}
	}
	var out []logPiece
	for _, o := range l.Streams {
		out = append(out, logPiece{Text: strings.ToValidUTF8(string(o.Data), "\uFFFD"), Stderr: o.Stream == delegate.StreamStderr})
	}
	return out
}

// notices are what a redirect may ask the job page to say (a fixed set:
// nothing from the query string is shown as it is).
var notices = map[string]string{
	"cancelled": "Cancelled: its processes are being killed and its sandbox destroyed.",
	"answered":  "Answered: the job finds the answer where it waits for it.",
	"finished":  "It had already finished: nothing was cancelled.",
}

func (d *dash) job(w http.ResponseWriter, r *http.Request) {
	v, err := d.readJob(r.Context(), r.PathValue("id"))
	if err != nil {
		d.serviceError(w, r, err)
		return
	}
	v.Notice = notices[r.URL.Query().Get("notice")]
	d.render(w, r, http.StatusOK, "job", v)
}

func (d *dash) cancel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	_, cancelled, err := d.svc.Cancel(r.Context(), id)
	if err != nil {
		d.serviceError(w, r, err)
		return
	}
	notice := "finished"
	if cancelled {
		notice = "cancelled"
		d.log.Info("dashboard: job cancelled", "job", id, "remote", r.RemoteAddr)
	}
	http.Redirect(w, r, jobURL(id)+"?notice="+notice, http.StatusSeeOther)
}

// output downloads all the output a job has kept, as it is.
func (d *dash) output(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	page, err := d.svc.Logs(r.Context(), id, delegate.LogOptions{MaxBytes: delegate.MaxLogBytes})
	if err != nil {
		d.serviceError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Disposition", attachment(id+"-output.txt"))
	w.Header().Set("Content-Security-Policy", "sandbox")
	for {
		if _, err := w.Write(page.Output); err != nil || page.Done || len(page.Output) == 0 {
			return
		}
		if page, err = d.svc.Logs(r.Context(), id, delegate.LogOptions{Cursor: page.NextCursor, MaxBytes: delegate.MaxLogBytes}); err != nil {
			d.log.Warn("dashboard: output download", "job", id, "err", err)
			return
		}
	}
}

// artifact downloads one artifact. It is always an attachment of an
// opaque type: a job's file is never rendered as a page of this origin.
func (d *dash) artifact(w http.ResponseWriter, r *http.Request) {
	id, name := r.PathValue("id"), r.PathValue("name")
	a, data, err := d.svc.ReadArtifact(r.Context(), id, name)
	if err != nil {
		d.serviceError(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", attachment(path.Base(a.Name)))
	h.Set("Content-Security-Policy", "sandbox")
	h.Set("Content-Length", fmt.Sprint(len(data)))
	w.Write(data)
}

// attachment is a Content-Disposition that saves a file under name.
func attachment(name string) string {
	if v := mime.FormatMediaType("attachment", map[string]string{"filename": name}); v != "" {
		return v
	}
	return "attachment"
}

func clock(t, now time.Time) string {
	if t.IsZero() {
		return "–"
	}
	t, now = t.UTC(), now.UTC()
	if t.YearDay() == now.YearDay() && t.Year() == now.Year() {
		return t.Format("15:04:05")
	}
	if t.Year() == now.Year() {
		return t.Format("Jan 2 15:04")
	}
	return t.Format("2006-01-02 15:04")
}

// formatDuration is how long a job ran (to now while it runs).
func formatDuration(started, finished, now time.Time) string {
	if started.IsZero() {
		return "–"
	}
	if finished.IsZero() {
		finished = now
	}
	d := finished.Sub(started)
	switch {
	case d < 0:
		return "0s"
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
}
