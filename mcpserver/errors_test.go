package mcpserver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func connectLogged(t *testing.T, svc delegate.JobService) (*mcp.ClientSession, *testkit.Log) {
	t.Helper()
	log, logs := testkit.NewLog()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	server := newServer(ctx, svc, log)
	clientT, serverT := mcp.NewInMemoryTransports()
	ss, err := server.Connect(ctx, serverT, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, clientT, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Close() })
	return cs, logs
}

// TestToolErrorTable: each kind of error reaches the agent in our words
// with what to do next; an error of no kind of ours (SQL, the Proxmox
// API) is logged in full and the agent reads which call failed and what
// to do, never the text.
func TestToolErrorTable(t *testing.T) {
	const sqlText = "SQL logic error: no such table: job_artifacts (1)"
	const pveText = "pve: POST /nodes/pve1/qemu/101/status/stop: 500 can't lock file '/var/lock/qemu-server/lock-101.conf' - got timeout"
	for _, tc := range []struct {
		name     string
		err      error
		want     string
		logged   string // in the server's log ("" nothing)
		notShown string
	}{
		{"a job", delegate.JobNotFound("job-x"), `job_id: job "job-x": not found (list_jobs shows existing jobs)`, "", ""},
		{"not found without a resource", fmt.Errorf("job job-x: %w", delegate.ErrNotFound),
			"job_id: job job-x: not found (list_jobs shows existing jobs)", "", ""},
		{"an artifact", delegate.ArtifactNotFound("job-x", "out/a.txt"),
			`artifact "out/a.txt" of job job-x: not found (get_job_result lists the job's artifacts)`, "", "job_id"},
		{"not finished", fmt.Errorf("job job-x is running: %w", delegate.ErrNotFinished),
			"job job-x is running: job not finished (wait_job waits for it)", "", ""},
		{"a field", &delegate.FieldError{Field: "max_output_bytes", Rule: "must be positive"}, "max_output_bytes: must be positive", "", ""},
		{"terminal", delegate.Transition(delegate.StatusCancelled, delegate.StatusRunning), "job already finished: job is already cancelled", "", ""},
		{"a store's own words", fmt.Errorf("get job job-x: %w", errors.New(sqlText)),
			"get_job_result failed on the server (the server's log says why); call it again", sqlText, "SQL"},
		{"Proxmox's own words", fmt.Errorf("release the sandbox of job job-x: %w", errors.New(pveText)),
			"get_job_result failed on the server", pveText, "lock-101"},
		{"no space", fmt.Errorf("open sandbox: %w", &delegate.NoSpaceError{Dir: "/data", Free: 3 << 20, Err: errors.New("database or disk is full (13)")}),
			"no space left on /data (3.0 MiB free): free space there", "database or disk is full", "(13)"},
		{"unavailable", fmt.Errorf("%w: %s", delegate.ErrUnavailable, pveText),
			"the sandbox backend or the job store does not answer now; call get_job_result again in a minute", pveText, "lock-101"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newService()
			s.ResultFn = func(context.Context, string, delegate.ResultOptions) (*delegate.JobResult, error) { return nil, tc.err }
			cs, logs := connectLogged(t, s)
			res := call(t, cs, "get_job_result", map[string]any{"job_id": "job-x"})
			if !res.IsError {
				t.Fatal("no error")
			}
			got := errorText(res)
			if !strings.Contains(got, tc.want) {
				t.Errorf("the agent reads %q; want %q", got, tc.want)
			}
			if tc.notShown != "" && strings.Contains(got, tc.notShown) {
				t.Errorf("the agent reads %q, which has %q", got, tc.notShown)
			}
			if tc.logged != "" && !strings.Contains(logs.String(), tc.logged) {
				t.Errorf("the log lacks the error in full (%q):\n%s", tc.logged, logs)
			}
			if tc.logged == "" && strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("an error of a known kind was logged as an error:\n%s", logs)
			}
		})
	}
}

// TestFailingStore: a real engine whose store fails (its database closed
// under it) answers every job tool with a short message, never the
// database's words, and logs those; resources likewise.
func TestFailingStore(t *testing.T) {
	ctx := context.Background()
	store := testkit.OpenStore(t)
	now := time.Now().UTC()
	if err := store.CreateJob(ctx, &delegate.Job{ID: "job-1", Status: delegate.StatusPending, CreatedAt: now, UpdatedAt: now,
		Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: "true"}}); err != nil {
		t.Fatal(err)
	}
	eng := engine.New(store, nil, engine.Config{ArtifactDir: t.TempDir()})
	t.Cleanup(func() { eng.Close() })
	cs, logs := connectLogged(t, eng)

	// Before it fails: a missing artifact says which, not a missing job.
	if _, _, err := eng.ReadArtifact(ctx, "job-1", "nope.txt"); err == nil || err.Error() != `artifact "nope.txt" of job job-1: not found (the job kept no artifacts)` {
		t.Errorf("the engine's missing artifact: %v", err)
	}
	// Every resource error is a JSON-RPC error with a code (never 0), in
	// words that say what is so: the artifact missing, not the job; a
	// job's diff before it is known (issue 40, items 4 and 5).
	if err := store.CreateJob(ctx, &delegate.Job{ID: "job-2", Status: delegate.StatusProvisioning, CreatedAt: now, UpdatedAt: now,
		Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: "true", Workspace: &delegate.WorkspaceSource{Dir: "/src/p"}}}); err != nil {
		t.Fatal(err)
	}
	for uri, want := range map[string]struct {
		code int64
		says string
	}{
		"job://job-1/artifacts/nope.txt": {mcp.CodeResourceNotFound, `artifact "nope.txt" of job job-1: not found (the job kept no artifacts)`},
		"job://job-2/diff":               {jsonrpc.CodeInvalidParams, "job job-2 is provisioning: job not finished: its changes are known when it ends (wait_job)"},
		"job://job-1/diff":               {mcp.CodeResourceNotFound, `job "job-1": has no workspace: it was submitted without manifest.workspace`},
	} {
		_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		var wire *jsonrpc.Error
		if !errors.As(err, &wire) || wire.Code != want.code || wire.Message != want.says {
			t.Errorf("%s: %#v, want code %d saying %q", uri, err, want.code, want.says)
		}
	}
	store.Close()
	for _, tool := range []string{"get_job_status", "get_job_result", "get_job_logs", "wait_job", "cancel_job"} {
		args := map[string]any{"job_id": "job-1"}
		if tool == "wait_job" {
			args["timeout_seconds"] = 1
		}
		res := call(t, cs, tool, args)
		got := errorText(res)
		if !res.IsError || !strings.HasPrefix(got, tool+" failed on the server") || strings.Contains(got, "sql") || strings.Contains(got, "database") {
			t.Errorf("%s over a failing store: error %v, %q", tool, res.IsError, got)
		}
	}
	if res := call(t, cs, "list_jobs", nil); !res.IsError || strings.Contains(errorText(res), "database") {
		t.Errorf("list_jobs over a failing store: %q", errorText(res))
	}
	_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "job://job-1"})
	if err == nil || strings.Contains(err.Error(), "database") || !strings.Contains(err.Error(), "failed on the server") {
		t.Errorf("a resource over a failing store: %v", err)
	}
	if n := strings.Count(logs.String(), "database is closed"); n < 6 {
		t.Errorf("the store's errors were logged %d times, want one per failed call:\n%s", n, logs)
	}
}
