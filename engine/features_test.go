package engine_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/sandbox"
)

func TestStatusChannelTimeline(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	m := script("work")
	m.StatusMode = delegate.StatusModeDetailed
	job := f.submit(m)
	p := f.started()
	p.Event("step 1: fetching")
	p.Event(`{"progress":"step 2: building","percent":50}`)
	eventually(t, "progress", func() bool {
		j, _ := f.eng.Get(context.Background(), job.ID)
		return j.Progress == "step 2: building (50%)"
	})
	p.Event(`{"type":"heartbeat"}`)
	p.Finish(sandbox.Exit{})
	f.wait(f.eng, job.ID)
	evs, err := f.eng.Timeline(context.Background(), job.ID)
	if err != nil || len(evs) != 2 || evs[0].Message != "step 1: fetching" || evs[1].Message != "step 2: building (50%)" {
		t.Fatalf("timeline: %+v %v", evs, err)
	}
	// statusMode simple keeps no timeline.
	m.StatusMode = delegate.StatusModeSimple
	job = f.submit(m)
	p = f.started()
	p.Event("step 1")
	p.Finish(sandbox.Exit{})
	f.wait(f.eng, job.ID)
	if evs, _ := f.eng.Timeline(context.Background(), job.ID); len(evs) != 0 {
		t.Fatalf("simple mode kept a timeline: %+v", evs)
	}
}

func TestClaudeStreamJSON(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	job := f.submit(delegate.Manifest{AgentType: delegate.AgentClaude, Task: "fix it", StatusMode: delegate.StatusModeDetailed})
	p := f.started()
	if !p.Sandbox.Spec.Network {
		t.Error("claude jobs get network egress by default")
	}
	p.Write([]byte(`{"type":"system","subtype":"init","model":"claude-x"}` + "\n" + `{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Edit"}]}}` + "\n"))
	p.Write([]byte(`{"type":"result","subtype":"success","is_er`))
	p.Write([]byte(`ror":false,"result":"Fixed the off-by-one."}` + "\n"))
	p.Finish(sandbox.Exit{})
	j := f.wait(f.eng, job.ID)
	if j.Result != "Fixed the off-by-one." {
		t.Fatalf("result %q", j.Result)
	}
	evs, _ := f.eng.Timeline(context.Background(), job.ID)
	var msgs []string
	for _, ev := range evs {
		msgs = append(msgs, ev.Message)
	}
	if strings.Join(msgs, "|") != "claude started (claude-x)|claude: using Edit|claude finished" {
		t.Fatalf("timeline %q", msgs)
	}
}

func TestSecretRedaction(t *testing.T) {
	const secret = "tok-3f9a8b7c6d5e"
	t.Setenv("DELEGATE_SECRET_API_TOKEN", secret)
	f := newFixture(t, engine.Config{})
	m := script("echo $API_TOKEN")
	m.Secrets = []string{"API_TOKEN"}
	m.StatusMode = delegate.StatusModeDetailed
	job := f.submit(m)
	p := f.started()
	// The secret straddles two writes; it also appears in a status line.
	p.Write([]byte("token is tok-3f9a"))
	p.Write([]byte("8b7c6d5e, again " + secret + "\n"))
	p.Event("using " + secret)
	p.Finish(sandbox.Exit{Code: 1})
	f.wait(f.eng, job.ID)
	if got := f.output(job.ID); got != "token is [REDACTED], again [REDACTED]\n" {
		t.Fatalf("stored output %q", got)
	}
	evs, _ := f.eng.Timeline(context.Background(), job.ID)
	if len(evs) != 1 || evs[0].Message != "using [REDACTED]" {
		t.Fatalf("timeline %+v", evs)
	}
	// Nothing in the database file carries the value.
	f.store.Close()
	for _, name := range []string{"jobs.db", "jobs.db-wal"} {
		matches, _ := filepath.Glob(filepath.Join(filepath.Dir(f.dbPath), name))
		for _, path := range matches {
			data, _ := os.ReadFile(path)
			if bytes.Contains(data, []byte(secret)) {
				t.Fatalf("%s contains the secret", path)
			}
		}
	}
}

func TestArtifacts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{ArtifactMaxFile: 10, ArtifactMaxTotal: 16})
	m := script("build")
	m.Artifacts = []string{"out/*.txt", "**/*.log", "big.bin"}
	job := f.submit(m)
	p := f.started()
	ctx := context.Background()
	for path, data := range map[string]string{
		"/workspace/out/a.txt":      "hello",
		"/workspace/out/skip.md":    "no",
		"/workspace/deep/x/run.log": "log!",
		"/workspace/big.bin":        "0123456789abc",
		"/workspace/out/b.txt":      "world!!",
	} {
		p.Sandbox.WriteFile(ctx, path, []byte(data), 0o644)
	}
	p.Finish(sandbox.Exit{})
	f.wait(f.eng, job.ID)
	arts, err := f.eng.Artifacts(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]delegate.Artifact{}
	for _, a := range arts {
		got[a.Name] = a
	}
	if len(got) != 4 || got["out/skip.md"].Name != "" {
		t.Fatalf("artifacts %+v", arts)
	}
	if !strings.Contains(got["big.bin"].Skipped, "per-file cap") || got["big.bin"].SHA256 != "" {
		t.Fatalf("big.bin: %+v", got["big.bin"])
	}
	// 5 + 4 bytes kept; the third small file passes the 16-byte job cap or not
	// depending on order, so count what was kept.
	var kept int64
	for name, a := range got {
		if a.Skipped != "" {
			continue
		}
		_, data, err := f.eng.ReadArtifact(ctx, job.ID, name)
		sum := sha256.Sum256(data)
		if err != nil || hex.EncodeToString(sum[:]) != a.SHA256 || int64(len(data)) != a.Size {
			t.Fatalf("%s: %v", name, err)
		}
		kept += a.Size
	}
	if kept > 16 || kept < 9 {
		t.Fatalf("kept %d bytes of artifacts", kept)
	}
	if _, _, err := f.eng.ReadArtifact(ctx, job.ID, "big.bin"); err == nil {
		t.Fatal("a skipped artifact was readable")
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	ctx := context.Background()
	first, err := f.eng.Submit(ctx, script("once"), delegate.SubmitOptions{IdempotencyKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := f.eng.Submit(ctx, script("once"), delegate.SubmitOptions{IdempotencyKey: "k1"})
	if err != nil || again.ID != first.ID {
		t.Fatalf("retry made %v (%v), want %s", again, err, first.ID)
	}
	other, _ := f.eng.Submit(ctx, script("once"), delegate.SubmitOptions{IdempotencyKey: "k2"})
	if other.ID == first.ID {
		t.Fatal("a different key returned the same job")
	}
	f.started().Finish(sandbox.Exit{})
	f.started().Finish(sandbox.Exit{})
	select {
	case p := <-f.backend.Started:
		t.Fatalf("the work ran a third time: %v", p.Cmd.Args)
	default:
	}
}

// TestIdempotencyKeyOtherManifest: a key sent again with another manifest
// is refused, naming the key, saying why and giving the first job's id;
// the manifest as submitted is what counts (defaults applied to the first
// do not make its retry differ), and nothing new is stored or run.
func TestIdempotencyKeyOtherManifest(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	ctx := context.Background()
	m := script("once")
	m.Env = map[string]string{"A": "1", "B": "2"}
	first, err := f.eng.Submit(ctx, m, delegate.SubmitOptions{IdempotencyKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	retry := script("once")
	retry.Env = map[string]string{"B": "2", "A": "1"}
	if again, err := f.eng.Submit(ctx, retry, delegate.SubmitOptions{IdempotencyKey: "k1"}); err != nil || again.ID != first.ID {
		t.Fatalf("the same request again: %v, %v; want job %s", again, err, first.ID)
	}
	for _, change := range []func(*delegate.Manifest){
		func(m *delegate.Manifest) { m.Task = "twice" },
		func(m *delegate.Manifest) { m.Env["A"] = "other" },
		func(m *delegate.Manifest) { m.Timeout = new(3600) }, // the default, but not what was sent
	} {
		other := script("once")
		other.Env = map[string]string{"A": "1", "B": "2"}
		change(&other)
		_, err := f.eng.Submit(ctx, other, delegate.SubmitOptions{IdempotencyKey: "k1"})
		var conflict *delegate.IdempotencyConflictError
		if !errors.As(err, &conflict) || conflict.JobID != first.ID || delegate.ErrorKind(err) != delegate.KindConflict {
			t.Fatalf("another manifest with the key: %v", err)
		}
		for _, want := range []string{`"k1"`, first.ID, "different manifest"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q does not say %s", err, want)
			}
		}
	}
	page, err := f.eng.List(ctx, delegate.ListOptions{})
	if err != nil || len(page.Jobs) != 1 {
		t.Fatalf("jobs stored: %+v %v", page, err)
	}
}

// TestEgressRefusedAtSubmit: a job that needs network egress on a backend
// that cannot give it is refused when it is submitted, with the backend's
// reason (what the host lacks and the install line) — network: egress
// asked for, and a claude job, whose default it is; nothing is stored.
func TestEgressRefusedAtSubmit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{Secret: func(string) (string, bool) { return "k", true }})
	f.backend.Caps.NetworkEgress = false
	f.backend.Caps.NetworkEgressMissing = "neither pasta nor slirp4netns is on this server's PATH: apt-get install passt"
	ctx := context.Background()
	egress := script("curl example.com")
	egress.Network = delegate.Egress()
	claude := delegate.Manifest{AgentType: delegate.AgentClaude, Task: "fix it"}
	for _, tc := range []struct {
		name string
		m    delegate.Manifest
		want []string
	}{
		{"asked", egress, []string{"egress is not available", "apt-get install passt", "network: none"}},
		{"claude's default", claude, []string{"claude job needs network egress by default", "apt-get install passt", "network: none"}},
	} {
		_, err := f.eng.Submit(ctx, tc.m, delegate.SubmitOptions{})
		var fe *delegate.FieldError
		if !errors.As(err, &fe) || fe.Field != "manifest.network" {
			t.Fatalf("%s: %v, want a field error on manifest.network", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(fe.Rule, w) {
				t.Errorf("%s: %q does not say %q", tc.name, fe.Rule, w)
			}
		}
	}
	claude.Network = delegate.Network{Mode: delegate.NetworkNone} // the submitter's choice: no network, allowed
	if _, err := f.eng.Submit(ctx, claude, delegate.SubmitOptions{}); err != nil {
		t.Fatalf("claude with network none: %v", err)
	}
	if page, err := f.eng.List(ctx, delegate.ListOptions{}); err != nil || len(page.Jobs) != 1 {
		t.Fatalf("jobs stored: %+v %v", page, err)
	}
}
