//go:build linux

package engine_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/local"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sqlite"
)

// The tests in this file drive real local sandboxes: the test binary is
// their helper (shim and init), as the delegate binary is in production.
func TestMain(m *testing.M) {
	if local.Reexec() {
		return
	}
	os.Exit(m.Run())
}

// localFixture is an engine's surroundings over a real local backend.
type localFixture struct {
	dir   string
	store *sqlite.DB
	lcfg  local.Config
	cfg   engine.Config
}

func newLocal(t testing.TB) *localFixture {
	t.Helper()
	if os.Geteuid() != 0 && os.Getenv("DELEGATE_REQUIRE_LOCAL") == "" {
		t.Skip("the local backend needs root; set DELEGATE_REQUIRE_LOCAL=1 to make this a failure")
	}
	dir := t.TempDir()
	store, err := sqlite.Open(context.Background(), filepath.Join(dir, "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return &localFixture{
		dir:   dir,
		store: store,
		lcfg:  local.Config{Dir: filepath.Join(dir, "sandboxes"), RootfsDir: filepath.Join(dir, "rootfs")},
		cfg: engine.Config{
			Defaults:     delegate.Defaults{Timeout: 60, CPU: 1, Memory: "256M", Disk: "64M"},
			PollInterval: 20 * time.Millisecond,
			ArtifactDir:  filepath.Join(dir, "artifacts"),
		},
	}
}

func (f *localFixture) backend(t testing.TB) *local.Backend {
	t.Helper()
	b, err := local.New(f.lcfg)
	if err != nil {
		t.Fatalf("local backend: %v", err)
	}
	return b
}

// engine starts an engine over b on the fixture's store.
func (f *localFixture) engine(t testing.TB, b sandbox.Backend) *engine.Engine {
	t.Helper()
	eng := engine.New(f.store, b, f.cfg)
	if err := eng.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng
}

// leftovers lists what is left of the sandboxes: their directories and
// any mount under them (the workspace tmpfs); the cgroups go before a
// sandbox's directory does.
func (f *localFixture) leftovers(t *testing.T) []string {
	t.Helper()
	var left []string
	ents, _ := os.ReadDir(f.lcfg.Dir)
	for _, e := range ents {
		left = append(left, "sandbox "+e.Name())
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 && strings.HasPrefix(fields[4], f.dir+"/") {
			left = append(left, "mount "+fields[4])
		}
	}
	return left
}

func waitStatus(t *testing.T, eng *engine.Engine, id string, want delegate.Status) *delegate.Job {
	t.Helper()
	j := awaitJob(t, eng, id, string(want), func(j *delegate.Job) bool { return j.Status == want || j.Status.Terminal() })
	if j.Status != want {
		t.Fatalf("job %s is %s (%s), want %s", id, j.Status, j.Error, want)
	}
	return j
}

func waitEnd(t *testing.T, eng *engine.Engine, id string) *delegate.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	j, err := eng.Wait(ctx, id)
	if err != nil || !j.Status.Terminal() {
		t.Fatalf("job %s: %+v %v", id, j, err)
	}
	return j
}

// TestLocalCancelOrphan is the attack on `delegate jobs cancel` with no
// server running: the job was recorded cancelled, and went on running in
// its sandbox. Now the canceller, an engine with no backend of its own
// (as the CLI's is), stops it for real.
func TestLocalCancelOrphan(t *testing.T) {
	t.Parallel()
	f := newLocal(t)
	f.cfg.OwnerAlive = func(string) bool { return false } // the server is gone
	ctx := context.Background()
	server := f.engine(t, f.backend(t))
	job, err := server.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "echo started; exec sleep 1000"}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	j := waitStatus(t, server, job.ID, delegate.StatusRunning)
	initPID := readPID(t, filepath.Join(f.lcfg.Dir, j.SandboxID, "init.pid"))
	// Running is recorded at exec: wait until the job has said it started
	// (its output stored, which wakes the engine's watchers).
	awaitJob(t, server, job.ID, "the job saying it started", func(*delegate.Job) bool {
		out, _ := f.store.ReadOutput(ctx, job.ID, 0, 100)
		return string(delegate.JoinOutput(out)) == "started\n"
	})
	server.Close() // stops without touching the job
	if err := syscall.Kill(initPID, 0); err != nil {
		t.Fatalf("the job died with its server: %v", err)
	}

	cfg := f.cfg
	cfg.OpenBackend = func(context.Context) (sandbox.Backend, error) { return local.New(f.lcfg) }
	canceller := engine.New(f.store, nil, cfg)
	defer canceller.Close()
	j, cancelled, err := canceller.Cancel(ctx, job.ID)
	if err != nil || !cancelled || j.Status != delegate.StatusCancelled {
		t.Fatalf("Cancel: %+v %v %v", j, cancelled, err)
	}
	if err := syscall.Kill(initPID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the job's processes still run after cancel (kill -0 %d: %v)", initPID, err)
	}
	if left := f.leftovers(t); len(left) > 0 {
		t.Errorf("left after cancel: %v", left)
	}
	outs, _ := f.store.ReadOutput(ctx, job.ID, 0, 1<<20)
	if out := delegate.JoinOutput(outs); string(out) != "started\n" || j.ExitCode == nil {
		t.Errorf("output %q, exit code %v", out, j.ExitCode)
	}
}

// gatedFiles is the local backend whose sandboxes write files slowly (a
// delay), or not at all until provisioning is aborted (block): a slow
// provisioning step, at a moment the test chooses.
type gatedFiles struct {
	sandbox.Backend
	delay   time.Duration
	block   bool
	entered chan string // a sandbox id, when writing its files begins
}

func (b *gatedFiles) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	sb, err := b.Backend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &gatedSandbox{Instance: sb, b: b}, nil
}

type gatedSandbox struct {
	sandbox.Instance
	b *gatedFiles
}

func (s *gatedSandbox) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	select {
	case s.b.entered <- s.ID():
	default:
	}
	if s.b.block {
		<-ctx.Done()
		return ctx.Err()
	}
	select {
	case <-time.After(s.b.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Instance.WriteFile(ctx, p, data, mode)
}

// TestLocalShutdownRollsBack: a server stopped while a job is being
// provisioned fails the job and removes the half-made sandbox (its
// workspace tmpfs, its cgroups) as it stops, persistent job or not,
// instead of leaving them to the next server.
func TestLocalShutdownRollsBack(t *testing.T) {
	t.Parallel()
	for _, lifecycle := range []delegate.Lifecycle{delegate.LifecycleEphemeral, delegate.LifecyclePersistent} {
		t.Run(string(lifecycle), func(t *testing.T) {
			f := newLocal(t)
			b := &gatedFiles{Backend: f.backend(t), block: true, entered: make(chan string, 1)}
			server := f.engine(t, b)
			job, err := server.Submit(context.Background(), delegate.Manifest{AgentType: delegate.AgentScript, Task: "true",
				Lifecycle: lifecycle, Files: []delegate.File{{Path: "in.txt", Content: "aGk="}}}, delegate.SubmitOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var id string
			select {
			case id = <-b.entered:
			case <-time.After(30 * time.Second):
				t.Fatal("provisioning did not start")
			}
			if _, err := os.Stat(filepath.Join(f.lcfg.Dir, id)); err != nil {
				t.Fatalf("no half-made sandbox to roll back: %v", err)
			}
			server.Close()
			j, err := f.store.GetJob(context.Background(), job.ID)
			if err != nil || j.Status != delegate.StatusFailed || !strings.Contains(j.Error, "server stopped") || j.SandboxID != "" {
				t.Errorf("after shutdown: %+v %v", j, err)
			}
			if left := f.leftovers(t); len(left) > 0 {
				t.Errorf("left after shutdown: %v", left)
			}
		})
	}
}

// TestLocalTimeoutCountsFromRunning: a job's timeout starts when its
// command starts (status running), not at submission: a slow provisioning
// step takes none of it. A job that does outlive it is killed, and its
// recorded run lasts the timeout plus at most the kill grace.
func TestLocalTimeoutCountsFromRunning(t *testing.T) {
	t.Parallel()
	f := newLocal(t)
	const provisioning = 1500 * time.Millisecond
	server := f.engine(t, &gatedFiles{Backend: f.backend(t), delay: provisioning, entered: make(chan string, 1)})
	ctx := context.Background()
	files := []delegate.File{{Path: "in.txt", Content: "aGk="}}

	// 1.5 s of provisioning + 1 s of work > the 2 s timeout, which the
	// work alone is well within.
	ok, err := server.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "sleep 1; echo finished",
		Timeout: new(2), Files: files}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	long, err := server.Submit(ctx, delegate.Manifest{AgentType: delegate.AgentScript, Task: "exec sleep 1000",
		Timeout: new(1), Files: files}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if j := waitEnd(t, server, ok.ID); j.Status != delegate.StatusSuccess || j.StartedAt.Sub(j.CreatedAt) < provisioning {
		t.Errorf("job within its timeout once running: %s %q (provisioned in %v)", j.Status, j.Error, j.StartedAt.Sub(j.CreatedAt))
	}
	j := waitEnd(t, server, long.ID)
	ran := j.FinishedAt.Sub(j.StartedAt)
	if j.Status != delegate.StatusTimeout || ran < time.Second || ran > time.Second+5*time.Second {
		t.Errorf("job over its timeout: %s %q, ran %v (timeout 1s, grace 5s)", j.Status, j.Error, ran)
	}
	t.Logf("provisioned in %v, then ran %v until the timeout killed it", j.StartedAt.Sub(j.CreatedAt), ran)
}

// TestLocalSubmitRefusesTemplatePaths: through the engine, as an MCP
// client reaches it, a manifest that names a host path as its template is
// refused at submission, naming the field, and nothing is stored or run.
func TestLocalSubmitRefusesTemplatePaths(t *testing.T) {
	t.Parallel()
	f := newLocal(t)
	if err := os.MkdirAll(filepath.Join(f.lcfg.RootfsDir, "bookworm"), 0o755); err != nil {
		t.Fatal(err)
	}
	server := f.engine(t, f.backend(t))
	victim, err := server.Submit(context.Background(), delegate.Manifest{AgentType: delegate.AgentScript, Task: "exec sleep 1000"}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := waitStatus(t, server, victim.ID, delegate.StatusRunning)
	defer server.Cancel(context.Background(), victim.ID)
	for _, tpl := range []string{"/", "/etc", filepath.Join(f.lcfg.Dir, v.SandboxID, "workspace"), "../bookworm", "nope"} {
		_, err := server.Submit(context.Background(), delegate.Manifest{AgentType: delegate.AgentScript, Task: "ls /", VMTemplate: tpl}, delegate.SubmitOptions{})
		var fe *delegate.FieldError
		if !errors.As(err, &fe) || fe.Field != "manifest.vmTemplate" || !strings.Contains(fe.Rule, "available: bookworm") {
			t.Errorf("vmTemplate %q: %v, want a field error on manifest.vmTemplate listing bookworm", tpl, err)
		}
	}
	page, err := server.List(context.Background(), delegate.ListOptions{})
	if err != nil || len(page.Jobs) != 1 {
		t.Fatalf("jobs stored: %+v %v", page, err)
	}
}

func readPID(t *testing.T, file string) int {
	t.Helper()
	var pid int
	eventually(t, "a pid in "+file, func() bool {
		data, err := os.ReadFile(file)
		if err == nil {
			pid, err = strconv.Atoi(strings.TrimSpace(string(data)))
		}
		return err == nil
	})
	return pid
}
