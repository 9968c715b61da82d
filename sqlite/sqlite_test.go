package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sqlite"
)

func open(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newJob(id string) *delegate.Job {
	now := time.Now().UTC()
	return &delegate.Job{
		ID:        id,
		Status:    delegate.StatusPending,
		Manifest:  delegate.Manifest{Task: "echo " + id, AgentType: delegate.AgentScript, Env: map[string]string{"A": "b"}},
		CreatedAt: now,
		UpdatedAt: now,
	}
}

func TestCreateGetSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "jobs.db")
	s := open(t, path)
	j := newJob("j1")
	if err := s.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(ctx, newJob("j1")); err == nil {
		t.Fatal("duplicate id accepted")
	}
	code := 3
	if _, err := s.UpdateJob(ctx, "j1", func(j *delegate.Job) error {
		j.Status = delegate.StatusProvisioning
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateJob(ctx, "j1", func(j *delegate.Job) error {
		j.Status, j.StartedAt = delegate.StatusRunning, time.Now()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateJob(ctx, "j1", func(j *delegate.Job) error {
		j.Status, j.ExitCode, j.Error, j.OutputBytes, j.OutputTruncated = delegate.StatusFailed, &code, "exit 3", 10, true
		j.FinishedAt = time.Now()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// AppendOutput raises output_bytes to what is kept (11 > 10).
	if err := s.AppendOutput(ctx, "j1", stdout("hello "), 6); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendOutput(ctx, "j1", stdout("world"), 11); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s = open(t, path)
	got, err := s.GetJob(ctx, "j1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != delegate.StatusFailed || got.ExitCode == nil || *got.ExitCode != 3 || got.Error != "exit 3" ||
		got.OutputBytes != 11 || !got.OutputTruncated || got.Manifest.Env["A"] != "b" || got.StartedAt.IsZero() || got.FinishedAt.IsZero() {
		t.Fatalf("after reopen: %+v", got)
	}
	for _, tc := range []struct {
		off  int64
		max  int
		want string
	}{{0, 100, "hello world"}, {3, 100, "lo world"}, {6, 3, "wor"}, {0, 8, "hello wo"}, {11, 5, ""}, {20, 5, ""}} {
		outs, err := s.ReadOutput(ctx, "j1", tc.off, tc.max)
		if out := delegate.JoinOutput(outs); err != nil || string(out) != tc.want {
			t.Errorf("ReadOutput(%d,%d) = %q, %v; want %q", tc.off, tc.max, out, err, tc.want)
		}
	}
	if _, err := s.GetJob(ctx, "nope"); !errors.Is(err, delegate.ErrNotFound) {
		t.Fatalf("missing job: %v", err)
	}
}

func TestUpdateEnforcesStateMachine(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "jobs.db"))
	if err := s.CreateJob(ctx, newJob("j")); err != nil {
		t.Fatal(err)
	}
	set := func(st delegate.Status) error {
		_, err := s.UpdateJob(ctx, "j", func(j *delegate.Job) error { j.Status = st; return nil })
		return err
	}
	if err := set(delegate.StatusSuccess); !errors.Is(err, delegate.ErrInvalidTransition) {
		t.Fatalf("pending -> success: %v", err)
	}
	if err := set(delegate.StatusCancelled); err != nil {
		t.Fatal(err)
	}
	for _, st := range []delegate.Status{delegate.StatusRunning, delegate.StatusSuccess, delegate.StatusPending} {
		if err := set(st); !errors.Is(err, delegate.ErrTerminal) {
			t.Fatalf("cancelled -> %s: %v", st, err)
		}
	}
	got, _ := s.GetJob(ctx, "j")
	if got.Status != delegate.StatusCancelled {
		t.Fatalf("status %s after refused updates", got.Status)
	}
	// An error from fn writes nothing.
	boom := errors.New("boom")
	if _, err := s.UpdateJob(ctx, "j", func(j *delegate.Job) error { j.Progress = "x"; return boom }); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if got, _ := s.GetJob(ctx, "j"); got.Progress != "" {
		t.Fatal("failed update was written")
	}
}

func TestListPagination(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "jobs.db"))
	for i := range 7 {
		j := newJob(fmt.Sprintf("j%d", i))
		if i%2 == 1 {
			j.Status = delegate.StatusCancelled
		}
		if err := s.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	cursor := ""
	for page := 0; ; page++ {
		jobs, next, err := s.ListJobs(ctx, delegate.JobFilter{Limit: 3, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			ids = append(ids, j.ID)
		}
		if next == "" {
			break
		}
		if page > 5 {
			t.Fatal("pagination does not end")
		}
		cursor = next
	}
	if fmt.Sprint(ids) != "[j6 j5 j4 j3 j2 j1 j0]" {
		t.Fatalf("pages gave %v", ids)
	}
	jobs, next, err := s.ListJobs(ctx, delegate.JobFilter{Status: delegate.StatusCancelled})
	if err != nil || len(jobs) != 3 || next != "" {
		t.Fatalf("status filter: %d jobs, next %q, %v", len(jobs), next, err)
	}
	jobs, _, err = s.ListJobs(ctx, delegate.JobFilter{Active: true})
	if err != nil || len(jobs) != 4 {
		t.Fatalf("active filter: %d jobs, %v", len(jobs), err)
	}
	if _, _, err := s.ListJobs(ctx, delegate.JobFilter{Cursor: "garbage"}); !errors.Is(err, delegate.ErrInvalid) {
		t.Fatalf("bad cursor: %v", err)
	}
}
