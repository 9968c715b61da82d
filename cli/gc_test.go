package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/cli"
	"github.com/delegate-dev/delegate/mock"
)

type gcService struct {
	*mock.JobService
	got []delegate.PruneOptions
	p   delegate.Pruned
}

func (g *gcService) GC(_ context.Context, opts delegate.PruneOptions) (*delegate.Pruned, error) {
	g.got = append(g.got, opts)
	p := g.p
	return &p, nil
}

// TestGC: `delegate gc` prunes through the service and prints what it
// freed; --dry-run asks for a dry run and says "would".
func TestGC(t *testing.T) {
	before := time.Date(2026, 11, 7, 4, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		args []string
		dry  bool
		want []string
	}{
		{[]string{"gc"}, false, []string{"Removed what ended before", "3 jobs: 5.0 MiB (output 4.0 MiB, workspaces 512.0 KiB)", "2 artifact files: 2.0 KiB", "1 kept sandboxes, 4 networks"}},
		{[]string{"gc", "--dry-run"}, true, []string{"Would remove what ended before", "3 jobs"}},
	} {
		h := newHarness()
		g := &gcService{JobService: h.svc, p: delegate.Pruned{Jobs: 3, Sandboxes: 1, Networks: 4, Bytes: 5 << 20, OutputBytes: 4 << 20,
			WorkspaceBytes: 512 << 10, ArtifactFiles: 2, ArtifactBytes: 2 << 10, Before: before}}
		h.other = g
		r := h.run(t, tc.args...)
		if r.code != 0 || len(g.got) != 1 || g.got[0].DryRun != tc.dry {
			t.Fatalf("%v: exit %d (%s), asked %+v", tc.args, r.code, r.stderr, g.got)
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("%v prints %q, without %q", tc.args, r.stdout, w)
			}
		}
	}
	h := newHarness()
	h.other = &gcService{JobService: h.svc}
	if r := h.run(t, "gc"); r.code != 0 || !strings.Contains(r.stdout, "Retention is off") {
		t.Errorf("retention off: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// TestRetentionConfig: DELEGATE_RETENTION and DELEGATE_MIN_FREE, read or
// refused naming the variable.
func TestRetentionConfig(t *testing.T) {
	for _, tc := range []struct {
		env       map[string]string
		retention time.Duration
		minFree   int64
		bad       string
	}{
		{map[string]string{}, 0, 0, ""},
		{map[string]string{"DELEGATE_RETENTION": "7d", "DELEGATE_MIN_FREE": "64M"}, 7 * 24 * time.Hour, 64 << 20, ""},
		{map[string]string{"DELEGATE_RETENTION": "90m", "DELEGATE_MIN_FREE": "0"}, 90 * time.Minute, -1, ""},
		{map[string]string{"DELEGATE_RETENTION": "0"}, -1, 0, ""},
		{map[string]string{"DELEGATE_RETENTION": "10s"}, 0, 0, "DELEGATE_RETENTION"},
		{map[string]string{"DELEGATE_RETENTION": "soon"}, 0, 0, "DELEGATE_RETENTION"},
		{map[string]string{"DELEGATE_MIN_FREE": "lots"}, 0, 0, "DELEGATE_MIN_FREE"},
	} {
		cfg, err := cli.LoadConfig(func(k string) string { return tc.env[k] })
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("%v: %v, want an error naming %s", tc.env, err, tc.bad)
			}
			continue
		}
		if err != nil || cfg.Retention != tc.retention || cfg.MinFree != tc.minFree {
			t.Errorf("%v: retention %v, min free %d, %v", tc.env, cfg.Retention, cfg.MinFree, err)
		}
	}
}

// TestJobsListSaysEnded: a running job whose end its sandbox recorded (the
// service gives its exit code) is listed as ended, not recorded yet.
func TestJobsListSaysEnded(t *testing.T) {
	h := newHarness()
	h.svc.ListFn = func(ctx context.Context, opts delegate.ListOptions) (*delegate.JobPage, error) {
		return &delegate.JobPage{Jobs: []delegate.JobSummary{
			{ID: "job-1", Status: delegate.StatusRunning, Task: "make", ExitCode: intp(0)},
			{ID: "job-2", Status: delegate.StatusRunning, Task: "make"},
		}}, nil
	}
	r := h.run(t, "jobs", "list")
	if r.code != 0 || !strings.Contains(r.stdout, "job-1  running (ended, not recorded yet)") || strings.Count(r.stdout, "ended") != 1 {
		t.Errorf("jobs list:\n%s", r.stdout)
	}
}
