package postgres_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/postgres"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/delegate-dev/delegate/sandboxtest"
	"github.com/delegate-dev/delegate/sqlite"
	"github.com/jackc/pgx/v5"
)

// The PostgreSQL store against the SQLite one, side by side in one run,
// each with the durability it ships with: SQLite in WAL mode with
// synchronous=NORMAL (a commit is in the WAL in the page cache), a
// PostgreSQL server of its own with fsync and synchronous_commit=on (a
// commit is on disk), both on the same file system (docs/BENCHMARKS.md,
// "The PostgreSQL store"):
//
//	go test -run X -bench BothStores -benchtime 400x ./postgres/

// stores makes the stores for a benchmark: for each, a function that
// opens a handle on it (another connection, or pool, each call). With
// async, a third: a database on the same PostgreSQL server with
// synchronous_commit=off, whose commit is in the server's memory when
// it returns (as SQLite's is in the page cache): what the store costs
// besides the disk's flush.
func stores(b *testing.B, async bool) map[string]func() delegate.Store {
	b.Helper()
	path := filepath.Join(b.TempDir(), "jobs.db")
	srv := pgtest.Own(b, pgtest.Options{Durable: true})
	url := srv.NewDatabase(b)
	m := map[string]func() delegate.Store{
		"sqlite": func() delegate.Store {
			s, err := sqlite.Open(context.Background(), path)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		},
		"postgres": func() delegate.Store { return open(b, url) },
	}
	if async {
		url := srv.NewDatabase(b)
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', current_database()); END $$`); err != nil {
			b.Fatal(err)
		}
		m["postgres-async"] = func() delegate.Store { return open(b, url) }
	}
	return m
}

// newEngine is an engine over store with the in-memory backend and one
// run slot, taken by a job that runs until the end: what is submitted
// then waits, stored, as pending.
// Each of set changes its configuration first.
func newEngine(b testing.TB, store delegate.Store, set ...func(*engine.Config)) *engine.Engine {
	b.Helper()
	cfg := engine.Config{MaxConcurrent: 1, PollInterval: time.Second,
		Defaults: delegate.Defaults{Timeout: 60, CPU: 1, Memory: "64M", Disk: "16M"}, ArtifactDir: b.TempDir()}
	for _, f := range set {
		f(&cfg)
	}
	eng := engine.New(store, sandboxtest.NewFake(), cfg)
	if err := eng.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { eng.Close() })
	day := 86400
	if _, err := eng.Submit(context.Background(), delegate.Manifest{AgentType: delegate.AgentScript, Task: "sleep 86400", Timeout: &day},
		delegate.SubmitOptions{}); err != nil {
		b.Fatal(err)
	}
	return eng
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// twoCommits is a store that does not store a job and its audit entry
// together (its delegate.AuditedJobStore hidden): the engine appends the
// entry in a commit of its own, as it did before.
type twoCommits struct{ delegate.Store }

// BenchmarkSubmitBothStores: the engine's Submit (checks, the job stored,
// queued), one at a time, on each store in turn, in blocks of 20 that
// alternate so that a slow moment of the machine falls on both. An op is
// one submission to each; the figures are each store's median and the
// ratios to SQLite's.
func BenchmarkSubmitBothStores(b *testing.B) {
	ctx := context.Background()
	engines := map[string]*engine.Engine{}
	for name, open := range stores(b, true) {
		engines[name] = newEngine(b, open())
		if name == "postgres" {
			// The same database, the submission's audit entry in a
			// commit of its own, as before it was folded into the
			// job's statement: the figure this replaces.
			engines["postgres-two-commits"] = newEngine(b, twoCommits{open()})
		}
	}
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "make test", Env: map[string]string{"A": "b"}}
	took := map[string][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i += 20 {
		for _, name := range []string{"sqlite", "postgres", "postgres-two-commits", "postgres-async"} {
			for range min(20, b.N-i) {
				t0 := time.Now()
				if _, err := engines[name].Submit(ctx, m, delegate.SubmitOptions{}); err != nil {
					b.Fatal(err)
				}
				took[name] = append(took[name], time.Since(t0))
			}
		}
	}
	b.StopTimer()
	lite, pg, async := p50(took["sqlite"]), p50(took["postgres"]), p50(took["postgres-async"])
	b.ReportMetric(ms(lite), "sqlite-p50-ms")
	b.ReportMetric(ms(pg), "postgres-p50-ms")
	b.ReportMetric(float64(pg)/float64(lite), "postgres/sqlite")
	two := p50(took["postgres-two-commits"])
	b.ReportMetric(ms(two), "two-commits-p50-ms")
	b.ReportMetric(float64(two)/float64(lite), "two-commits/sqlite")
	b.ReportMetric(ms(async), "async-p50-ms")
	b.ReportMetric(float64(async)/float64(lite), "async/sqlite")
}

// BenchmarkListBothStores: one page of list_jobs (the default limit,
// newest first) through the engine, over 10,000 finished jobs, read by
// another engine on another handle of the store, as another server
// would (its manifest cache empty at first). An op is a page from each
// store; the figures are each one's median, and the first page (its
// manifests read from the store).
func BenchmarkListBothStores(b *testing.B) {
	ctx := context.Background()
	const jobs = 10000
	readers := map[string]*engine.Engine{}
	cold := map[string]time.Duration{}
	for name, open := range stores(b, false) {
		fill(b, open(), jobs)
		eng := engine.New(open(), nil, engine.Config{})
		b.Cleanup(func() { eng.Close() })
		// Its connection made (a server's is), not its manifests read.
		if _, err := eng.List(ctx, delegate.ListOptions{Status: delegate.StatusRunning}); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		page, err := eng.List(ctx, delegate.ListOptions{})
		cold[name] = time.Since(t0)
		if err != nil || len(page.Jobs) != delegate.DefaultPageSize || page.NextCursor == "" {
			b.Fatalf("%s: a page of %d jobs, %v", name, len(page.Jobs), err)
		}
		readers[name] = eng
	}
	took := map[string][]time.Duration{}
	b.ResetTimer()
	for range b.N {
		for _, name := range []string{"sqlite", "postgres"} {
			t0 := time.Now()
			if _, err := readers[name].List(ctx, delegate.ListOptions{}); err != nil {
				b.Fatal(err)
			}
			took[name] = append(took[name], time.Since(t0))
		}
	}
	b.StopTimer()
	b.ReportMetric(ms(p50(took["sqlite"])), "sqlite-p50-ms")
	b.ReportMetric(ms(p50(took["postgres"])), "postgres-p50-ms")
	b.ReportMetric(ms(cold["sqlite"]), "sqlite-first-ms")
	b.ReportMetric(ms(cold["postgres"]), "postgres-first-ms")
}

// fill stores n finished jobs, 16 writers at once.
func fill(b *testing.B, s delegate.Store, n int) {
	b.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				now := time.Now().UTC()
				code := 0
				j := &delegate.Job{ID: fmt.Sprintf("job-%06d", i), Status: delegate.StatusSuccess, ExitCode: &code,
					Manifest: delegate.Manifest{AgentType: delegate.AgentScript, Task: fmt.Sprintf("go test ./... # run %d", i),
						Env: map[string]string{"CI": "1"}},
					Progress: "done", CreatedAt: now, UpdatedAt: now, StartedAt: now, FinishedAt: now, Backend: "local", OutputBytes: 1234}
				if err := s.CreateJob(ctx, j); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkCopyFromSQLite: `delegate store migrate` of a data dir of
// 10,000 finished jobs, each with 4 KiB of output in two appends and a
// timeline entry, into an empty database (fsync on); an op is one whole
// copy.
func BenchmarkCopyFromSQLite(b *testing.B) {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "jobs.db")
	lite, err := sqlite.Open(ctx, path)
	if err != nil {
		b.Fatal(err)
	}
	const jobs = 10000
	fill(b, lite, jobs)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < jobs; i += 8 {
				id := fmt.Sprintf("job-%06d", i)
				for range 2 {
					if err := lite.AppendOutput(ctx, id, []delegate.Output{{Stream: delegate.StreamStdout, Data: make([]byte, 2048)}}, 0); err != nil {
						b.Error(err)
						return
					}
				}
				if err := lite.AddEvent(ctx, id, delegate.Event{Time: time.Now(), Message: "done"}, delegate.MaxTimeline); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	lite.Close()
	srv := pgtest.Own(b, pgtest.Options{Durable: true})
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		pg := open(b, srv.NewDatabase(b))
		b.StartTimer()
		c, err := pg.CopyFromSQLite(ctx, path)
		if err != nil || c.Jobs != jobs || c.OutputBytes != jobs*4096 {
			b.Fatalf("copied %+v, %v", c, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/copy")
}

// BenchmarkSubmitServers: submissions from concurrent clients, four per
// server, to one server, then to three, each server an engine with its
// own connection pool on one PostgreSQL database (synchronous_commit=on),
// as three `delegate serve` share a store; one SQLite server with four
// clients besides, for scale. An op is 96 submissions to each set-up in
// turn; the figures are each one's submissions a second, and the ratio
// of three servers' to one's (the database's group commit lets
// concurrent commits share a flush).
func BenchmarkSubmitServers(b *testing.B) {
	ctx := context.Background()
	all := stores(b, false)
	setups := []struct {
		name    string
		engines []*engine.Engine
	}{
		{"sqlite-one", []*engine.Engine{newEngine(b, all["sqlite"]())}},
		{"postgres-one", []*engine.Engine{newEngine(b, all["postgres"]())}},
		{"postgres-three", []*engine.Engine{newEngine(b, all["postgres"]()), newEngine(b, all["postgres"]()), newEngine(b, all["postgres"]())}},
	}
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "make test", Env: map[string]string{"A": "b"}}
	const clients, perOp = 4, 96
	took := map[string]time.Duration{}
	b.ResetTimer()
	for range b.N {
		for _, s := range setups {
			per := perOp / (len(s.engines) * clients)
			t0 := time.Now()
			var wg sync.WaitGroup
			for _, e := range s.engines {
				for range clients {
					wg.Go(func() {
						for range per {
							if _, err := e.Submit(ctx, m, delegate.SubmitOptions{}); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
			}
			wg.Wait()
			took[s.name] += time.Since(t0)
		}
	}
	b.StopTimer()
	rate := func(name string) float64 { return float64(b.N*perOp) / took[name].Seconds() }
	b.ReportMetric(rate("sqlite-one"), "sqlite-one/s")
	b.ReportMetric(rate("postgres-one"), "pg-one/s")
	b.ReportMetric(rate("postgres-three"), "pg-three/s")
	b.ReportMetric(rate("postgres-three")/rate("postgres-one"), "three/one")
}

// timedStore is the PostgreSQL store with the time of each submit's
// store call kept: the engine's own share of a submit is the rest.
type timedStore struct {
	*postgres.DB
	took *[]time.Duration
}

func (s timedStore) CreateJobAudited(ctx context.Context, job *delegate.Job, admit delegate.Admit, e *delegate.AuditEntry) error {
	t0 := time.Now()
	err := s.DB.CreateJobAudited(ctx, job, admit, e)
	*s.took = append(*s.took, time.Since(t0))
	return err
}

// BenchmarkSubmitProfile: where a submit's time goes on PostgreSQL, each
// part measured in the same run as SQLite's whole submit, in blocks of 20
// that alternate (an op is one of each). The parts: the engine's submit
// over the Unix socket and its store call alone (the engine's own share
// is the difference); over loopback TCP; with a quota set (its
// principal's lock and what it holds read in the transaction; a new
// principal each time, so that what it holds stays empty); on a database
// with synchronous_commit=off (no flush: for context), and with a quota
// there too (what the quota's transaction costs, the flush apart); a round trip
// (SELECT 1) on a connection over each transport, and through the pool
// (its acquisition on top); a COMMIT of a one-row insert with the flush
// and without (SET LOCAL synchronous_commit=off), whose difference is
// what the durable commit waits for; and the disk's own flush at the same
// moments (8 KiB written and fdatasync'd in a file beside the database's,
// as pg_test_fsync does), against PostgreSQL's own account of its WAL's
// fdatasync calls (pg_stat_wal, with track_wal_io_timing).
//
//	go test -run X -bench SubmitProfile -benchtime 400x ./postgres/
func BenchmarkSubmitProfile(b *testing.B) {
	ctx := context.Background()
	srv := pgtest.Own(b, pgtest.Options{Durable: true, TCP: true})
	unixURL := srv.NewDatabase(b)
	tcpURL := srv.OverTCP(unixURL)
	asyncURL := srv.NewDatabase(b)
	conn := func(url string) *pgx.Conn {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close(ctx) })
		return c
	}
	admin := conn(asyncURL)
	if _, err := admin.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', current_database()); END $$`); err != nil {
		b.Fatal(err)
	}
	lite, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "jobs.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lite.Close() })
	var storeCall []time.Duration
	engines := map[string]*engine.Engine{
		"sqlite":   newEngine(b, lite),
		"pg":       newEngine(b, timedStore{open(b, unixURL), &storeCall}),
		"pg-tcp":   newEngine(b, open(b, tcpURL)),
		"pg-async": newEngine(b, open(b, asyncURL)),
	}
	quotas := func(c *engine.Config) { c.Quotas = engine.Quotas{Jobs: 1 << 20} }
	engines["pg-quota"] = newEngine(b, open(b, unixURL), quotas)
	engines["pg-quota-async"] = newEngine(b, open(b, asyncURL), quotas)
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "make test", Env: map[string]string{"A": "b"}}

	unixConn, tcpConn, commitConn := conn(unixURL), conn(tcpURL), conn(unixURL)
	pool := open(b, unixURL) // its pool, through a read of the store
	if _, err := commitConn.Exec(ctx, `CREATE TABLE flushes (id bigserial PRIMARY KEY, note text)`); err != nil {
		b.Fatal(err)
	}
	flushFile, err := os.OpenFile(filepath.Join(srv.Dir(), "flush-probe"), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { flushFile.Close() })
	page := make([]byte, 8192)

	took := map[string][]time.Duration{}
	timed := stepTimer(b, took)
	selectOne := func(c *pgx.Conn) func() error {
		return func() error { var one int; return c.QueryRow(ctx, "SELECT 1").Scan(&one) }
	}
	commit := func(name string, flush bool) {
		if _, err := commitConn.Exec(ctx, "BEGIN"); err != nil {
			b.Fatal(err)
		}
		if !flush {
			if _, err := commitConn.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := commitConn.Exec(ctx, "INSERT INTO flushes (note) VALUES ($1)", "a row"); err != nil {
			b.Fatal(err)
		}
		timed(name, func() error { _, err := commitConn.Exec(ctx, "COMMIT"); return err })
	}
	// PostgreSQL's own account of its WAL flushes (pg_stat_wal): how long
	// its fdatasync calls took, as each backend reports them.
	for _, sql := range []string{"ALTER SYSTEM SET track_wal_io_timing = on", "SELECT pg_reload_conf()", "SELECT pg_stat_reset_shared('wal')"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	n := 0
	submitAs := func(name string) func() {
		return func() {
			n++
			pctx := delegate.WithPrincipal(ctx, &delegate.Principal{Name: fmt.Sprintf("agent-%d", n), Scopes: []delegate.Scope{delegate.ScopeJobs}})
			timed(name, func() error { _, err := engines[name].Submit(pctx, m, delegate.SubmitOptions{}); return err })
		}
	}
	steps := []func(){
		func() {
			timed("sqlite", func() error { _, err := engines["sqlite"].Submit(ctx, m, delegate.SubmitOptions{}); return err })
		},
		func() {
			timed("pg", func() error { _, err := engines["pg"].Submit(ctx, m, delegate.SubmitOptions{}); return err })
		},
		func() {
			timed("pg-tcp", func() error { _, err := engines["pg-tcp"].Submit(ctx, m, delegate.SubmitOptions{}); return err })
		},
		submitAs("pg-quota"),
		submitAs("pg-quota-async"),
		func() {
			timed("pg-async", func() error { _, err := engines["pg-async"].Submit(ctx, m, delegate.SubmitOptions{}); return err })
		},
		func() { timed("rt-unix", selectOne(unixConn)) },
		func() { timed("rt-tcp", selectOne(tcpConn)) },
		func() {
			timed("rt-pool", func() error { _, err := pool.SchemaVersion(ctx); return err })
		},
		func() { commit("commit-flush", true) },
		func() { commit("commit-noflush", false) },
		func() {
			timed("fdatasync", func() error {
				if _, err := flushFile.WriteAt(page, 0); err != nil {
					return err
				}
				return flushFile.Sync()
			})
		},
	}
	b.ResetTimer()
	for i := 0; i < b.N; i += 20 {
		for _, step := range steps {
			for range min(20, b.N-i) {
				step()
			}
		}
	}
	b.StopTimer()
	var syncs int64
	var syncMS float64
	if err := admin.QueryRow(ctx, "SELECT wal_sync, wal_sync_time FROM pg_stat_wal").Scan(&syncs, &syncMS); err != nil {
		b.Fatal(err)
	}
	p := func(name string) float64 { return ms(p50(took[name])) }
	base := p("sqlite")
	for _, name := range []string{"sqlite", "pg", "pg-tcp", "pg-quota", "pg-async", "pg-quota-async", "rt-unix", "rt-tcp", "rt-pool", "commit-flush", "commit-noflush", "fdatasync"} {
		b.ReportMetric(p(name), name+"-ms")
	}
	b.ReportMetric(ms(p50(storeCall)), "pg-store-call-ms")
	b.ReportMetric(p("pg")/base, "pg/sqlite")
	b.ReportMetric(p("pg-tcp")/base, "pg-tcp/sqlite")
	b.ReportMetric(p("pg-quota")/base, "pg-quota/sqlite")
	b.ReportMetric(p("pg-async")/base, "pg-async/sqlite")
	b.ReportMetric(p("commit-flush")-p("commit-noflush"), "flush-wait-ms")
	b.ReportMetric(syncMS/float64(max(syncs, 1)), "wal-fdatasync-mean-ms")
	b.ReportMetric(ms(mean(took["fdatasync"])), "fdatasync-mean-ms")
	b.ReportMetric(ms(mean(took["commit-flush"])), "commit-flush-mean-ms")
	b.ReportMetric(p("pg-quota-async")-p("pg-async"), "quota-extra-async-ms")
	b.ReportMetric(load1(), "loadavg")
}

func mean(d []time.Duration) time.Duration {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(max(len(d), 1))
}

// load1 is the machine's load average over the last minute (0 where
// /proc/loadavg is not).
func load1() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f, _, _ := strings.Cut(string(b), " ")
	v, _ := strconv.ParseFloat(f, 64)
	return v
}

// BenchmarkSubmitFlush: what a durable submit waits for on this disk,
// beside SQLite's whole submit, in one run (docs/BENCHMARKS.md, "What a
// durable submit waits for"):
//
//	go test -run X -bench SubmitFlush -benchtime 200x ./postgres/
//
// Three PostgreSQL 15 servers of their own, each as Debian ships it but
// for one setting: the defaults (wal_sync_method=fdatasync on Linux),
// wal_sync_method=open_datasync (the WAL opened O_DSYNC: a write is
// flushed as it is made), and commit_delay=100 µs with commit_siblings=2
// (a committing backend waits that long for others to join its flush,
// when at least two others are in a transaction); every one with fsync,
// synchronous_commit and full_page_writes on. Alternating in blocks of
// 20: a submit on SQLite (WAL, synchronous=NORMAL); one on each server;
// one on a database of the default server with synchronous_commit=off
// (all but the flush, for scale); and the bare flush in the default
// server's directory: 8 KiB written and fdatasync'd at one place, the
// same appended through a 16 MiB file written beforehand (as a WAL
// segment is), and 8 KiB written through an O_DSYNC descriptor. Then, each
// round, concurrent submits (three engines, four clients each, as three
// servers on one database) on the default server and on the commit_delay
// one.
func BenchmarkSubmitFlush(b *testing.B) {
	ctx := context.Background()
	servers := map[string]*pgtest.Server{
		"pg":               pgtest.Own(b, pgtest.Options{Durable: true}),
		"pg-open_datasync": pgtest.Own(b, pgtest.Options{Durable: true, Settings: map[string]string{"wal_sync_method": "open_datasync"}}),
		"pg-commit_delay":  pgtest.Own(b, pgtest.Options{Durable: true, Settings: map[string]string{"commit_delay": "100", "commit_siblings": "2"}}),
	}
	urls := map[string]string{}
	for name, srv := range servers {
		urls[name] = srv.NewDatabase(b)
		if name == "pg" {
			// All but the flush: a database of the default server whose
			// commits wait for no disk.
			urls["pg-async"] = srv.NewDatabase(b)
		}
		var got [6]string
		c, err := pgx.Connect(ctx, urls[name])
		if err != nil {
			b.Fatal(err)
		}
		err = c.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('full_page_writes'),
			current_setting('wal_sync_method'), current_setting('commit_delay'), current_setting('wal_buffers')`).Scan(&got[0], &got[1], &got[2], &got[3], &got[4], &got[5])
		c.Close(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if got[0] != "on" || got[1] != "on" || got[2] != "on" {
			b.Fatalf("%s: fsync=%s synchronous_commit=%s full_page_writes=%s: not durable", name, got[0], got[1], got[2])
		}
		b.Logf("%s: fsync=%s synchronous_commit=%s full_page_writes=%s wal_sync_method=%s commit_delay=%s wal_buffers=%s", name, got[0], got[1], got[2], got[3], got[4], got[5])
	}
	admin, err := pgx.Connect(ctx, urls["pg-async"])
	if err != nil {
		b.Fatal(err)
	}
	_, err = admin.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', current_database()); END $$`)
	admin.Close(ctx)
	if err != nil {
		b.Fatal(err)
	}
	lite, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "jobs.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lite.Close() })
	engines := map[string]*engine.Engine{"sqlite": newEngine(b, lite)}
	for name, url := range urls {
		engines[name] = newEngine(b, open(b, url))
	}
	probe := func(flag int) *os.File {
		f, err := os.OpenFile(filepath.Join(servers["pg"].Dir(), fmt.Sprintf("flush-probe-%d", flag)), os.O_CREATE|os.O_WRONLY|flag, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close() })
		return f
	}
	plain, dsync, wal := probe(0), probe(syncFlag), probe(0)
	page := make([]byte, 8192)
	// wal is laid out as a WAL segment is: 16 MiB written and flushed
	// before use, then written 8 KiB after 8 KiB, each flushed.
	const segment = 16 << 20
	if _, err := wal.WriteAt(make([]byte, segment), 0); err != nil {
		b.Fatal(err)
	}
	if err := wal.Sync(); err != nil {
		b.Fatal(err)
	}
	var walAt int64
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "make test", Env: map[string]string{"A": "b"}}
	took := map[string][]time.Duration{}
	timed := stepTimer(b, took)
	submit := func(name string) func() {
		return func() {
			timed(name, func() error { _, err := engines[name].Submit(ctx, m, delegate.SubmitOptions{}); return err })
		}
	}
	steps := []func(){submit("sqlite"), submit("pg"), submit("pg-open_datasync"), submit("pg-commit_delay"), submit("pg-async"),
		func() {
			timed("fdatasync", func() error {
				if _, err := plain.WriteAt(page, 0); err != nil {
					return err
				}
				return datasync(plain)
			})
		},
		func() {
			timed("fdatasync-append", func() error {
				if _, err := wal.WriteAt(page, walAt); err != nil {
					return err
				}
				walAt = (walAt + int64(len(page))) % segment
				return datasync(wal)
			})
		},
		func() { timed("o_dsync", func() error { _, err := dsync.WriteAt(page, 0); return err }) },
	}
	// Three servers' engines on each of two databases, four clients each:
	// 48 submits a batch.
	const clients, per = 4, 4
	concurrent := func(name string) func() {
		var es []*engine.Engine
		for range 3 {
			es = append(es, newEngine(b, open(b, urls[name])))
		}
		return func() {
			var mu sync.Mutex
			var wg sync.WaitGroup
			t0 := time.Now()
			for _, e := range es {
				for range clients {
					wg.Go(func() {
						for range per {
							s0 := time.Now()
							if _, err := e.Submit(ctx, m, delegate.SubmitOptions{}); err != nil {
								b.Error(err)
								return
							}
							mu.Lock()
							took[name+"-concurrent"] = append(took[name+"-concurrent"], time.Since(s0))
							mu.Unlock()
						}
					})
				}
			}
			wg.Wait()
			took[name+"-batch"] = append(took[name+"-batch"], time.Since(t0))
		}
	}
	batches := []func(){concurrent("pg"), concurrent("pg-commit_delay")}
	b.ResetTimer()
	for i := 0; i < b.N; i += 20 {
		for _, step := range steps {
			for range min(20, b.N-i) {
				step()
			}
		}
		for _, batch := range batches {
			batch()
		}
	}
	b.StopTimer()
	p := func(name string, q float64) float64 {
		s := slices.Clone(took[name])
		slices.Sort(s)
		return ms(s[min(int(q*float64(len(s))), len(s)-1)])
	}
	base := p("sqlite", 0.5)
	for _, name := range []string{"sqlite", "pg", "pg-open_datasync", "pg-commit_delay", "pg-async", "fdatasync", "fdatasync-append", "o_dsync"} {
		b.ReportMetric(p(name, 0.5), name+"-p50-ms")
	}
	for _, q := range []float64{0.1, 0.9, 0.99} {
		b.ReportMetric(p("fdatasync", q), fmt.Sprintf("fdatasync-p%d-ms", int(q*100)))
		b.ReportMetric(p("pg", q), fmt.Sprintf("pg-p%d-ms", int(q*100)))
	}
	b.ReportMetric(p("pg", 0.5)/base, "pg/sqlite")
	b.ReportMetric(p("fdatasync", 0.5)/base, "fdatasync/sqlite")
	b.ReportMetric(p("pg-open_datasync", 0.5)/base, "open_datasync/sqlite")
	b.ReportMetric(p("pg-commit_delay", 0.5)/base, "commit_delay/sqlite")
	b.ReportMetric(p("pg-async", 0.5)/base, "async/sqlite")
	for _, name := range []string{"pg", "pg-commit_delay"} {
		var sum time.Duration
		for _, d := range took[name+"-batch"] {
			sum += d
		}
		b.ReportMetric(float64(len(took[name+"-concurrent"]))/sum.Seconds(), name+"-concurrent/s")
		b.ReportMetric(p(name+"-concurrent", 0.5), name+"-concurrent-p50-ms")
	}
	b.ReportMetric(load1(), "loadavg")
}

// stepTimer times a benchmark's named steps into took, each call one
// duration of that step; a step's error ends the benchmark, naming it.
func stepTimer(b *testing.B, took map[string][]time.Duration) func(name string, fn func() error) {
	return func(name string, fn func() error) {
		t0 := time.Now()
		if err := fn(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		took[name] = append(took[name], time.Since(t0))
	}
}
