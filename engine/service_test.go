package engine_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

// The read rules of the JobService, tested on the engine that owns them.

func TestListRules(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	ctx := context.Background()
	long := strings.Repeat("é", 100)
	a := f.submit(script(long))
	f.started().Finish(sandbox.Exit{Code: 3})
	f.wait(f.eng, a.ID)
	kept := script("keep")
	kept.Lifecycle = delegate.LifecyclePersistent
	b := f.submit(kept)
	f.started().Finish(sandbox.Exit{})
	f.wait(f.eng, b.ID)

	page, err := f.eng.List(ctx, delegate.ListOptions{})
	if err != nil || len(page.Jobs) != 2 || page.NextCursor != "" {
		t.Fatalf("list: %+v %v", page, err)
	}
	newest, oldest := page.Jobs[0], page.Jobs[1]
	if newest.ID != b.ID || !newest.SandboxKept || oldest.SandboxKept {
		t.Errorf("sandbox_kept: %+v / %+v", newest, oldest)
	}
	if r := []rune(oldest.Task); len(r) != 80 || r[79] != '…' || oldest.ExitCode == nil || *oldest.ExitCode != 3 {
		t.Errorf("summary of a long task: %q exit %v", oldest.Task, oldest.ExitCode)
	}
	if _, _, err := f.eng.Release(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	page, _ = f.eng.List(ctx, delegate.ListOptions{Status: delegate.StatusSuccess})
	if len(page.Jobs) != 1 || page.Jobs[0].SandboxKept {
		t.Errorf("after release: %+v", page.Jobs)
	}

	page, err = f.eng.List(ctx, delegate.ListOptions{Limit: 1})
	if err != nil || len(page.Jobs) != 1 || page.NextCursor == "" {
		t.Fatalf("page of one: %+v %v", page, err)
	}
	if next, err := f.eng.List(ctx, delegate.ListOptions{Limit: 1, Cursor: page.NextCursor}); err != nil || len(next.Jobs) != 1 || next.Jobs[0].ID != a.ID {
		t.Fatalf("next page: %+v %v", next, err)
	}

	for _, tc := range []struct {
		opts  delegate.ListOptions
		field string
	}{
		{delegate.ListOptions{Status: "done"}, "status"},
		{delegate.ListOptions{Limit: -1}, "limit"},
		{delegate.ListOptions{Limit: delegate.MaxPageSize + 1}, "limit"},
		{delegate.ListOptions{Cursor: "nope"}, "cursor"},
	} {
		_, err := f.eng.List(ctx, tc.opts)
		var fe *delegate.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, delegate.ErrInvalid) {
			t.Errorf("%+v: %v, want a field error on %s", tc.opts, err, tc.field)
		}
	}
}

func TestListDefaultPageSize(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{MaxConcurrent: 1})
	for range delegate.DefaultPageSize + 1 {
		f.submit(script("x"))
	}
	page, err := f.eng.List(context.Background(), delegate.ListOptions{})
	if err != nil || len(page.Jobs) != delegate.DefaultPageSize || page.NextCursor == "" {
		t.Fatalf("default page: %d jobs, cursor %q, %v", len(page.Jobs), page.NextCursor, err)
	}
}

func TestResultRules(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	ctx := context.Background()
	job := f.submit(script("x"))
	p := f.started()
	eventually(t, "running", func() bool { j, _ := f.eng.Get(ctx, job.ID); return j.Status == delegate.StatusRunning })
	if _, err := f.eng.Result(ctx, job.ID, delegate.ResultOptions{}); !errors.Is(err, delegate.ErrNotFinished) {
		t.Fatalf("result while running: %v", err)
	}
	// 2-byte runes: a tail of odd length starts inside one.
	out := bytes.Repeat([]byte("é"), 100)
	p.Write(out)
	p.Finish(sandbox.Exit{Code: 1})
	f.wait(f.eng, job.ID)

	r, err := f.eng.Result(ctx, job.ID, delegate.ResultOptions{OutputTail: 11})
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Output) != strings.Repeat("é", 5) || r.OutputOffset != 190 {
		t.Errorf("tail of 11 bytes: %q at %d, want 5 whole runes at 190", r.Output, r.OutputOffset)
	}
	if r.Status != delegate.StatusFailed || r.ExitCode == nil || *r.ExitCode != 1 || r.OutputBytes != 200 || r.Artifacts == nil {
		t.Errorf("result: %+v", r)
	}
	r, _ = f.eng.Result(ctx, job.ID, delegate.ResultOptions{})
	if !bytes.Equal(r.Output, out) || r.OutputOffset != 0 {
		t.Errorf("default tail: %d bytes at %d", len(r.Output), r.OutputOffset)
	}
	var fe *delegate.FieldError
	if _, err := f.eng.Result(ctx, job.ID, delegate.ResultOptions{OutputTail: -1}); !errors.As(err, &fe) {
		t.Errorf("negative tail: %v", err)
	}
	if _, err := f.eng.Result(ctx, "job-nope", delegate.ResultOptions{}); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("unknown job: %v", err)
	}
}

func TestLogsRules(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	ctx := context.Background()
	running := func(m delegate.Manifest) (*delegate.Job, interface {
		Write([]byte)
		Finish(sandbox.Exit)
	}) {
		j := f.submit(m)
		p := f.started()
		eventually(t, "running", func() bool { j, _ := f.eng.Get(ctx, j.ID); return j.Status == delegate.StatusRunning })
		return j, p
	}

	simple, sp := running(script("x"))
	sp.Write([]byte("hidden until the end\n"))
	if _, err := f.eng.Logs(ctx, simple.ID, delegate.LogOptions{}); !errors.Is(err, delegate.ErrNotFinished) ||
		!strings.Contains(err.Error(), "statusMode streaming") {
		t.Fatalf("logs of a running simple job: %v", err)
	}

	m := script("x")
	m.StatusMode = delegate.StatusModeStreaming
	streaming, p := running(m)
	// "é" is 0xC3 0xA9: the first byte alone is held back while the job runs.
	p.Write([]byte("ab\xc3"))
	var l *delegate.LogPage
	eventually(t, "output", func() bool {
		var err error
		l, err = f.eng.Logs(ctx, streaming.ID, delegate.LogOptions{})
		return err == nil && len(l.Output) > 0
	})
	if string(l.Output) != "ab" || l.NextCursor != "2" || l.Done || l.Status != delegate.StatusRunning {
		t.Fatalf("first page: %q next %q done %v", l.Output, l.NextCursor, l.Done)
	}
	p.Write([]byte("\xa9" + strings.Repeat("x", 10)))
	eventually(t, "more output", func() bool {
		l, _ = f.eng.Logs(ctx, streaming.ID, delegate.LogOptions{Cursor: "2", MaxBytes: 4})
		return l != nil && len(l.Output) == 4
	})
	if string(l.Output) != "éxx" || l.NextCursor != "6" {
		t.Fatalf("second page: %q next %q", l.Output, l.NextCursor)
	}
	// A job that ends inside a UTF-8 sequence: its last page has it all.
	p.Write([]byte("\xe2\x82"))
	p.Finish(sandbox.Exit{})
	f.wait(f.eng, streaming.ID)
	l, err := f.eng.Logs(ctx, streaming.ID, delegate.LogOptions{Cursor: "6"})
	if err != nil || string(l.Output) != strings.Repeat("x", 8)+"\xe2\x82" || !l.Done {
		t.Fatalf("last page: %q done %v %v", l.Output, l.Done, err)
	}
	sp.Finish(sandbox.Exit{})
	f.wait(f.eng, simple.ID)
	if l, err := f.eng.Logs(ctx, simple.ID, delegate.LogOptions{}); err != nil || string(l.Output) != "hidden until the end\n" || !l.Done {
		t.Fatalf("logs of a finished simple job: %+v %v", l, err)
	}

	for _, tc := range []struct {
		opts  delegate.LogOptions
		field string
	}{
		{delegate.LogOptions{Cursor: "x"}, "cursor"},
		{delegate.LogOptions{Cursor: "-1"}, "cursor"},
		{delegate.LogOptions{MaxBytes: -1}, "max_bytes"},
		{delegate.LogOptions{MaxBytes: delegate.MaxLogBytes + 1}, "max_bytes"},
	} {
		var fe *delegate.FieldError
		if _, err := f.eng.Logs(ctx, simple.ID, tc.opts); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%+v: %v, want a field error on %s", tc.opts, err, tc.field)
		}
	}
}

func TestTimelineOnlyWhenKept(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	ctx := context.Background()
	for _, mode := range []delegate.StatusMode{delegate.StatusModeSimple, delegate.StatusModeDetailed, delegate.StatusModeStreaming} {
		m := script("x")
		m.StatusMode = mode
		j := f.submit(m)
		p := f.started()
		p.Event("step one")
		eventually(t, "progress", func() bool { j, _ := f.eng.Get(ctx, j.ID); return j.Progress == "step one" })
		p.Finish(sandbox.Exit{})
		f.wait(f.eng, j.ID)
		evs, err := f.eng.Timeline(ctx, j.ID)
		if err != nil {
			t.Fatal(err)
		}
		if want := mode != delegate.StatusModeSimple; (len(evs) > 0) != want {
			t.Errorf("statusMode %s: timeline %+v", mode, evs)
		}
	}
	if _, err := f.eng.Timeline(ctx, "job-nope"); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("unknown job: %v", err)
	}
}

func TestWatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	changes := f.eng.Watch(ctx)
	j := f.submit(script("x"))
	select {
	case id := <-changes:
		if id != j.ID {
			t.Fatalf("change of %q, want %q", id, j.ID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no change seen")
	}
	cancel()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-changes:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the channel is not closed when ctx ends")
		}
	}
}
