package engine_test

import (
	"context"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

// TestReadSideAlone: the read side works over the store alone, and an
// engine made without a backend refuses to run a job with a reason
// instead of crashing.
func TestReadSideAlone(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	j := f.submit(script("echo hi"))
	p := f.started()
	p.Write([]byte("hi\n"))
	p.Finish(sandbox.Exit{})
	f.wait(f.eng, j.ID)

	r := engine.NewReader(f.store, f.cfg.ArtifactDir)
	ctx := context.Background()
	got, err := r.Get(ctx, j.ID)
	if err != nil || got.Status != delegate.StatusSuccess {
		t.Fatalf("Get: %+v %v", got, err)
	}
	res, err := r.Result(ctx, j.ID, delegate.ResultOptions{})
	if err != nil || string(res.Output) != "hi\n" {
		t.Fatalf("Result: %+v %v", res, err)
	}
	if page, err := r.List(ctx, delegate.ListOptions{}); err != nil || len(page.Jobs) != 1 {
		t.Fatalf("List: %+v %v", page, err)
	}
	if w, err := r.Wait(ctx, j.ID); err != nil || w.Status != delegate.StatusSuccess {
		t.Fatalf("Wait: %+v %v", w, err)
	}

	readOnly := engine.New(f.store, nil, f.cfg)
	defer readOnly.Close()
	_, err = readOnly.Submit(ctx, script("true"), delegate.SubmitOptions{})
	if err == nil || !strings.Contains(err.Error(), "no sandbox backend") {
		t.Fatalf("Submit without a backend: %v", err)
	}
	if got, err := readOnly.Get(ctx, j.ID); err != nil || got.ID != j.ID {
		t.Fatalf("read-only Get: %+v %v", got, err)
	}
}

// TestTaskAloneIsAScript: a manifest with a task and no agent type runs
// the task as a shell script, and says so in the stored manifest.
func TestTaskAloneIsAScript(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	j := f.submit(delegate.Manifest{Task: "echo hi"})
	if j.Manifest.AgentType != delegate.AgentScript {
		t.Fatalf("agentType %q, want script", j.Manifest.AgentType)
	}
	p := f.started()
	if got := strings.Join(p.Cmd.Args, " "); !strings.Contains(got, "/bin/sh") {
		t.Errorf("command %q, want the shell", got)
	}
	p.Finish(sandbox.Exit{})
	f.wait(f.eng, j.ID)
}
