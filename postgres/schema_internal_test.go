package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/delegate-dev/delegate/storetest"
	"github.com/jackc/pgx/v5/pgconn"
)

func openDB(t *testing.T, url string) *DB {
	t.Helper()
	db, err := Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestTriggerIsTheStateMachine: the trigger on jobs refuses exactly the
// changes of status delegate.Transition refuses, for a write that does
// not go through UpdateJob (raw SQL, as another program might), and
// counts the finishes it lets through.
func TestTriggerIsTheStateMachine(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, pgtest.New(t))
	finishes := int64(0)
	for _, from := range delegate.Statuses {
		for _, to := range delegate.Statuses {
			if from == to {
				continue
			}
			id := fmt.Sprintf("%s-%s", from, to)
			j := storetest.NewJob(id)
			j.Status = from
			if err := db.CreateJob(ctx, j); err != nil {
				t.Fatal(err)
			}
			if from.Terminal() {
				finishes++
			}
			_, err := db.pool.Exec(ctx, `UPDATE jobs SET status = $1 WHERE id = $2`, string(to), id)
			var pe *pgconn.PgError
			switch allowed := delegate.CanTransition(from, to); {
			case allowed && err != nil:
				t.Errorf("%s -> %s: refused: %v", from, to, err)
			case !allowed && (!errors.As(err, &pe) || pe.Code != "23514" || !strings.Contains(pe.Message, "not a transition")):
				t.Errorf("%s -> %s: %v, want the trigger's refusal", from, to, err)
			case allowed && to.Terminal() && !from.Terminal():
				finishes++
			}
			got, err := db.GetJob(ctx, id)
			if want := map[bool]delegate.Status{true: to, false: from}[delegate.CanTransition(from, to)]; err != nil || got.Status != want {
				t.Errorf("%s -> %s: stored %s, %v; want %s", from, to, got.Status, err, want)
			}
		}
	}
	if n, err := db.Finishes(ctx); err != nil || n != finishes {
		t.Errorf("finishes %d, %v; want %d", n, err, finishes)
	}
}

// TestMigrations: servers that start together on an empty database
// migrate it once; the version is recorded; a database migrated by a
// newer delegate is refused, saying so.
func TestMigrations(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			db, err := Open(ctx, url)
			if err == nil {
				db.Close()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a server starting with three others: %v", err)
		}
	}
	db := openDB(t, url)
	if v, err := db.SchemaVersion(ctx); err != nil || v != len(migrations) {
		t.Fatalf("schema version %d, %v; want %d", v, err, len(migrations))
	}
	var runs int
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&runs); err != nil || runs != len(migrations) {
		t.Fatalf("%d migrations recorded, %v", runs, err)
	}
	if _, err := db.pool.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, len(migrations)+1); err != nil {
		t.Fatal(err)
	}
	_, err := Open(ctx, url)
	if err == nil || !strings.Contains(err.Error(), "newer than this delegate") || !strings.Contains(err.Error(), "upgrade delegate") {
		t.Fatalf("a newer schema: %v", err)
	}
}

// TestOpenSaysWhichDatabase: a URL that does not parse, or a server
// that is not there, is an error naming the database without its
// password.
func TestOpenSaysWhichDatabase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for url, says := range map[string]string{
		"postgres://u:s3cret@127.0.0.1:1/nodb?connect_timeout=5": "open postgres://u:xxxxx@127.0.0.1:1/nodb",
		"postgres://u:s3cret@%zz/x":                              "not a PostgreSQL URL",
	} {
		_, err := Open(ctx, url)
		if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), says) {
			t.Errorf("Open(%q) = %v", url, err)
		}
	}
}

// TestTextWithoutNUL: what a job's process wrote may hold NUL bytes and
// invalid UTF-8, which PostgreSQL text refuses: progress, timeline,
// result and error are stored with U+FFFD in their place, and the batch
// they came in is not lost.
func TestTextWithoutNUL(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, pgtest.New(t))
	if err := db.CreateJob(ctx, storetest.NewJob("j")); err != nil {
		t.Fatal(err)
	}
	bad := "a\x00b\xffc"
	result := bad
	if err := db.SaveProgress(ctx, []delegate.JobProgress{{ID: "j", Progress: bad, Result: &result,
		Events: []delegate.Event{{Time: time.Now(), Message: bad}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.UpdateJob(ctx, "j", func(j *delegate.Job) error { j.Status, j.Error = delegate.StatusFailed, bad; return nil }); err != nil {
		t.Fatal(err)
	}
	j, err := db.GetJob(ctx, "j")
	want := "a\uFFFDb\uFFFDc"
	if err != nil || j.Progress != want || j.Result != want || j.Error != want {
		t.Fatalf("%+v, %v", j, err)
	}
	if evs, err := db.Events(ctx, "j"); err != nil || len(evs) != 1 || evs[0].Message != want {
		t.Fatalf("events %+v, %v", evs, err)
	}
	// A file name is bytes: an artifact whose name is not UTF-8 is
	// stored, and found by the name it was added with.
	if err := db.AddArtifact(ctx, "j", delegate.Artifact{Name: "out/\xff.bin", Size: 1, SHA256: "s"}); err != nil {
		t.Fatal(err)
	}
	if a, err := db.Artifact(ctx, "j", "out/\xff.bin"); err != nil || a.Name != "out/\uFFFD.bin" {
		t.Fatalf("artifact by its name: %+v, %v", a, err)
	}
}

// TestRedact: a URL is shown without its password, wherever it is.
func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:s3cret@db:5432/delegate?sslmode=require":  "postgres://u:xxxxx@db:5432/delegate?sslmode=require",
		"postgres://u@db/delegate?password=s3cret&sslmode=none": "postgres://u@db/delegate?password=xxxxx&sslmode=none",
		"postgres://db/delegate":                                "postgres://db/delegate",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestIdleInTransaction: a transaction left idle is ended by the
// database after a minute (a URL may say otherwise), so that a paused
// server does not hold other servers' writes behind its row locks.
func TestIdleInTransaction(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	for u, want := range map[string]string{url: "1min", url + "&idle_in_transaction_session_timeout=5000": "5s"} {
		db := openDB(t, u)
		var got string
		if err := db.pool.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&got); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", u, got, err, want)
		}
	}
}
