// Package postgres keeps delegate's jobs in a PostgreSQL database (through
// pgx), for servers that share one store; package sqlite stays the
// embedded default. Both pass the same contract (storetest.Run).
//
// Every write is a transaction of its own on a pooled connection: the
// database orders concurrent writers with row locks (a job's row is
// locked FOR UPDATE while a change of it is decided), and commits them
// in groups itself (its WAL flushes take every commit waiting). The state
// machine is checked twice: by UpdateJob in Go, inside the transaction
// that holds the row, and by a trigger on jobs that refuses any change of
// status Transition forbids, whoever writes it.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"net/url"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is one PostgreSQL database: a pool of connections and the schema.
// Its stores, one per resource, share them; through them a DB is a
// delegate.Store.
type DB struct {
	*JobStore
	*ProgressStore
	*OutputStore
	*ArtifactStore
	*SandboxStore
	*QuestionStore
	*WorkspaceStore
	*NetworkStore
	*ServerStore
	*TokenStore
	*AuditStore
	*QuotaStore

	pool *pgxpool.Pool
	name string // the URL without its password, for messages
	// origin tags the changes made through this DB (every connection of
	// its pool sets delegate.origin to it): its job feed leaves them out.
	origin string
}

var _ delegate.Store = (*DB)(nil)

// IsURL says whether s names a PostgreSQL database (postgres:// or
// postgresql://, as libpq takes them).
func IsURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql")
}

// Redact is a database URL without its password, to be shown.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(a database URL that does not parse)"
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// Open connects to the database at url (postgres://user:password@host/db,
// or any form pgx takes) and brings its schema up to date.
func Open(ctx context.Context, dbURL string) (*DB, error) {
	name := Redact(dbURL)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		// pgx's message may quote the URL, password and all.
		return nil, fmt.Errorf("open %s: not a PostgreSQL URL (postgres://user:password@host:5432/database?sslmode=…)", name)
	}
	if cfg.MaxConns < 8 {
		cfg.MaxConns = 8 // writers wait on row locks, not on connections
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "delegate"
	origin := newOrigin()
	cfg.ConnConfig.RuntimeParams[originSetting] = origin
	// A transaction of delegate's holds its rows only while Go code
	// decides a change (never across a backend call): one left idle
	// longer (a server paused, or cut off) is ended by the database, so
	// that it does not hold other servers' writes behind its locks.
	// A URL that sets it wins.
	if _, ok := cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"]; !ok {
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = idleInTransaction
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	db := &DB{pool: pool, name: name, origin: origin}
	if err := db.migrate(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	db.JobStore = &JobStore{db: db}
	db.ProgressStore = &ProgressStore{db: db}
	db.OutputStore = &OutputStore{db: db}
	db.ArtifactStore = &ArtifactStore{db: db}
	db.SandboxStore = &SandboxStore{db: db}
	db.QuestionStore = &QuestionStore{db: db}
	db.WorkspaceStore = &WorkspaceStore{db: db}
	db.NetworkStore = &NetworkStore{db: db}
	db.ServerStore = &ServerStore{db: db}
	db.TokenStore = &TokenStore{db: db}
	db.AuditStore = &AuditStore{db: db}
	db.QuotaStore = &QuotaStore{db: db}
	return db, nil
}

// idleInTransaction is the longest one of delegate's transactions may wait
// between two statements (ms): twice writeTimeout, the longest a write of
// its own takes.
const idleInTransaction = "60000"

// Close closes the pool.
func (db *DB) Close() error {
	db.pool.Close()
	return nil
}

// String names the database (without its password).
func (db *DB) String() string { return db.name }

// migrationLock is the advisory lock migrations hold: servers that start
// together migrate one after the other (the second finds nothing to do).
const migrationLock = 0x64656c6567617465 // "delegate"

func (db *DB) migrate(ctx context.Context) error {
	return pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
			return fmt.Errorf("migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version integer PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("schema_migrations: %w", err)
		}
		var version int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&version); err != nil {
			return err
		}
		if version > len(migrations) {
			return fmt.Errorf("database schema version %d is newer than this delegate (%d): upgrade delegate", version, len(migrations))
		}
		for i := version; i < len(migrations); i++ {
			if _, err := tx.Exec(ctx, migrations[i]); err != nil {
				return fmt.Errorf("migration %d: %w", i+1, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, i+1); err != nil {
				return fmt.Errorf("migration %d: %w", i+1, err)
			}
		}
		return nil
	})
}

// SchemaVersion is how many migrations the database has had.
func (db *DB) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := db.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&v)
	return v, err
}

// isUnique says whether err is a unique constraint's violation.
func isUnique(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// isForeignKey says whether err is a foreign key's violation (a row of a
// job that does not exist).
func isForeignKey(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23503"
}
