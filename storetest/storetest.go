// Package storetest is the contract of delegate.Store as tests, run
// against every implementation (the SQLite store, and the PostgreSQL one
// that several servers may share), as River's riverdrivertest is against
// every database driver: what the engine relies on is tested once, here, and an
// implementation's own tests keep only what is its own (its schema and
// migrations, its query plans, its costs). A handle Open gives is another
// process's, or another server's: the tests that write through two handles
// at once are what a store shared by servers must pass.
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Open {
//			path := filepath.Join(t.TempDir(), "jobs.db")
//			return func() delegate.Store { return openDB(t, path) }
//		})
//	}
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// Open opens a handle on one test's data. Its first call gives the store
// the test uses; each later call opens another handle on the same data,
// as another process sharing the store (or the same one after a restart)
// would. The implementation closes the handles when the test ends.
type Open func() delegate.Store

// Run runs each contract test as a subtest, on an empty store that
// newStore makes for it.
func Run(t *testing.T, newStore func(t *testing.T) Open) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, open Open)
	}{
		{"CreateAndRead", testCreateAndRead},
		{"UnknownJob", testUnknownJob},
		{"StateMachineInTheTransaction", testStateMachine},
		{"FailedUpdateWritesNothing", testFailedUpdate},
		{"ListPagesAndFilters", testList},
		{"RecoveryReads", testRecoveryReads},
		{"IdempotencyKey", testIdempotencyKey},
		{"IdempotencyDigest", testIdempotencyDigest},
		{"ConcurrentWrites", testConcurrentWrites},
		{"ConcurrentHandles", testConcurrentHandles},
		{"FinishCounter", testFinishCounter},
		{"ManifestIsImmutable", testManifestIsImmutable},
		{"JobManifest", testJobManifest},
		{"SaveProgress", testSaveProgress},
		{"Timeline", testTimeline},
		{"OutputOffsets", testOutputOffsets},
		{"OutputStreams", testOutputStreams},
		{"Artifacts", testArtifacts},
		{"Sandboxes", testSandboxes},
		{"JobNamesItsSandbox", testJobNamesItsSandbox},
		{"SandboxActivity", testSandboxActivity},
		{"Questions", testQuestions},
		{"Answers", testAnswers},
		{"Workspaces", testWorkspaces},
		{"Networks", testNetworks},
		{"NetworkLog", testNetworkLog},
		{"AllowlistManifest", testAllowlistManifest},
		{"OutputLost", testOutputLost},
		{"Prune", testPrune},
		{"PruneMany", testPruneMany},
		{"Leases", testLeases},
		{"Terms", testTerms},
		{"Fencing", testFencing},
		{"AdoptJobs", testAdoptJobs},
		{"Rejoin", testRejoin},
		{"Principals", testPrincipals},
		{"Tokens", testTokens},
		{"Audit", testAudit},
		{"QuotaRace", testQuotaRace},
		{"CheckpointQuotaRace", testCheckpointQuotaRace},
		{"Holdings", testHoldings},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore(t)) })
	}
}

// NewJob is a pending job as the engine submits one.
func NewJob(id string) *delegate.Job {
	now := time.Now().UTC()
	return &delegate.Job{
		ID:        id,
		Status:    delegate.StatusPending,
		Manifest:  delegate.Manifest{Task: "echo " + id, AgentType: delegate.AgentScript, Env: map[string]string{"A": "b"}},
		CreatedAt: now,
		UpdatedAt: now,
	}
}

// Pieces makes a chunk of output: each spec is one piece, of stderr when
// it starts with "E:", of stdout otherwise.
func Pieces(spec ...string) []delegate.Output {
	var out []delegate.Output
	for _, s := range spec {
		st := delegate.StreamStdout
		if rest, ok := strings.CutPrefix(s, "E:"); ok {
			st, s = delegate.StreamStderr, rest
		}
		out = append(out, delegate.Output{Stream: st, Data: []byte(s)})
	}
	return out
}

// Tagged renders pieces of output as "[stream]data", in order, a tag at
// each change of stream.
func Tagged(outs []delegate.Output) string {
	var b strings.Builder
	for i, o := range outs {
		if i == 0 || outs[i-1].Stream != o.Stream {
			b.WriteString("[" + o.Stream.String() + "]")
		}
		b.Write(o.Data)
	}
	return b.String()
}

func create(t *testing.T, s delegate.Store, jobs ...*delegate.Job) {
	t.Helper()
	for _, j := range jobs {
		if err := s.CreateJob(context.Background(), j); err != nil {
			t.Fatalf("create %s: %v", j.ID, err)
		}
	}
}

func setStatus(s delegate.Store, id string, st delegate.Status) error {
	_, err := s.UpdateJob(context.Background(), id, func(j *delegate.Job) error { j.Status = st; return nil })
	return err
}

// testCreateAndRead: a job, its fields, its changes and its output are
// read back as written, through another handle too; ids are unique.
func testCreateAndRead(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	create(t, s, NewJob("j1"))
	if err := s.CreateJob(ctx, NewJob("j1")); err == nil {
		t.Fatal("a second job with the same id was stored")
	}
	code := 3
	for _, fn := range []func(j *delegate.Job){
		func(j *delegate.Job) { j.Status = delegate.StatusProvisioning },
		func(j *delegate.Job) {
			j.Status, j.StartedAt, j.SandboxID, j.Owner = delegate.StatusRunning, time.Now(), "sb-1", "owner-1"
		},
		func(j *delegate.Job) {
			j.Status, j.ExitCode, j.Error, j.OutputBytes, j.OutputTruncated = delegate.StatusFailed, &code, "exit 3", 10, true
			j.FinishedAt, j.OOMKilled = time.Now(), true
		},
	} {
		if _, err := s.UpdateJob(ctx, "j1", func(j *delegate.Job) error { fn(j); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	// AppendOutput raises output_bytes to what is kept (11 > 10).
	if err := s.AppendOutput(ctx, "j1", Pieces("hello "), 6); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendOutput(ctx, "j1", Pieces("world"), 11); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"same handle", "another handle"} {
		if name == "another handle" {
			s = open()
		}
		got, err := s.GetJob(ctx, "j1")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.Status != delegate.StatusFailed || got.ExitCode == nil || *got.ExitCode != 3 || got.Error != "exit 3" ||
			got.OutputBytes != 11 || !got.OutputTruncated || !got.OOMKilled || got.OutputRead != 11 || got.Manifest.Env["A"] != "b" ||
			got.StartedAt.IsZero() || got.FinishedAt.IsZero() || got.SandboxID != "sb-1" || got.Owner != "owner-1" {
			t.Fatalf("%s: %+v", name, got)
		}
		if n, err := s.OutputSize(ctx, "j1"); err != nil || n != 11 {
			t.Errorf("%s: output size %d, %v", name, n, err)
		}
	}
}

// testUnknownJob: reading or updating a job that does not exist says so
// (ErrNotFound, naming the job); progress for one is skipped.
func testUnknownJob(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	notFound := func(what string, err error) {
		t.Helper()
		var nf *delegate.NotFoundError
		if !errors.Is(err, delegate.ErrNotFound) || !errors.As(err, &nf) || nf.Resource != "job" || nf.ID != "nope" {
			t.Errorf("%s of an unknown job: %v", what, err)
		}
	}
	_, err := s.GetJob(ctx, "nope")
	notFound("GetJob", err)
	_, err = s.JobManifest(ctx, "nope")
	notFound("JobManifest", err)
	files, err := s.JobFiles(ctx, "nope")
	notFound("JobFiles", err)
	if files != nil {
		t.Errorf("files of an unknown job: %v", files)
	}
	_, err = s.UpdateJob(ctx, "nope", func(*delegate.Job) error { return nil })
	notFound("UpdateJob", err)
	_, _, err = s.StreamTail(ctx, "nope", delegate.StreamStderr, 10)
	notFound("StreamTail", err)
	if err := s.SaveProgress(ctx, []delegate.JobProgress{{ID: "nope", Progress: "x", Events: []delegate.Event{{Time: time.Now(), Message: "x"}}}}); err != nil {
		t.Errorf("progress of an unknown job: %v", err)
	}
	if _, err := s.GetJob(ctx, "nope"); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("progress created a job: %v", err)
	}
}

// testStateMachine: UpdateJob checks every change of status against the
// state machine inside its transaction: a forbidden move and any move out
// of a terminal status are refused, and nothing is written.
func testStateMachine(t *testing.T, open Open) {
	s := open()
	create(t, s, NewJob("j"))
	if err := setStatus(s, "j", delegate.StatusSuccess); !errors.Is(err, delegate.ErrInvalidTransition) {
		t.Fatalf("pending -> success: %v", err)
	}
	if err := setStatus(s, "j", delegate.StatusCancelled); err != nil {
		t.Fatal(err)
	}
	for _, st := range []delegate.Status{delegate.StatusRunning, delegate.StatusSuccess, delegate.StatusPending} {
		if err := setStatus(s, "j", st); !errors.Is(err, delegate.ErrTerminal) {
			t.Fatalf("cancelled -> %s: %v", st, err)
		}
	}
	if got, _ := s.GetJob(context.Background(), "j"); got.Status != delegate.StatusCancelled {
		t.Fatalf("status %s after refused updates", got.Status)
	}
	// Racing movers: one wins, the others see a terminal job and write nothing.
	create(t, s, NewJob("race"))
	var wg sync.WaitGroup
	wins := make(chan delegate.Status, 3)
	for _, st := range []delegate.Status{delegate.StatusCancelled, delegate.StatusCancelled, delegate.StatusProvisioning} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.UpdateJob(context.Background(), "race", func(j *delegate.Job) error {
				if j.Status.Terminal() {
					return delegate.ErrTerminal
				}
				j.Status = st
				return nil
			})
			if err == nil {
				wins <- st
			}
		}()
	}
	wg.Wait()
	close(wins)
	cancels := 0
	for st := range wins {
		if st == delegate.StatusCancelled {
			cancels++
		}
	}
	if cancels != 1 {
		t.Errorf("%d of two racing cancels applied, want exactly one", cancels)
	}
}

// testFailedUpdate: an error from fn is returned and nothing fn changed
// is written.
func testFailedUpdate(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	create(t, s, NewJob("j"))
	boom := errors.New("boom")
	if _, err := s.UpdateJob(ctx, "j", func(j *delegate.Job) error {
		j.Progress, j.Status = "x", delegate.StatusProvisioning
		return boom
	}); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if got, _ := s.GetJob(ctx, "j"); got.Progress != "" || got.Status != delegate.StatusPending {
		t.Fatalf("a failed update was written: %+v", got)
	}
}

// testList: pages newest first with cursors, the status and active
// filters, and a bad cursor as a field error.
func testList(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	for i := range 7 {
		j := NewJob(fmt.Sprintf("j%d", i))
		if i%2 == 1 {
			j.Status = delegate.StatusCancelled
		}
		create(t, s, j)
	}
	var ids []string
	cursor := ""
	for page := 0; ; page++ {
		jobs, next, err := s.ListJobs(ctx, delegate.JobFilter{Limit: 3, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) > 3 {
			t.Fatalf("a page of %d jobs, limit 3", len(jobs))
		}
		for _, j := range jobs {
			ids = append(ids, j.ID)
			if j.Manifest.Task != "echo "+j.ID {
				t.Errorf("listed job %s without its manifest: %+v", j.ID, j.Manifest)
			}
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
	var fe *delegate.FieldError
	if _, _, err := s.ListJobs(ctx, delegate.JobFilter{Cursor: "garbage"}); !errors.As(err, &fe) || fe.Field != "cursor" {
		t.Fatalf("bad cursor: %v", err)
	}
}

// testRecoveryReads: what recovery, the sweep and the callbacks read: the
// active jobs page by page (as a restarted engine does while jobs change),
// a job by owner, by sandbox and by callback token hash.
func testRecoveryReads(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	for i := range 12 {
		j := NewJob(fmt.Sprintf("j%02d", i))
		j.Owner = fmt.Sprint("owner-", i%3)
		j.TokenHash = fmt.Sprintf("hash-%02d", i)
		create(t, s, j)
	}
	for i, id := range []string{"j00", "j04", "j08"} {
		if _, err := s.UpdateJob(ctx, id, func(j *delegate.Job) error {
			j.Status, j.SandboxID = delegate.StatusProvisioning, fmt.Sprint("sb-", i)
			if id != "j00" {
				j.Sandbox = "sbx-kept" // commands of a kept sandbox
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"j01", "j05"} {
		if err := setStatus(s, id, delegate.StatusCancelled); err != nil {
			t.Fatal(err)
		}
	}
	// Page through the active jobs, finishing one already listed and one
	// not yet listed between pages: each job is seen at most once, and
	// every job active throughout is seen.
	seen := map[string]int{}
	cursor := ""
	for page := 0; ; page++ {
		jobs, next, err := s.ListJobs(ctx, delegate.JobFilter{Active: true, Limit: 4, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			if j.Status.Terminal() {
				t.Errorf("active listing returned %s, %s", j.ID, j.Status)
			}
			seen[j.ID]++
		}
		if page == 0 {
			for _, id := range []string{jobs[0].ID, "j02"} {
				if err := setStatus(s, id, delegate.StatusCancelled); err != nil {
					t.Fatal(err)
				}
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	for _, id := range []string{"j00", "j03", "j04", "j06", "j07", "j08", "j09", "j10"} {
		if seen[id] != 1 {
			t.Errorf("active job %s listed %d times", id, seen[id])
		}
	}
	if seen["j01"] != 0 || seen["j05"] != 0 || seen["j02"] != 0 {
		t.Errorf("finished jobs listed as active: %v", seen)
	}
	jobs, _, err := s.ListJobs(ctx, delegate.JobFilter{Owner: "owner-1", Active: true})
	if err != nil || len(jobs) != 3 { // j04, j07, j10 (j01 is finished)
		t.Errorf("by owner: %d jobs, %v", len(jobs), err)
	}
	jobs, _, err = s.ListJobs(ctx, delegate.JobFilter{SandboxID: "sb-1", Limit: 1})
	if err != nil || len(jobs) != 1 || jobs[0].ID != "j04" {
		t.Errorf("by sandbox: %v, %v", jobs, err)
	}
	jobs, _, err = s.ListJobs(ctx, delegate.JobFilter{TokenHash: "hash-07", Limit: 1})
	if err != nil || len(jobs) != 1 || jobs[0].ID != "j07" {
		t.Errorf("by token hash: %v, %v", jobs, err)
	}
	if jobs, _, err := s.ListJobs(ctx, delegate.JobFilter{SandboxID: "sb-none"}); err != nil || len(jobs) != 0 {
		t.Errorf("by an unknown sandbox: %v, %v", jobs, err)
	}
	jobs, _, err = s.ListJobs(ctx, delegate.JobFilter{Sandbox: "sbx-kept", Active: true})
	if err != nil || len(jobs) != 2 || jobs[0].ID != "j08" || jobs[1].ID != "j04" {
		t.Errorf("the commands of a kept sandbox: %v, %v", jobs, err)
	}
}

// testIdempotencyKey: a key is unique among jobs, a job is found by it,
// and jobs without one do not clash.
func testIdempotencyKey(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	j := NewJob("a")
	j.IdempotencyKey, j.TokenHash, j.Result = "key-1", "hash", "r"
	j.LastHeartbeat = time.Now().UTC().Truncate(time.Microsecond)
	create(t, s, j)
	dup := NewJob("b")
	dup.IdempotencyKey = "key-1"
	if err := s.CreateJob(ctx, dup); err == nil {
		t.Fatal("a second job with the same idempotency key was stored")
	}
	if _, err := s.GetJob(ctx, "b"); !errors.Is(err, delegate.ErrNotFound) {
		t.Fatalf("the refused job was stored: %v", err)
	}
	create(t, s, NewJob("c"), NewJob("d")) // no key: no clash
	got, err := s.JobByIdempotencyKey(ctx, "key-1")
	if err != nil || got.ID != "a" || got.TokenHash != "hash" || got.Result != "r" || !got.LastHeartbeat.Equal(j.LastHeartbeat) ||
		got.Manifest.Task != "echo a" {
		t.Fatalf("by key: %+v %v", got, err)
	}
	if _, err := s.JobByIdempotencyKey(ctx, "nope"); !errors.Is(err, delegate.ErrNotFound) {
		t.Fatal(err)
	}
}

// testIdempotencyDigest: the digest of the manifest a key was first sent
// with is kept with the key, read back by the key and by the job's id
// (also through another handle, as another process would), and no update
// changes it.
func testIdempotencyDigest(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	j := NewJob("a")
	j.IdempotencyKey, j.IdempotencyDigest = "key-1", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	create(t, s, j)
	create(t, s, NewJob("b")) // no key, no digest
	if _, err := s.UpdateJob(ctx, "a", func(j *delegate.Job) error { j.Progress = "p"; return nil }); err != nil {
		t.Fatal(err)
	}
	for i, s := range []delegate.Store{s, open()} {
		got, err := s.JobByIdempotencyKey(ctx, "key-1")
		if err != nil || got.ID != "a" || got.IdempotencyDigest != j.IdempotencyDigest {
			t.Fatalf("handle %d: by key: %+v %v", i, got, err)
		}
		if got, err := s.GetJob(ctx, "a"); err != nil || got.IdempotencyDigest != j.IdempotencyDigest {
			t.Fatalf("handle %d: by id: %+v %v", i, got, err)
		}
		if got, err := s.GetJob(ctx, "b"); err != nil || got.IdempotencyDigest != "" {
			t.Fatalf("handle %d: a job without a key: %+v %v", i, got, err)
		}
	}
}

// testConcurrentWrites: concurrent writes all land, and one write that
// fails (a duplicate idempotency key) undoes nothing of the others, even
// if the store commits them together.
func testConcurrentWrites(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures = map[string]int{}
	)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := NewJob(fmt.Sprint("j", i))
			j.IdempotencyKey = fmt.Sprint("key-", i%8)
			if err := s.CreateJob(ctx, j); err != nil {
				mu.Lock()
				failures[j.IdempotencyKey]++
				mu.Unlock()
				return
			}
			for k := range 5 {
				if _, err := s.UpdateJob(ctx, j.ID, func(j *delegate.Job) error { j.Progress = fmt.Sprint("step ", k); return nil }); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	jobs, _, err := s.ListJobs(ctx, delegate.JobFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 8 {
		t.Fatalf("%d jobs stored, want one per key (8); failures %v", len(jobs), failures)
	}
	for _, j := range jobs {
		if j.Progress != "step 4" || j.Manifest.Task != "echo "+j.ID {
			t.Fatalf("job %s: progress %q, task %q", j.ID, j.Progress, j.Manifest.Task)
		}
		if failures[j.IdempotencyKey] != 7 {
			t.Fatalf("key %s: %d refused, want 7", j.IdempotencyKey, failures[j.IdempotencyKey])
		}
	}
}

// testFinishCounter: the counter moves once per job that reaches a
// terminal status, whichever handle (process) does it, created so or
// moved there; other updates do not move it.
func testFinishCounter(t *testing.T, open Open) {
	ctx := context.Background()
	s, other := open(), open()
	n0, err := s.Finishes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	create(t, s, NewJob("a"), NewJob("b"))
	if n, _ := s.Finishes(ctx); n != n0 {
		t.Fatalf("creating pending jobs moved the counter: %d", n-n0)
	}
	if _, err := s.UpdateJob(ctx, "a", func(j *delegate.Job) error { j.Progress = "x"; return nil }); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Finishes(ctx); n != n0 {
		t.Fatalf("a progress update counted as a finish: %d", n-n0)
	}
	if err := setStatus(other, "a", delegate.StatusCancelled); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Finishes(ctx); n != n0+1 {
		t.Fatalf("finishes after a cancel through another handle: %d", n-n0)
	}
	// An update of a finished job that changes other fields is no finish.
	if _, err := s.UpdateJob(ctx, "a", func(j *delegate.Job) error { j.SandboxID = ""; j.Progress = "released"; return nil }); err != nil {
		t.Fatal(err)
	}
	done := NewJob("born-done")
	done.Status = delegate.StatusFailed
	create(t, s, done)
	if n, _ := other.Finishes(ctx); n != n0+2 {
		t.Fatalf("finishes after a later update and a job created finished: %d, want 2", n-n0)
	}
}

// testManifestIsImmutable: a caller changing the manifest of a job it got
// changes nothing stored, nor what the next caller gets; UpdateJob never
// writes the manifest; files are read apart.
func testManifestIsImmutable(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	j := NewJob("a")
	j.Manifest.Files = []delegate.File{{Path: "a.txt", Content: "aGVsbG8="}}
	j.Manifest.Secrets = []string{"S"}
	create(t, s, j)
	j.Manifest.Env["A"] = "changed by the submitter after the fact"
	got, _ := s.GetJob(ctx, "a")
	if got.Manifest.Env["A"] != "b" || len(got.Manifest.Files) != 0 {
		t.Fatalf("stored manifest: %+v", got.Manifest)
	}
	got.Manifest.Env["A"] = "changed"
	got.Manifest.Secrets[0] = "T"
	if _, err := s.UpdateJob(ctx, "a", func(j *delegate.Job) error {
		j.Manifest.Task = "rm -rf /"
		j.Progress = "x"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"same handle", "another handle"} {
		if name == "another handle" {
			s = open()
		}
		again, err := s.GetJob(ctx, "a")
		if err != nil || again.Manifest.Env["A"] != "b" || again.Manifest.Secrets[0] != "S" || again.Manifest.Task != "echo a" || again.Progress != "x" {
			t.Fatalf("%s: %+v %v", name, again, err)
		}
		files, err := s.JobFiles(ctx, "a")
		if err != nil || len(files) != 1 || files[0].Path != "a.txt" || files[0].Content != "aGVsbG8=" {
			t.Fatalf("%s: files %+v %v", name, files, err)
		}
	}
	create(t, s, NewJob("plain"))
	if files, err := s.JobFiles(ctx, "plain"); err != nil || len(files) != 0 {
		t.Fatalf("files of a job without: %v %v", files, err)
	}
}

// testJobManifest: a job's manifest alone, without files, as a copy.
func testJobManifest(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	j := NewJob("a")
	j.Manifest.StatusMode = delegate.StatusModeDetailed
	j.Manifest.Files = []delegate.File{{Path: "a.txt", Content: "aGk="}}
	create(t, s, j)
	for _, name := range []string{"same handle", "another handle"} {
		store := s
		if name != "same handle" {
			store = open()
		}
		m, err := store.JobManifest(ctx, "a")
		if err != nil || m.StatusMode != delegate.StatusModeDetailed || m.Task != "echo a" || len(m.Files) != 0 {
			t.Fatalf("%s: %+v %v", name, m, err)
		}
		m.Env["A"] = "changed" // a copy
	}
	if m, _ := s.JobManifest(ctx, "a"); m.Env["A"] != "b" {
		t.Fatalf("the stored manifest was changed through a copy: %v", m.Env)
	}
}

// testSaveProgress: one call stores many jobs' coalesced progress; the
// timeline keeps the newest MaxTimeline entries and counts the rest; a
// finished job keeps its final progress; an unknown job is skipped.
func testSaveProgress(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	create(t, s, NewJob("a"), NewJob("b"), NewJob("done"))
	if _, err := s.UpdateJob(ctx, "done", func(j *delegate.Job) error {
		j.Status, j.Progress = delegate.StatusCancelled, "cancelled"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	beat := time.Now().UTC().Truncate(time.Microsecond)
	result := "so far"
	many := make([]delegate.Event, 250)
	for i := range many {
		many[i] = delegate.Event{Time: beat, Message: fmt.Sprint("line ", i)}
	}
	err := s.SaveProgress(ctx, []delegate.JobProgress{
		{ID: "a", Progress: "step 2", Heartbeat: beat, Result: &result, Events: []delegate.Event{{Time: beat, Message: "step 1"}, {Time: beat, Message: "step 2"}}},
		{ID: "b", Progress: "line 249", Events: many, Dropped: 1000},
		{ID: "done", Progress: "late", Heartbeat: beat, Events: []delegate.Event{{Time: beat, Message: "late"}}},
		{ID: "nobody", Progress: "x", Events: []delegate.Event{{Time: beat, Message: "x"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.GetJob(ctx, "a")
	if a.Progress != "step 2" || !a.LastHeartbeat.Equal(beat) || a.Result != "so far" || a.TimelineDropped != 0 {
		t.Fatalf("a: %+v", a)
	}
	if evs, _ := s.Events(ctx, "a"); len(evs) != 2 || evs[1].Message != "step 2" || !evs[1].Time.Equal(beat) {
		t.Fatalf("a's timeline: %+v", evs)
	}
	b, _ := s.GetJob(ctx, "b")
	evs, _ := s.Events(ctx, "b")
	if b.Progress != "line 249" || len(evs) != delegate.MaxTimeline || evs[0].Message != "line 50" || b.TimelineDropped != 1050 {
		t.Fatalf("b: progress %q, %d events from %q, %d dropped", b.Progress, len(evs), evs[0].Message, b.TimelineDropped)
	}
	// More events push the oldest out, one for one.
	if err := s.SaveProgress(ctx, []delegate.JobProgress{{ID: "b", Events: many[:10]}}); err != nil {
		t.Fatal(err)
	}
	b, _ = s.GetJob(ctx, "b")
	evs, _ = s.Events(ctx, "b")
	if len(evs) != delegate.MaxTimeline || evs[0].Message != "line 60" || evs[len(evs)-1].Message != "line 9" || b.TimelineDropped != 1060 {
		t.Fatalf("b after 10 more: %d events from %q to %q, %d dropped", len(evs), evs[0].Message, evs[len(evs)-1].Message, b.TimelineDropped)
	}
	done, _ := s.GetJob(ctx, "done")
	if done.Progress != "cancelled" || !done.LastHeartbeat.IsZero() {
		t.Fatalf("finished job's progress changed: %+v", done)
	}
	if evs, _ := s.Events(ctx, "done"); len(evs) != 1 || evs[0].Message != "late" {
		t.Fatalf("finished job's timeline: %+v", evs)
	}
	// An older heartbeat does not move it back.
	if err := s.SaveProgress(ctx, []delegate.JobProgress{{ID: "a", Heartbeat: beat.Add(-time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	if a, _ := s.GetJob(ctx, "a"); !a.LastHeartbeat.Equal(beat) {
		t.Fatalf("heartbeat went back to %v", a.LastHeartbeat)
	}
}

// testTimeline: AddEvent keeps the newest max entries, oldest first.
func testTimeline(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	create(t, s, NewJob("a"))
	for i := range 5 {
		if err := s.AddEvent(ctx, "a", delegate.Event{Time: time.Now(), Message: fmt.Sprint("step ", i)}, 3); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := s.Events(ctx, "a")
	if err != nil || len(evs) != 3 || evs[0].Message != "step 2" || evs[2].Message != "step 4" {
		t.Fatalf("events kept: %+v %v", evs, err)
	}
	if j, _ := s.GetJob(ctx, "a"); j.TimelineDropped != 2 {
		t.Fatalf("%d dropped, want 2", j.TimelineDropped)
	}
	if evs, err := s.Events(ctx, "nope"); err != nil || len(evs) != 0 {
		t.Fatalf("timeline of an unknown job: %v %v", evs, err)
	}
}

// testOutputOffsets: output reads from any offset, at most max bytes.
func testOutputOffsets(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	create(t, s, NewJob("j"))
	if n, err := s.OutputSize(ctx, "j"); err != nil || n != 0 {
		t.Fatalf("output size before any: %d %v", n, err)
	}
	for _, c := range []string{"hello ", "world"} {
		if err := s.AppendOutput(ctx, "j", Pieces(c), 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		off  int64
		max  int
		want string
	}{{0, 100, "hello world"}, {3, 100, "lo world"}, {6, 3, "wor"}, {0, 8, "hello wo"}, {11, 5, ""}, {20, 5, ""}} {
		outs, err := s.ReadOutput(ctx, "j", tc.off, tc.max)
		if out := delegate.JoinOutput(outs); err != nil || string(out) != tc.want {
			t.Errorf("ReadOutput(%d,%d) = %q, %v; want %q", tc.off, tc.max, out, err, tc.want)
		}
	}
	if _, err := s.ReadOutput(ctx, "j", -1, 10); !errors.Is(err, delegate.ErrInvalid) {
		t.Errorf("a negative offset: %v", err)
	}
	if n, err := s.OutputSize(ctx, "j"); err != nil || n != 11 {
		t.Fatalf("output size %d %v", n, err)
	}
}

// testOutputStreams: chunks mixing both streams are read back in order,
// each byte with its stream, from any offset; each stream's tail skips
// the other's.
func testOutputStreams(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	create(t, s, NewJob("j"))
	for _, c := range [][]delegate.Output{Pieces("out1\n", "E:err1\n"), Pieces("E:err2\n"), Pieces("out2\n"), Pieces("o", "E:e", "o")} {
		if err := s.AppendOutput(ctx, "j", c, 0); err != nil {
			t.Fatal(err)
		}
	}
	all := "[stdout]out1\n[stderr]err1\nerr2\n[stdout]out2\no[stderr]e[stdout]o" // 23 bytes
	for _, c := range []struct {
		off  int64
		max  int
		want string
	}{
		{0, 100, all},
		{2, 6, "[stdout]t1\n[stderr]err"},
		{5, 6, "[stderr]err1\ne"},
		{17, 10, "[stdout]t2\no[stderr]e[stdout]o"},
		{22, 3, "[stdout]o"},
		{23, 3, ""},
	} {
		got, err := s.ReadOutput(ctx, "j", c.off, c.max)
		if err != nil || Tagged(got) != c.want {
			t.Errorf("ReadOutput(%d, %d) = %q, %v; want %q", c.off, c.max, Tagged(got), err, c.want)
		}
	}
	for _, c := range []struct {
		stream delegate.Stream
		max    int
		want   string
		kept   int64
	}{
		{delegate.StreamStdout, 100, "out1\nout2\noo", 12},
		{delegate.StreamStdout, 8, "\nout2\noo", 12}, // across rows
		{delegate.StreamStdout, 3, "\noo", 12},
		{delegate.StreamStderr, 100, "err1\nerr2\ne", 11},
		{delegate.StreamStderr, 7, "\nerr2\ne", 11},
		{delegate.StreamStderr, 0, "", 11},
	} {
		got, kept, err := s.StreamTail(ctx, "j", c.stream, c.max)
		if err != nil || string(got) != c.want || kept != c.kept {
			t.Errorf("StreamTail(%s, %d) = %q, %d, %v; want %q, %d", c.stream, c.max, got, kept, err, c.want, c.kept)
		}
	}
}

// testArtifacts: artifacts are listed by name; adding one again replaces it.
func testArtifacts(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	create(t, s, NewJob("a"))
	if arts, err := s.Artifacts(ctx, "a"); err != nil || len(arts) != 0 {
		t.Fatalf("artifacts before any: %v %v", arts, err)
	}
	for _, a := range []delegate.Artifact{{Name: "z.txt", Size: 1, SHA256: "1"}, {Name: "a/b.txt", Size: 2, SHA256: "2"},
		{Name: "big.bin", Size: 1 << 30, Skipped: "larger than the cap"}, {Name: "z.txt", Size: 3, SHA256: "3"}} {
		if err := s.AddArtifact(ctx, "a", a); err != nil {
			t.Fatal(err)
		}
	}
	arts, err := s.Artifacts(ctx, "a")
	want := []delegate.Artifact{{Name: "a/b.txt", Size: 2, SHA256: "2"}, {Name: "big.bin", Size: 1 << 30, Skipped: "larger than the cap"},
		{Name: "z.txt", Size: 3, SHA256: "3"}}
	if err != nil || fmt.Sprint(arts) != fmt.Sprint(want) {
		t.Fatalf("artifacts: %+v %v; want %+v", arts, err, want)
	}
	// One by name, through another handle.
	for _, w := range want {
		if a, err := open().Artifact(ctx, "a", w.Name); err != nil || a != w {
			t.Errorf("Artifact(%q) = %+v, %v; want %+v", w.Name, a, err, w)
		}
	}
	var nf *delegate.NotFoundError
	if _, err := s.Artifact(ctx, "a", "none.txt"); !errors.As(err, &nf) || nf.Resource != "artifact" || nf.ID != "none.txt" {
		t.Errorf("an artifact the job has not: %v, want an artifact not found", err)
	}
}

// testSandboxes: a kept sandbox is stored whole (the fields the API hides
// included), listed newest first, live or all, found by its instance,
// changed in a transaction, and final once released or gone.
func testSandboxes(t *testing.T, open Open) {
	ctx := context.Background()
	st := open()
	now := time.Now().UTC().Truncate(time.Millisecond)
	mk := func(id, instance string) *delegate.Sandbox {
		return &delegate.Sandbox{ID: id, State: delegate.SandboxIdle, Backend: "local", Instance: instance, JobID: "job-1", Owner: "o1",
			Resources: delegate.Resources{CPU: 1, Memory: "512M", Disk: "1G"}, Network: delegate.Network{Mode: delegate.NetworkNone},
			CreatedAt: now, LastUsedAt: now, ExpiresAt: now.Add(time.Hour), IdleTimeout: time.Minute, PauseTimeout: time.Hour}
	}
	a, b := mk("sbx-a", "sb-1"), mk("sbx-b", "sb-2")
	for _, sb := range []*delegate.Sandbox{a, b} {
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	got, err := open().GetSandbox(ctx, "sbx-a")
	if err != nil || got.Instance != "sb-1" || got.Owner != "o1" || got.IdleTimeout != time.Minute || !got.ExpiresAt.Equal(a.ExpiresAt) || got.Resources.Memory != "512M" {
		t.Fatalf("read back %+v, %v", got, err)
	}
	if _, err := st.GetSandbox(ctx, "sbx-none"); !errors.Is(err, delegate.ErrNotFound) || !strings.Contains(err.Error(), "sbx-none") {
		t.Errorf("an unknown sandbox: %v", err)
	}
	if sb, err := st.SandboxOfInstance(ctx, "local", "sb-2"); err != nil || sb.ID != "sbx-b" {
		t.Errorf("by instance: %+v, %v", sb, err)
	}
	if _, err := st.SandboxOfInstance(ctx, "proxmox", "sb-2"); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("another backend's instance: %v", err)
	}
	upd, err := st.UpdateSandbox(ctx, "sbx-a", func(sb *delegate.Sandbox) error {
		sb.State, sb.PausedAt = delegate.SandboxPaused, now
		return nil
	})
	if err != nil || upd.State != delegate.SandboxPaused || !upd.PausedAt.Equal(now) {
		t.Fatalf("update: %+v, %v", upd, err)
	}
	if _, err := st.UpdateSandbox(ctx, "sbx-a", func(sb *delegate.Sandbox) error {
		sb.State = delegate.SandboxIdle
		return errors.New("refused")
	}); err == nil {
		t.Error("a failed update was not refused")
	}
	if again, _ := open().GetSandbox(ctx, "sbx-a"); again.State != delegate.SandboxPaused {
		t.Errorf("a failed update wrote %s", again.State)
	}
	if _, err := st.UpdateSandbox(ctx, "sbx-b", func(sb *delegate.Sandbox) error {
		sb.State, sb.Reason, sb.EndedAt = delegate.SandboxReleased, "released on request", now
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	called := false
	if _, err := st.UpdateSandbox(ctx, "sbx-b", func(sb *delegate.Sandbox) error {
		called = true
		return nil
	}); !errors.Is(err, delegate.ErrTerminal) || called {
		t.Errorf("a released sandbox changed (called %v): %v", called, err)
	}
	live, err := open().ListSandboxes(ctx, true, 0)
	if err != nil || len(live) != 1 || live[0].ID != "sbx-a" {
		t.Errorf("live: %+v, %v", live, err)
	}
	all, err := open().ListSandboxes(ctx, false, 0)
	if err != nil || len(all) != 2 || all[0].ID != "sbx-b" {
		t.Errorf("all, newest first: %+v, %v", all, err)
	}
}

// testSandboxActivity: a sandbox's activity is its jobs' (the ones whose
// Sandbox names it): the commands submitted, those not ended (running
// while there are some, idle otherwise, unless paused or ended), and the
// last end, if later than its own last use. What an update sets for them
// is not kept; an update, and a read uncounted, have no count of the
// commands submitted.
func testSandboxActivity(t *testing.T, open Open) {
	ctx := context.Background()
	st := open()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	for _, id := range []string{"sbx-a", "sbx-b"} {
		if err := st.CreateSandbox(ctx, &delegate.Sandbox{ID: id, State: delegate.SandboxIdle, Backend: "local", Instance: "i-" + id,
			CreatedAt: t0, LastUsedAt: t0, ExpiresAt: t0.Add(time.Hour), IdleTimeout: time.Minute, PauseTimeout: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	activity := func(id string) *delegate.Sandbox {
		t.Helper()
		sb, err := open().GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	if sb := activity("sbx-a"); sb.State != delegate.SandboxIdle || sb.Commands != 0 || sb.Running != 0 || !sb.LastUsedAt.Equal(t0) {
		t.Fatalf("before any command: %+v", sb)
	}
	job := func(id, sandbox string, status delegate.Status) {
		t.Helper()
		j := &delegate.Job{ID: id, Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: "true", Sandbox: "sbx-a"},
			Status: status, CreatedAt: t0, UpdatedAt: t0, Sandbox: sandbox}
		if err := st.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	job("c1", "sbx-a", delegate.StatusRunning)
	job("c2", "sbx-a", delegate.StatusProvisioning)
	job("c3", "", delegate.StatusPending) // submitted, not yet claimed for it
	job("other", "sbx-b", delegate.StatusRunning)
	sb := activity("sbx-a")
	if sb.State != delegate.SandboxRunning || sb.Commands != 2 || sb.Running != 2 || !sb.LastUsedAt.Equal(t0) {
		t.Fatalf("two commands running: %+v", sb)
	}
	// An update sees the activity (uncounted), and what it sets for it is
	// not kept.
	upd, err := st.UpdateSandbox(ctx, "sbx-a", func(sb *delegate.Sandbox) error {
		if sb.Running != 2 || sb.State != delegate.SandboxRunning {
			t.Errorf("an update is given %+v", sb)
		}
		sb.Running, sb.Commands, sb.Reason = 99, 99, "noted"
		return nil
	})
	if err != nil || upd.Reason != "noted" || upd.Commands != 0 || upd.Running != 2 {
		t.Fatalf("update (uncounted): %+v, %v", upd, err)
	}
	if sb, err := open().GetSandboxUncounted(ctx, "sbx-a"); err != nil || sb.Commands != 0 || sb.Running != 2 || sb.State != delegate.SandboxRunning {
		t.Errorf("uncounted: %+v, %v", sb, err)
	}
	if sb := activity("sbx-a"); sb.Running != 2 || sb.Commands != 2 || sb.Reason != "noted" {
		t.Errorf("after an update that set the counts: %+v", sb)
	}
	end := func(id string, status delegate.Status, at time.Time) {
		t.Helper()
		if _, err := st.UpdateJob(ctx, id, func(j *delegate.Job) error {
			j.Status, j.FinishedAt = status, at
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	t1, t2 := t0.Add(time.Second), t0.Add(2*time.Second)
	end("c1", delegate.StatusSuccess, t2)
	if sb := activity("sbx-a"); sb.State != delegate.SandboxRunning || sb.Running != 1 || !sb.LastUsedAt.Equal(t2) {
		t.Errorf("one command ended: %+v", sb)
	}
	end("c2", delegate.StatusFailed, t1) // one that never started counts as submitted
	sb = activity("sbx-a")
	if sb.State != delegate.SandboxIdle || sb.Running != 0 || sb.Commands != 2 || !sb.LastUsedAt.Equal(t2) {
		t.Errorf("both ended: %+v", sb)
	}
	// A use of its own later than its commands' ends counts.
	t3 := t0.Add(3 * time.Second)
	if _, err := st.UpdateSandbox(ctx, "sbx-a", func(sb *delegate.Sandbox) error { sb.LastUsedAt = t3; return nil }); err != nil {
		t.Fatal(err)
	}
	if sb := activity("sbx-a"); !sb.LastUsedAt.Equal(t3) {
		t.Errorf("used at %s, then read: %s", t3, sb.LastUsedAt)
	}
	// Paused is kept while a command waits to resume it; the other
	// sandbox's command counts there only, in a list and by instance too.
	if _, err := st.UpdateSandbox(ctx, "sbx-b", func(sb *delegate.Sandbox) error { sb.State = delegate.SandboxPaused; return nil }); err != nil {
		t.Fatal(err)
	}
	list, err := open().ListSandboxes(ctx, true, 0)
	if err != nil || len(list) != 2 || list[0].ID != "sbx-b" || list[0].State != delegate.SandboxPaused || list[0].Running != 1 ||
		list[1].Running != 0 || list[1].Commands != 2 {
		t.Errorf("listed: %+v, %v", list, err)
	}
	if sb, err := open().SandboxOfInstance(ctx, "local", "i-sbx-b"); err != nil || sb.Running != 1 || sb.Commands != 1 {
		t.Errorf("by instance: %+v, %v", sb, err)
	}
}

// testJobNamesItsSandbox: a job keeps the kept sandbox it ran in.
func testJobNamesItsSandbox(t *testing.T, open Open) {
	ctx := context.Background()
	st := open()
	j := &delegate.Job{ID: "job-sbx", Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: "true", Sandbox: "sbx-a"},
		Status: delegate.StatusPending, CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC(), Sandbox: "sbx-a"}
	if err := st.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	got, err := open().GetJob(ctx, j.ID)
	if err != nil || got.Sandbox != "sbx-a" || got.Manifest.Sandbox != "sbx-a" {
		t.Fatalf("%+v, %v", got, err)
	}
	if _, err := st.UpdateJob(ctx, j.ID, func(j *delegate.Job) error { j.Sandbox = "sbx-b"; return nil }); err != nil {
		t.Fatal(err)
	}
	if got, _ := open().GetJob(ctx, j.ID); got.Sandbox != "sbx-b" {
		t.Errorf("updated: %q", got.Sandbox)
	}
}
