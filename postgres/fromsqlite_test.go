package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/postgres"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/delegate-dev/delegate/sqlite"
	"github.com/delegate-dev/delegate/storetest"
)

// fillSQLite makes a SQLite store with one of everything a data dir
// keeps, and returns the ids of its jobs.
func fillSQLite(t *testing.T, path string) []string {
	t.Helper()
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	at := time.Now().UTC().Truncate(time.Microsecond)
	var ids []string
	for i := range 5 {
		j := storetest.NewJob(fmt.Sprintf("job-%d", i))
		j.CreatedAt, j.UpdatedAt = at.Add(time.Duration(i)*time.Second), at.Add(time.Duration(i)*time.Second)
		if i == 0 {
			j.Manifest.Files = []delegate.File{{Path: "a.txt", Content: "aGVsbG8="}}
			j.Manifest.Network = delegate.Allowlist("pypi.org")
			j.IdempotencyKey, j.IdempotencyDigest, j.TokenHash = "key-0", "digest-0", "hash-0"
		}
		if i == 3 {
			j.Sandbox = "sbx-kept"
		}
		must(s.CreateJob(ctx, j))
		ids = append(ids, j.ID)
	}
	code := 2
	for _, id := range ids[:3] {
		_, err := s.UpdateJob(ctx, id, func(j *delegate.Job) error { j.Status = delegate.StatusProvisioning; return nil })
		must(err)
		_, err = s.UpdateJob(ctx, id, func(j *delegate.Job) error {
			j.Status, j.StartedAt, j.SandboxID, j.Owner, j.Backend = delegate.StatusRunning, at, "sb-"+id, "owner-1", "local"
			return nil
		})
		must(err)
	}
	_, err = s.UpdateJob(ctx, "job-0", func(j *delegate.Job) error {
		j.Status, j.FinishedAt, j.ExitCode, j.Error, j.OOMKilled, j.OutputTruncated = delegate.StatusFailed, at.Add(time.Minute), &code, "exit 2", true, true
		j.OutputLostBytes, j.OutputLost, j.LastHeartbeat, j.Result = 5, "no space left", at, "the result"
		return nil
	})
	must(err)
	must(s.AppendOutput(ctx, "job-0", storetest.Pieces("out1\n", "E:err1\n"), 11))
	must(s.AppendOutput(ctx, "job-0", storetest.Pieces("E:err2\n"), 16))
	must(s.AppendOutput(ctx, "job-1", storetest.Pieces("hello"), 5))
	result := "partial"
	must(s.SaveProgress(ctx, []delegate.JobProgress{{ID: "job-1", Progress: "step 2", Heartbeat: at, Result: &result,
		Events: []delegate.Event{{Time: at, Message: "step 1"}, {Time: at.Add(time.Second), Message: "step 2"}}}}))
	must(s.AddEvent(ctx, "job-0", delegate.Event{Time: at, Message: "failed"}, delegate.MaxTimeline))
	must(s.AddArtifact(ctx, "job-0", delegate.Artifact{Name: "out/r.txt", Size: 3, SHA256: "abc"}))
	must(s.AddArtifact(ctx, "job-0", delegate.Artifact{Name: "big.bin", Size: 1 << 30, Skipped: "too big"}))
	q := storetest.NewQuestion("job-1", "q1")
	_, _, err = s.AddQuestion(ctx, q)
	must(err)
	_, _, err = s.AddQuestion(ctx, storetest.NewQuestion("job-1", "q0"))
	must(err)
	_, err = s.AnswerQuestion(ctx, "job-1", "q1", delegate.Answer{Action: delegate.AnswerAccept, Content: map[string]any{"color": "red"}, At: at, By: "me"})
	must(err)
	must(s.SaveBaseline(ctx, "job-2", "/src/project", []byte(`{"version":1,"files":[]}`)))
	must(s.SaveChanges(ctx, "job-2", delegate.WorkspaceChanges{Added: 1, Files: []delegate.ChangedFile{{Path: "x", Kind: "added", Size: 1}}}, []byte{0, 1, 2}))
	must(s.SaveApply(ctx, "sbx-kept", "/src/project", "job-2"))
	must(s.CreateSandbox(ctx, &delegate.Sandbox{ID: "sbx-kept", State: delegate.SandboxIdle, Backend: "local", Instance: "sb-9", JobID: "job-3",
		Owner: "owner-1", Resources: delegate.Resources{CPU: 1, Memory: "512M", Disk: "1G"}, CreatedAt: at, LastUsedAt: at,
		ExpiresAt: at.Add(time.Hour), IdleTimeout: time.Minute, PauseTimeout: time.Hour}))
	must(s.CreateSandbox(ctx, &delegate.Sandbox{ID: "sbx-gone", State: delegate.SandboxGone, Backend: "local", Instance: "sb-8",
		CreatedAt: at, LastUsedAt: at, ExpiresAt: at, EndedAt: at, Reason: "expired"}))
	must(s.CreateNetwork(ctx, &delegate.NetworkState{ID: "job-0", Policy: delegate.Allowlist("pypi.org"), TokenHash: "nh-0", Token: "tok",
		CA: []byte("ca"), CreatedAt: at}))
	must(s.AppendNetworkLog(ctx, "job-0", []delegate.NetworkEntry{{Time: at, Via: "dns", Name: "evil.test", QType: "A", Rule: "not allowed"},
		{Time: at, Via: "connect", Name: "pypi.org", Port: 443, Allowed: true, Sent: 1, Received: 2}}))
	must(s.CreateNetwork(ctx, &delegate.NetworkState{ID: "job-1", Policy: delegate.Egress(), TokenHash: "nh-1", CreatedAt: at, EndedAt: at}))
	_, err = s.UpdateJob(ctx, "job-4", func(j *delegate.Job) error { j.Status = delegate.StatusCancelled; return nil })
	must(err)
	return ids
}

// sameStores compares what two stores say of the same data, through
// the store interface: every job with all it keeps, the sandboxes, the
// networks and the count of finishes.
func sameStores(t *testing.T, a, b delegate.Store, ids []string) {
	t.Helper()
	ctx := context.Background()
	same := func(what string, x, y any, errs ...error) {
		t.Helper()
		for _, err := range errs {
			if err != nil {
				t.Errorf("%s: %v", what, err)
				return
			}
		}
		if !reflect.DeepEqual(x, y) {
			t.Errorf("%s:\n%+v\n%+v", what, x, y)
		}
	}
	for _, id := range ids {
		ja, err1 := a.GetJob(ctx, id)
		jb, err2 := b.GetJob(ctx, id)
		same("job "+id, micro(ja), micro(jb), err1, err2)
		fa, err1 := a.JobFiles(ctx, id)
		fb, err2 := b.JobFiles(ctx, id)
		same("files of "+id, fa, fb, err1, err2)
		oa, err1 := a.ReadOutput(ctx, id, 0, 1<<20)
		ob, err2 := b.ReadOutput(ctx, id, 0, 1<<20)
		same("output of "+id, storetest.Tagged(oa), storetest.Tagged(ob), err1, err2)
		for _, st := range []delegate.Stream{delegate.StreamStdout, delegate.StreamStderr} {
			ta, ka, err1 := a.StreamTail(ctx, id, st, 100)
			tb, kb, err2 := b.StreamTail(ctx, id, st, 100)
			same(fmt.Sprintf("%s tail of %s", st, id), fmt.Sprint(string(ta), ka), fmt.Sprint(string(tb), kb), err1, err2)
		}
		na, err1 := a.OutputSize(ctx, id)
		nb, err2 := b.OutputSize(ctx, id)
		same("output size of "+id, na, nb, err1, err2)
		ea, err1 := a.Events(ctx, id)
		eb, err2 := b.Events(ctx, id)
		same("timeline of "+id, ea, eb, err1, err2)
		aa, err1 := a.Artifacts(ctx, id)
		ab, err2 := b.Artifacts(ctx, id)
		same("artifacts of "+id, aa, ab, err1, err2)
		qa, err1 := a.Questions(ctx, id)
		qb, err2 := b.Questions(ctx, id)
		same("questions of "+id, qa, qb, err1, err2)
		wa, err1 := a.JobWorkspace(ctx, id)
		wb, err2 := b.JobWorkspace(ctx, id)
		if errors.Is(err1, delegate.ErrNotFound) && errors.Is(err2, delegate.ErrNotFound) {
			continue
		}
		same("workspace of "+id, wa, wb, err1, err2)
	}
	if ja, err := b.LastApply(ctx, "sbx-kept", "/src/project"); err != nil || ja != "job-2" {
		t.Errorf("the last apply, copied: %q %v, want job-2", ja, err)
	}
	sa, err1 := a.ListSandboxes(ctx, false, 100)
	sb, err2 := b.ListSandboxes(ctx, false, 100)
	same("sandboxes", sa, sb, err1, err2)
	for _, id := range []string{"job-0", "job-1"} {
		na, err1 := a.GetNetwork(ctx, id)
		nb, err2 := b.GetNetwork(ctx, id)
		same("network "+id, na, nb, err1, err2)
		la, err1 := a.NetworkLog(ctx, id, delegate.NetworkLogOptions{})
		lb, err2 := b.NetworkLog(ctx, id, delegate.NetworkLogOptions{})
		same("network log "+id, la, lb, err1, err2)
	}
	la, err1 := a.LiveNetworks(ctx)
	lb, err2 := b.LiveNetworks(ctx)
	same("live networks", la, lb, err1, err2)
	fa, err1 := a.Finishes(ctx)
	fb, err2 := b.Finishes(ctx)
	same("finishes", fa, fb, err1, err2)
	pa, _, err1 := a.ListJobs(ctx, delegate.JobFilter{Limit: 100})
	pb, _, err2 := b.ListJobs(ctx, delegate.JobFilter{Limit: 100})
	for i := range pa {
		pa[i] = micro(pa[i])
	}
	for i := range pb {
		pb[i] = micro(pb[i])
	}
	same("list", pa, pb, err1, err2)
}

// micro is the job with its times to the microsecond, as PostgreSQL
// keeps them (SQLite keeps nanoseconds).
func micro(j *delegate.Job) *delegate.Job {
	if j == nil {
		return nil
	}
	c := j.Clone()
	for _, t := range []*time.Time{&c.CreatedAt, &c.UpdatedAt, &c.StartedAt, &c.FinishedAt, &c.LastHeartbeat} {
		*t = t.Truncate(time.Microsecond)
	}
	return c
}

// TestCopyFromSQLite: a data dir's store copied into PostgreSQL reads
// back the same through the store interface, everything included; the
// copy goes on where the SQLite store was (new jobs list first, seqs
// after the copied ones); a second copy into it is refused, saying why,
// and changes nothing.
func TestCopyFromSQLite(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "jobs.db")
	ids := fillSQLite(t, path)
	pg := open(t, pgtest.New(t))
	c, err := pg.CopyFromSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Jobs != 5 || c.Sandboxes != 2 || c.Questions != 2 || c.Networks != 2 || c.OutputBytes != 20 || c.Workspaces != 1 {
		t.Errorf("copied %+v", c)
	}
	src, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	sameStores(t, src, pg, ids)

	if err := pg.CreateJob(ctx, storetest.NewJob("after")); err != nil {
		t.Fatal(err)
	}
	jobs, _, err := pg.ListJobs(ctx, delegate.JobFilter{Limit: 2})
	if err != nil || len(jobs) != 2 || jobs[0].ID != "after" || jobs[1].ID != "job-4" {
		t.Errorf("after the copy, the newest jobs: %v, %v", jobs, err)
	}
	if _, _, err := pg.AddQuestion(ctx, storetest.NewQuestion("job-1", "q2")); err != nil {
		t.Fatal(err)
	}
	if qs, _ := pg.Questions(ctx, "job-1"); len(qs) != 3 || qs[2].ID != "q2" {
		t.Errorf("a question asked after the copy: %+v", qs)
	}

	_, err = pg.CopyFromSQLite(ctx, path)
	var ne *postgres.NotEmptyError
	if !errors.As(err, &ne) || ne.Jobs != 6 || !strings.Contains(err.Error(), "is not empty (it holds 6 jobs, 2 sandboxes and 2 networks)") ||
		!strings.Contains(err.Error(), "nothing was copied") {
		t.Fatalf("a second copy: %v", err)
	}
	if n, err := pg.Finishes(ctx); err != nil || n != 2 {
		t.Errorf("finishes after a refused copy: %d, %v", n, err)
	}
}

// TestCopyFromSQLiteKnowsEverything: a SQLite store with a column (or a
// table) the copy does not know is refused, naming it, and nothing is
// copied; the store as this delegate makes it has none (a migration of
// the SQLite store that adds one fails this test until the copy learns
// it).
func TestCopyFromSQLiteKnowsEverything(t *testing.T) {
	ctx := context.Background()
	pg := open(t, pgtest.New(t))
	for _, c := range []struct{ alter, says string }{
		{`ALTER TABLE jobs ADD COLUMN future TEXT NOT NULL DEFAULT ''`, "table jobs has a column this delegate cannot copy (future)"},
		{`CREATE TABLE leases (name TEXT)`, "has a table this delegate cannot copy (leases)"},
	} {
		path := filepath.Join(t.TempDir(), "jobs.db")
		fillSQLite(t, path)
		raw, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = raw.Exec(c.alter)
		raw.Close()
		if err != nil {
			t.Fatal(err)
		}
		_, err = pg.CopyFromSQLite(ctx, path)
		if err == nil || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "nothing was copied") {
			t.Errorf("%s: %v", c.alter, err)
		}
		if jobs, _, err := pg.ListJobs(ctx, delegate.JobFilter{}); err != nil || len(jobs) != 0 {
			t.Errorf("copied %d jobs, %v", len(jobs), err)
		}
	}
	// A path that is not a store is not made one.
	if _, err := pg.CopyFromSQLite(ctx, filepath.Join(t.TempDir(), "none.db")); err == nil || !strings.Contains(err.Error(), "no SQLite store at") {
		t.Errorf("a missing file: %v", err)
	}
}
