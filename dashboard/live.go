package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
)

// Live updates are server-sent events. The server renders the changed
// part of the page with the same templates (so it is escaped the same
// way) and the script puts it in place; log text is sent as text, and the
// script adds it as text. Events:
//
//	html  {"html": "..."}  the page's live part, rendered anew
//	log   {"text": "..."}  more output of a job followed live
//	end                    nothing more will change: stop listening

// minGap is the least time between two renders of a live view: a busy
// engine changes jobs many times a second, a page needs not follow each.
const minGap = 150 * time.Millisecond

// keepAlive is how often an idle stream sends a comment, so that proxies
// do not close it.
const keepAlive = 15 * time.Second

// eventStream writes server-sent events.
type eventStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newEventStream(w http.ResponseWriter) *eventStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: do not hold events back
	w.WriteHeader(http.StatusOK)
	s := &eventStream{w: w, rc: http.NewResponseController(w)}
	// A client that loses the stream tries again after 2 s.
	fmt.Fprint(w, "retry: 2000\n\n")
	s.rc.Flush()
	return s
}

// send writes one event; data is JSON, so it is one line.
func (s *eventStream) send(event string, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", event, b); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *eventStream) ping() error {
	if _, err := fmt.Fprint(s.w, ": ping\n\n"); err != nil {
		return err
	}
	return s.rc.Flush()
}

// follow calls render at once, then whenever a job changes (only the job
// id when it is set) and at every poll, until render says done, ctx ends
// or the stream breaks.
func (d *dash) follow(ctx context.Context, s *eventStream, id string, render func() (done bool, err error)) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	changes := d.svc.Watch(ctx)
	poll := time.NewTicker(d.opts.Poll)
	defer poll.Stop()
	alive := time.NewTicker(keepAlive)
	defer alive.Stop()
	var (
		soon <-chan time.Time // a render is due
		last time.Time
	)
	for {
		done, err := render()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, delegate.ErrNotFound) {
				d.log.Warn("dashboard: live update", "job", id, "err", err)
			}
			return
		}
		if done {
			s.send("end", struct{}{})
			return
		}
		last = time.Now()
		soon = nil
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case changed, ok := <-changes:
				if !ok {
					changes = nil
					continue
				}
				if (id == "" || changed == id) && soon == nil {
					soon = time.After(max(0, minGap-time.Since(last)))
				}
			case <-soon:
				break wait
			case <-poll.C:
				break wait
			case <-alive.C:
				if s.ping() != nil {
					return
				}
			}
		}
	}
}

// listEvents streams the job list of a filter and page.
func (d *dash) listEvents(w http.ResponseWriter, r *http.Request) {
	status, cursor := listQuery(r)
	if _, err := d.readList(r.Context(), status, cursor); err != nil {
		d.serviceError(w, r, err) // a bad filter: say so once, do not stream
		return
	}
	s := newEventStream(w)
	var sent string
	d.follow(r.Context(), s, "", func() (bool, error) {
		v, err := d.readList(r.Context(), status, cursor)
		if err != nil {
			return false, err
		}
		html, err := d.fragment("list", "jobs", v)
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

// jobEvents streams a job's page until the job has finished: its live
// part, and its output as it comes when it runs in statusMode streaming.
func (d *dash) jobEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, err := d.svc.Get(r.Context(), id); err != nil {
		d.serviceError(w, r, err)
		return
	}
	s := newEventStream(w)
	var sent, cursor string
	d.follow(r.Context(), s, id, func() (bool, error) {
		v, err := d.readJob(r.Context(), id)
		if err != nil {
			return false, err
		}
		// Once the job has ended, the live part shows its output in place
		// of the live log: the log is followed only while it runs.
		if v.LiveLog {
			if cursor, err = d.sendLog(r.Context(), s, id, cursor); err != nil {
				return false, err
			}
		}
		html, err := d.fragment("job", "live", v)
		if err != nil {
			return false, err
		}
		if html != sent {
			sent = html
			if err := s.send("html", map[string]string{"html": html}); err != nil {
				return false, err
			}
		}
		return v.Job.Status.Terminal() && v.Result != nil, nil
	})
}

// maxLogEvent is the most output one log event carries.
const maxLogEvent = 64 << 10

// sendLog sends the output from cursor on, and returns where it stopped.
func (d *dash) sendLog(ctx context.Context, s *eventStream, id, cursor string) (string, error) {
	for range 64 { // at most 4 MiB per render: the page keeps the end anyway
		page, err := d.svc.Logs(ctx, id, delegate.LogOptions{Cursor: cursor, MaxBytes: maxLogEvent})
		if errors.Is(err, delegate.ErrNotFinished) {
			return cursor, nil
		}
		if err != nil {
			return cursor, err
		}
		if len(page.Output) > 0 {
			text := strings.ToValidUTF8(string(page.Output), "\uFFFD")
			if err := s.send("log", map[string]string{"text": text}); err != nil {
				return cursor, err
			}
		}
		cursor = page.NextCursor
		if page.Done || len(page.Output) == 0 {
			return cursor, nil
		}
	}
	return cursor, nil
}
