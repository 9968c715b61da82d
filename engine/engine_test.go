package engine_test

import (
	"context"
	"encoding/base64"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
	"github.com/delegate-dev/delegate/sqlite"
	"github.com/delegate-dev/delegate/storetest"
)

type fixture struct {
	t       testing.TB
	dbPath  string
	store   *sqlite.DB
	backend *sandboxtest.Fake
	eng     *engine.Engine
	cfg     engine.Config
}

func newFixture(t testing.TB, cfg engine.Config) *fixture {
	t.Helper()
	dbPath := filepath.Join(t.TempDir(), "jobs.db")
	store, err := sqlite.Open(context.Background(), dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cfg.Defaults = delegate.Defaults{Timeout: 60, CPU: 1, Memory: "64M", Disk: "16M"}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	if cfg.ArtifactDir == "" {
		cfg.ArtifactDir = t.TempDir()
	}
	f := &fixture{t: t, dbPath: dbPath, store: store, backend: sandboxtest.NewFake(), cfg: cfg}
	f.eng = f.start(f.backend)
	return f
}

func (f *fixture) start(b sandbox.Backend) *engine.Engine {
	f.t.Helper()
	eng := engine.New(f.store, b, f.cfg)
	if err := eng.Start(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { eng.Close() })
	return eng
}

func (f *fixture) submit(m delegate.Manifest) *delegate.Job {
	f.t.Helper()
	j, err := f.eng.Submit(context.Background(), m, delegate.SubmitOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return j
}

func (f *fixture) started() *sandboxtest.Process {
	f.t.Helper()
	select {
	case p := <-f.backend.Started:
		return p
	case <-time.After(5 * time.Second):
		f.t.Fatal("no process started")
		return nil
	}
}

func (f *fixture) wait(eng *engine.Engine, id string) *delegate.Job {
	f.t.Helper()
	// A hang guard: generous, since CI machines can be loaded many times
	// over (TestQuestionFlood's 2 s job took longer than 10 s to end there).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	j, err := eng.Wait(ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	if !j.Status.Terminal() {
		f.t.Fatalf("job %s still %s", id, j.Status)
	}
	return j
}

func (f *fixture) output(id string) string {
	b, err := f.store.ReadOutput(context.Background(), id, 0, 1<<20)
	if err != nil {
		f.t.Fatal(err)
	}
	return string(delegate.JoinOutput(b))
}

// passTime lets d pass on a synctest bubble's clock: every timer of the
// bubble due within it fires, in order, at once and alike on any machine.
// (synctest.Wait panics outside a bubble, where a sleep would be a guess.)
func passTime(d time.Duration) {
	synctest.Wait()
	time.Sleep(d) // on the bubble's clock (see above)
	synctest.Wait()
}

// awaitJob waits until cond holds of job id as eng reads it, woken by the
// engine's changes (Watch) rather than a timer, for up to 30 s.
func awaitJob(t testing.TB, eng *engine.Engine, id, what string, cond func(*delegate.Job) bool) *delegate.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	changed := eng.Watch(ctx) // before the first read: no change after it is missed
	for {
		j, err := eng.Get(ctx, id)
		if err == nil && cond(j) {
			return j
		}
		select {
		case <-changed: // some job changed (a watcher that lags misses a wake-up, not the state: read again)
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s: job %s is %+v (%v)", what, id, j, err)
		}
	}
}

// eventually polls cond for up to 5 s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, 5*time.Second, what, cond)
}

// eventuallyWithin polls cond until it holds, failing the test after d
// (testkit.Eventually): what cond reads (the store, a fake or real
// sandbox, a process) announces no event a test could wait on. In a
// synctest bubble the polls are on the bubble's clock, which moves only
// once every other goroutine of the bubble waits.
func eventuallyWithin(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, d, what, cond)
}

func script(task string) delegate.Manifest {
	return delegate.Manifest{AgentType: delegate.AgentScript, Task: task}
}

func TestJobEndings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		exit       sandbox.Exit
		wantStatus delegate.Status
		wantError  string
	}{
		{"success", sandbox.Exit{Code: 0}, delegate.StatusSuccess, ""},
		{"exit code", sandbox.Exit{Code: 3}, delegate.StatusFailed, "exit code 3"},
		{"signal", sandbox.Exit{Code: 139, Signal: "segmentation fault"}, delegate.StatusFailed, "killed by signal segmentation fault"},
		{"oom", sandbox.Exit{Code: 137, Signal: "killed", OOMKilled: true}, delegate.StatusFailed, "out of memory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, engine.Config{})
			job := f.submit(script("echo hi"))
			p := f.started()
			p.Write([]byte("hello "))
			p.Write([]byte("world"))
			p.Finish(tc.exit)
			j := f.wait(f.eng, job.ID)
			if j.Status != tc.wantStatus || !strings.Contains(j.Error, tc.wantError) {
				t.Fatalf("got %s %q, want %s %q", j.Status, j.Error, tc.wantStatus, tc.wantError)
			}
			if j.ExitCode == nil || *j.ExitCode != tc.exit.Code || j.OOMKilled != tc.exit.OOMKilled {
				t.Fatalf("exit code %v oom %v", j.ExitCode, j.OOMKilled)
			}
			if got := f.output(job.ID); got != "hello world" || j.OutputBytes != 11 || j.OutputTruncated {
				t.Fatalf("output %q bytes %d truncated %v", got, j.OutputBytes, j.OutputTruncated)
			}
			if j.StartedAt.IsZero() || j.FinishedAt.Before(j.StartedAt) {
				t.Fatalf("timestamps %v %v", j.StartedAt, j.FinishedAt)
			}
			eventually(t, "sandbox destroyed", func() bool { return f.backend.Len() == 0 })
		})
	}
}

func TestCommandAndEnv(t *testing.T) {
	t.Setenv("DELEGATE_SECRET_TOKEN", "s3cret")
	f := newFixture(t, engine.Config{})
	tricky := `it's "quoted"; $(rm -rf /) && echo pwned`
	// The command lines are fixed: the task and the script are inputs
	// (files only the job's user reads), never arguments, which every
	// user of the host can read.
	shArgs := []string{"/bin/sh", "-c", `exec /bin/sh "$DELEGATE_INPUTS/script"`}
	tests := []struct {
		m          delegate.Manifest
		wantArgs   []string
		wantInputs map[string]string
		wantStdin  string
	}{
		{script("echo hi"), shArgs, map[string]string{"script": "echo hi"}, ""},
		{delegate.Manifest{AgentType: delegate.AgentScript, Task: tricky, Agent: &delegate.AgentConfig{Command: "make"}}, shArgs, map[string]string{"script": "make"}, ""},
		{delegate.Manifest{AgentType: delegate.AgentCustom, Task: tricky, Agent: &delegate.AgentConfig{Command: "./run"}}, shArgs, map[string]string{"script": "./run"}, ""},
		{delegate.Manifest{AgentType: delegate.AgentClaude, Task: tricky, Agent: &delegate.AgentConfig{ClaudeModel: "opus"}},
			[]string{"claude", "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions", "--model", "opus"},
			map[string]string{"prompt": tricky}, "prompt"},
		// The submitter's standard input: one more input, the process's stdin.
		{delegate.Manifest{AgentType: delegate.AgentScript, Task: "cat", Stdin: "aW4K"}, shArgs, map[string]string{"script": "cat", "stdin": "in\n"}, "stdin"},
		{delegate.Manifest{AgentType: delegate.AgentCustom, Task: tricky, Agent: &delegate.AgentConfig{Command: "wc -l"}, Stdin: "YQpiCg=="}, shArgs,
			map[string]string{"script": "wc -l", "stdin": "a\nb\n"}, "stdin"},
	}
	for _, tc := range tests {
		tc.m.Env = map[string]string{"FOO": "a b;c"}
		tc.m.Secrets = []string{"TOKEN"}
		tc.m.Files = []delegate.File{{Path: "in/data.txt", Content: "aGk="}}
		job := f.submit(tc.m)
		p := f.started()
		if !slices.Equal(p.Cmd.Args, tc.wantArgs) {
			t.Errorf("%s: args %q, want %q", tc.m.AgentType, p.Cmd.Args, tc.wantArgs)
		}
		inputs := map[string]string{}
		for k, v := range p.Cmd.Inputs {
			inputs[k] = string(v)
		}
		if !maps.Equal(inputs, tc.wantInputs) || p.Cmd.Stdin != tc.wantStdin {
			t.Errorf("%s: inputs %q stdin %q, want %q %q", tc.m.AgentType, inputs, p.Cmd.Stdin, tc.wantInputs, tc.wantStdin)
		}
		for _, a := range p.Cmd.Args {
			if strings.Contains(a, "rm -rf") {
				t.Errorf("%s: the task is in the arguments: %q", tc.m.AgentType, p.Cmd.Args)
			}
		}
		for _, want := range []string{"FOO=a b;c", "TOKEN=s3cret", "DELEGATE_JOB_ID=" + job.ID, "DELEGATE_TASK=" + tc.m.Task, "HOME=/workspace", "PYTHONDONTWRITEBYTECODE=1"} {
			if !slices.Contains(p.Cmd.Env, want) {
				t.Errorf("%s: env lacks %q: %q", tc.m.AgentType, want, p.Cmd.Env)
			}
		}
		if data, _ := p.Sandbox.File("/workspace/in/data.txt"); string(data) != "hi" {
			t.Errorf("file not injected: %q", data)
		}
		if p.Sandbox.Spec.MemoryBytes != 64<<20 || p.Sandbox.Spec.CPU != 1 || p.Sandbox.Spec.DiskBytes != 16<<20 {
			t.Errorf("spec %+v", p.Sandbox.Spec)
		}
		p.Finish(sandbox.Exit{})
		f.wait(f.eng, job.ID)
		stored, _ := f.store.GetJob(context.Background(), job.ID)
		if strings.Contains(stored.Manifest.Task+strings.Join(slices.Collect(mapValues(stored.Manifest.Env)), ""), "s3cret") {
			t.Error("secret value stored in the job record")
		}
	}
}

// TestScriptNamedWhereInputsAreFixed: a backend whose commands all find
// their inputs at one path (local) gets the script by that path, one
// shell and no job text in the arguments.
func TestScriptNamedWhereInputsAreFixed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	f.backend.Caps.InputsDir = "/run/delegate/inputs"
	job := f.submit(script("echo $(rm -rf /)"))
	p := f.started()
	if want := []string{"/bin/sh", "/run/delegate/inputs/script"}; !slices.Equal(p.Cmd.Args, want) {
		t.Errorf("args %q, want %q", p.Cmd.Args, want)
	}
	if string(p.Cmd.Inputs["script"]) != "echo $(rm -rf /)" {
		t.Errorf("script input %q", p.Cmd.Inputs["script"])
	}
	p.Finish(sandbox.Exit{})
	f.wait(f.eng, job.ID)
}

func mapValues(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// TestSubmitStartsAtOnce: a job submitted while a run slot is free is
// stored claimed (provisioning) and starts with the files it was given;
// one submitted while none is free waits (pending), starts when the slot
// frees, and gets its files from the store. (BenchmarkRoundTrip counts
// the writes: the first's claim is its submission.)
func TestSubmitStartsAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{MaxConcurrent: 1})
	withFile := func(task, data string) delegate.Manifest {
		m := script(task)
		m.Files = []delegate.File{{Path: "in.txt", Content: base64.StdEncoding.EncodeToString([]byte(data))}}
		return m
	}
	first := f.submit(withFile("first", "one"))
	if first.Status != delegate.StatusProvisioning {
		t.Fatalf("submitted with a free slot: %s, want provisioning", first.Status)
	}
	p := f.started()
	if data, _ := p.Sandbox.File("/workspace/in.txt"); string(data) != "one" {
		t.Errorf("the first job's file: %q", data)
	}
	second := f.submit(withFile("second", "two"))
	if second.Status != delegate.StatusPending {
		t.Fatalf("submitted with no free slot: %s, want pending", second.Status)
	}
	p.Finish(sandbox.Exit{})
	if j := f.wait(f.eng, first.ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("first job: %s %s", j.Status, j.Error)
	}
	q := f.started()
	if data, _ := q.Sandbox.File("/workspace/in.txt"); string(data) != "two" {
		t.Errorf("the queued job's file: %q", data)
	}
	q.Finish(sandbox.Exit{})
	if j := f.wait(f.eng, second.ID); j.Status != delegate.StatusSuccess {
		t.Fatalf("second job: %s %s", j.Status, j.Error)
	}
}

func TestSubmitRejects(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{})
	_, err := f.eng.Submit(context.Background(), delegate.Manifest{AgentType: delegate.AgentScript, Task: "x", Secrets: []string{"MISSING"}}, delegate.SubmitOptions{})
	var fe *delegate.FieldError
	if !errors.As(err, &fe) || fe.Field != "manifest.secrets[0]" || !strings.Contains(fe.Rule, "DELEGATE_SECRET_MISSING") {
		t.Fatalf("unknown secret: %v", err)
	}
	if _, err := f.eng.Submit(context.Background(), delegate.Manifest{AgentType: "nope"}, delegate.SubmitOptions{}); !errors.Is(err, delegate.ErrInvalid) {
		t.Fatalf("bad manifest: %v", err)
	}
	jobs, _, _ := f.store.ListJobs(context.Background(), delegate.JobFilter{})
	if len(jobs) != 0 {
		t.Fatalf("rejected submissions were stored: %d", len(jobs))
	}
}

// TestTimeoutKills runs in a synctest bubble: the job's 1 s timeout
// passes on the bubble's clock, at once and in the same order on any
// machine.
func TestTimeoutKills(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testTimeoutKills)
}

func testTimeoutKills(t *testing.T) {
	f := newFixture(t, engine.Config{})
	m := script("sleep 100")
	m.Timeout = new(1)
	job := f.submit(m)
	p := f.started()
	j := f.wait(f.eng, job.ID)
	if j.Status != delegate.StatusTimeout || !strings.Contains(j.Error, "timed out after 1s") || !p.Killed() {
		t.Fatalf("got %s %q killed=%v", j.Status, j.Error, p.Killed())
	}
	eventually(t, "sandbox destroyed", func() bool { return f.backend.Len() == 0 })
}

func TestCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("running", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		job := f.submit(script("sleep 100"))
		p := f.started()
		j, cancelled, err := f.eng.Cancel(ctx, job.ID)
		if err != nil || !cancelled || j.Status != delegate.StatusCancelled {
			t.Fatalf("cancel: %v %v %v", j, cancelled, err)
		}
		eventually(t, "process killed", p.Killed)
		eventually(t, "sandbox destroyed", func() bool { return f.backend.Len() == 0 })
		p.Finish(sandbox.Exit{Code: 0}) // a late exit changes nothing
		j = f.wait(f.eng, job.ID)
		if j.Status != delegate.StatusCancelled {
			t.Fatalf("after late exit: %s", j.Status)
		}
		// Cancelling again is harmless and says so.
		if _, cancelled, err := f.eng.Cancel(ctx, job.ID); err != nil || cancelled {
			t.Fatalf("second cancel: %v %v", cancelled, err)
		}
	})
	t.Run("pending", func(t *testing.T) {
		f := newFixture(t, engine.Config{MaxConcurrent: 1})
		first := f.submit(script("sleep 100"))
		p := f.started()
		queued := f.submit(script("echo never"))
		if _, _, err := f.eng.Cancel(ctx, queued.ID); err != nil {
			t.Fatal(err)
		}
		p.Finish(sandbox.Exit{})
		f.wait(f.eng, first.ID)
		select {
		case p := <-f.backend.Started:
			t.Fatalf("cancelled pending job started: %v", p.Cmd.Args)
		case <-time.After(100 * time.Millisecond):
		}
		if j, _ := f.eng.Get(ctx, queued.ID); j.Status != delegate.StatusCancelled || !j.StartedAt.IsZero() {
			t.Fatalf("queued job: %s", j.Status)
		}
	})
	t.Run("provisioning", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		entered := make(chan struct{})
		f.backend.CreateHook = func(ctx context.Context, spec sandbox.Spec) error {
			close(entered)
			<-ctx.Done() // a slow provisioning step, aborted by the cancel
			return ctx.Err()
		}
		job := f.submit(script("x"))
		<-entered
		if _, _, err := f.eng.Cancel(ctx, job.ID); err != nil {
			t.Fatal(err)
		}
		j := f.wait(f.eng, job.ID)
		if j.Status != delegate.StatusCancelled {
			t.Fatalf("status %s", j.Status)
		}
	})
	t.Run("by another process", func(t *testing.T) {
		f := newFixture(t, engine.Config{})
		job := f.submit(script("sleep 100"))
		p := f.started()
		// A second engine on the same store (like `delegate jobs cancel`).
		other := engine.New(f.store, nil, engine.Config{})
		if _, _, err := other.Cancel(ctx, job.ID); err != nil {
			t.Fatal(err)
		}
		eventually(t, "process killed", p.Killed)
	})
}

// TestFinishRaces: a process ending, a cancel and a timeout racing each
// other must leave exactly one terminal status that never changes.
func TestFinishRaces(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, engine.Config{MaxConcurrent: 8})
		ctx := context.Background()
		for i := range 20 {
			m := script("race")
			m.Timeout = new(1)
			job := f.submit(m)
			p := f.started()
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); p.Finish(sandbox.Exit{Code: i % 2}) }()
			go func() { defer wg.Done(); f.eng.Cancel(ctx, job.ID) }()
			wg.Wait()
			j := f.wait(f.eng, job.ID)
			// Its run is over once its sandbox is gone: nothing of it
			// may change the job after that.
			eventually(t, "the sandbox destroyed", func() bool {
				_, err := f.backend.Recover(ctx, p.Sandbox.ID())
				return errors.Is(err, sandbox.ErrGone)
			})
			again, _ := f.eng.Get(ctx, job.ID)
			if again.Status != j.Status || again.FinishedAt != j.FinishedAt {
				t.Fatalf("round %d: terminal status moved from %s to %s", i, j.Status, again.Status)
			}
		}
	})
}

func TestOutputLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, engine.Config{OutputLimit: 10})
	job := f.submit(script("yes"))
	p := f.started()
	p.Write([]byte(strings.Repeat("x", 100)))
	p.Finish(sandbox.Exit{})
	j := f.wait(f.eng, job.ID)
	if got := f.output(job.ID); len(got) != 10 || j.OutputBytes != 100 || !j.OutputTruncated {
		t.Fatalf("kept %d bytes, counted %d, truncated %v", len(got), j.OutputBytes, j.OutputTruncated)
	}
}

func TestRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dead := func(string) bool { return false }
	f := newFixture(t, engine.Config{MaxConcurrent: 2, OwnerAlive: dead})
	running := f.submit(script("long"))
	p := f.started()
	p.Write([]byte("before "))
	lost := f.submit(script("lost"))
	lostProc := f.started()
	eventually(t, "both running", func() bool {
		a, _ := f.eng.Get(ctx, running.ID)
		b, _ := f.eng.Get(ctx, lost.ID)
		return a.Status == delegate.StatusRunning && b.Status == delegate.StatusRunning && a.OutputBytes == 7
	})
	queued := f.submit(script("queued"))
	// The server dies: its goroutines stop, the sandboxes go on.
	f.eng.Close()
	f.backend.Destroy(ctx, lostProc.Sandbox.ID()) // this one did not survive

	eng2 := f.start(f.backend)
	p.Write([]byte("after"))
	p.Finish(sandbox.Exit{})
	if j := f.wait(eng2, running.ID); j.Status != delegate.StatusSuccess || f.output(running.ID) != "before after" {
		t.Fatalf("re-attached job: %s %q output %q", j.Status, j.Error, f.output(running.ID))
	}
	if j := f.wait(eng2, lost.ID); j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "sandbox lost after a server restart") {
		t.Fatalf("lost job: %s %q", j.Status, j.Error)
	}
	q := f.started()
	if string(q.Cmd.Inputs["script"]) != "queued" {
		t.Fatalf("started %q, want the queued job", q.Cmd.Inputs)
	}
	q.Finish(sandbox.Exit{})
	if j := f.wait(eng2, queued.ID); j.Status != delegate.StatusSuccess || j.Owner != eng2.Owner() {
		t.Fatalf("queued job after restart: %s owner %q", j.Status, j.Owner)
	}
	eventually(t, "sandboxes destroyed", func() bool { return f.backend.Len() == 0 })
}

func TestRecoveryLeavesLiveOwners(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFixture(t, engine.Config{OwnerAlive: func(string) bool { return true }})
		job := f.submit(script("long"))
		p := f.started()
		f.start(f.backend) // a second engine on the same data must not take the job
		synctest.Wait()    // whatever it starts has run
		p.Finish(sandbox.Exit{})
		j := f.wait(f.eng, job.ID)
		if j.Status != delegate.StatusSuccess || j.Owner != f.eng.Owner() {
			t.Fatalf("%s owned by %q", j.Status, j.Owner)
		}
		_ = ctx
	})
}

func TestSweepDestroysOrphans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t, engine.Config{CleanupInterval: 20 * time.Millisecond})
	orphan, err := f.backend.Create(ctx, sandbox.Spec{JobID: "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	m := script("keep")
	m.Lifecycle = delegate.LifecyclePersistent
	kept := f.submit(m)
	p := f.started()
	p.Finish(sandbox.Exit{})
	f.wait(f.eng, kept.ID)
	eventually(t, "orphan destroyed", func() bool {
		_, err := f.backend.Recover(ctx, orphan.ID())
		return errors.Is(err, sandbox.ErrGone)
	})
	if _, err := f.backend.Recover(ctx, p.Sandbox.ID()); err != nil {
		t.Fatalf("persistent job's sandbox was destroyed: %v", err)
	}
}

// TestSweepSparesSandboxesBeingProvisioned: a sandbox made for a job that
// is still provisioning (not yet recorded on the job) is not an orphan,
// however many sweeps pass.
func TestSweepSparesSandboxesBeingProvisioned(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		f := newFixture(t, engine.Config{CleanupInterval: 10 * time.Millisecond})
		release := make(chan struct{})
		entered := make(chan string, 1)
		f.backend.CreateHook = func(ctx context.Context, spec sandbox.Spec) error {
			entered <- spec.JobID
			<-release
			return nil
		}
		job := f.submit(script("slow provisioning"))
		jobID := <-entered
		// A sandbox of the job exists on the backend while Create is still at work.
		f.backend.CreateHook = nil
		inFlight, err := f.backend.Create(ctx, sandbox.Spec{JobID: jobID})
		if err != nil {
			t.Fatal(err)
		}
		passTime(150 * time.Millisecond) // 15 sweeps
		if _, err := f.backend.Recover(ctx, inFlight.ID()); err != nil {
			t.Fatalf("the sweep destroyed a sandbox of a job being provisioned: %v", err)
		}
		close(release)
		f.started().Finish(sandbox.Exit{})
		f.wait(f.eng, job.ID)
		// Once the job is over, the extra sandbox is a leftover and goes.
		eventually(t, "leftover destroyed", func() bool {
			_, err := f.backend.Recover(ctx, inFlight.ID())
			return errors.Is(err, sandbox.ErrGone)
		})
	})
}

// TestWaitWakesForTheEnd: Wait returns when the job ends, woken (not at
// its next poll, a minute away here), and a
// wait that is up first returns the job as it is then (running, not as
// it was when the wait began), though it woke for none of the changes
// on the way.
func TestWaitWakesForTheEnd(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// Polls so rare that only a wake-up can end the wait in time.
		f := newFixture(t, engine.Config{PollInterval: time.Minute})
		job := f.submit(script("long"))
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		type waited struct {
			j   *delegate.Job
			err error
		}
		early := make(chan waited, 1)
		go func() {
			j, err := f.eng.Wait(ctx, job.ID)
			early <- waited{j, err}
		}()
		p := f.started()
		w := <-early
		if w.err != nil || w.j.Status != delegate.StatusRunning {
			t.Fatalf("a wait that was up: %v %+v", w.err, w.j)
		}
		ended := make(chan waited, 1)
		go func() {
			j, err := f.eng.Wait(context.Background(), job.ID)
			ended <- waited{j, err}
		}()
		synctest.Wait() // the wait is waiting
		p.Finish(sandbox.Exit{})
		select {
		case w := <-ended:
			if w.err != nil || w.j.Status != delegate.StatusSuccess {
				t.Fatalf("the wait for the end: %v %+v", w.err, w.j)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the wait did not return at the job's end")
		}
	})
}

// TestAdoptedEndTime: a job that ended while no server ran is given the
// end its supervisor recorded, not the time the next server adopted it
// (a 3 s job showed "success in 505.2s").
func TestAdoptedEndTime(t *testing.T) {
	t.Parallel()
	dead := func(string) bool { return false }
	f := newFixture(t, engine.Config{OwnerAlive: dead})
	job := f.submit(script("short"))
	p := f.started()
	running := waitStatus(t, f.eng, job.ID, delegate.StatusRunning)
	f.eng.Close() // the server goes; the job goes on, and ends
	ended := running.StartedAt.Add(time.Microsecond)
	p.Finish(sandbox.Exit{EndedAt: ended})
	eng2 := f.start(f.backend) // later than the end: the end is not its time

	j := f.wait(eng2, job.ID)
	if j.Status != delegate.StatusSuccess || !j.FinishedAt.Equal(ended) {
		t.Errorf("adopted: %s, finished at %v; want success at %v (its supervisor's record)", j.Status, j.FinishedAt, ended)
	}
}

// TestReadOnlyListSaysEnded: a running job that no live server drives,
// whose command its sandbox recorded as ended, is listed as ended (its
// exit code, and a progress that says so), its status left for a server
// to record; a job a live server drives is listed as it is stored.
func TestReadOnlyListSaysEnded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ended := time.Now().Add(-time.Minute).UTC()
	f := newFixture(t, engine.Config{
		OwnerAlive: func(owner string) bool { return owner == "alive" },
		PeekEnd: func(sandboxID, execID string) (sandbox.Exit, bool) {
			return sandbox.Exit{Code: 0, EndedAt: ended}, sandboxID == "sb-1" && execID == "ex-1"
		},
	})
	for id, owner := range map[string]string{"j-orphan": "gone", "j-driven": "alive"} {
		j := storetest.NewJob(id)
		j.Status, j.Owner, j.SandboxID, j.ExecID, j.StartedAt = delegate.StatusRunning, owner, "sb-1", "ex-1", ended.Add(-time.Second)
		if err := f.store.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	page, err := f.eng.List(ctx, delegate.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range page.Jobs {
		switch j.ID {
		case "j-orphan":
			if j.Status != delegate.StatusRunning || j.ExitCode == nil || *j.ExitCode != 0 || !strings.Contains(j.Progress, "ended at") {
				t.Errorf("the orphan: %+v; want running, exit code 0, a progress that says it ended", j)
			}
		case "j-driven":
			if j.ExitCode != nil || strings.Contains(j.Progress, "ended") {
				t.Errorf("a job a live server drives: %+v", j)
			}
		}
	}
	if j, err := f.eng.Get(ctx, "j-orphan"); err != nil || j.ExitCode == nil || !strings.Contains(j.Progress, "while no server ran") {
		t.Errorf("Get of the orphan: %+v, %v", j, err)
	}
}
