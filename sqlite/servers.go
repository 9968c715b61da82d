package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
)

// ServerStore keeps the processes that share the file, their leases and
// terms. Every process sharing a SQLite file runs on one host, so the
// store's clock is that host's; the comparisons are made in the one
// write transaction at a time, which is what SKIP LOCKED buys PostgreSQL.
// It implements delegate.ServerStore on a DB.
type ServerStore struct{ db *DB }

var _ delegate.ServerStore = (*ServerStore)(nil)

// forgetAfter: a server whose lease ended this long ago is forgotten.
const forgetAfter = time.Hour

const serverColumns = `id, host, host_id, pid_namespace, addr, backend, started_at, renewed_at, expires_at, draining`

func scanServer(row scanner, now time.Time) (delegate.Server, error) {
	var (
		s                         delegate.Server
		started, renewed, expires int64
	)
	err := row.Scan(&s.ID, &s.Host, &s.HostID, &s.PIDNamespace, &s.Addr, &s.Backend, &started, &renewed, &expires, &s.Draining)
	s.StartedAt, s.RenewedAt, s.ExpiresAt = fromNanos(started), fromNanos(renewed), fromNanos(expires)
	s.Live = s.ExpiresAt.After(now)
	return s, err
}

// RegisterServer records a server whose lease runs ttl from now.
func (s *ServerStore) RegisterServer(ctx context.Context, srv delegate.Server, ttl time.Duration) (delegate.Server, error) {
	if srv.ID == "" || ttl <= 0 {
		return delegate.Server{}, fmt.Errorf("register server: %w: an id and a positive lease", delegate.ErrInvalid)
	}
	var out delegate.Server
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		now := time.Now().UTC()
		if _, err := tx.Exec(`DELETE FROM servers WHERE expires_at < ?`, now.Add(-forgetAfter).UnixNano()); err != nil {
			return err
		}
		if _, err := tx.Exec(`INSERT INTO servers (`+serverColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0)`,
			srv.ID, srv.Host, srv.HostID, srv.PIDNamespace, srv.Addr, srv.Backend, now.UnixNano(), now.UnixNano(),
			now.Add(ttl).UnixNano()); err != nil {
			if strings.Contains(err.Error(), "UNIQUE") {
				return fmt.Errorf("server %s is registered already: %w", srv.ID, delegate.ErrConflict)
			}
			return err
		}
		var err error
		out, err = scanServer(tx.QueryRow(`SELECT `+serverColumns+` FROM servers WHERE id = ?`, srv.ID), now)
		return err
	})
	if err != nil {
		return delegate.Server{}, fmt.Errorf("register server %s: %w", srv.ID, err)
	}
	return out, nil
}

// RenewServer extends a live lease; an expired one stays expired.
func (s *ServerStore) RenewServer(ctx context.Context, id string, ttl time.Duration) (delegate.Server, error) {
	var out delegate.Server
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		now := time.Now().UTC()
		res, err := tx.Exec(`UPDATE servers SET renewed_at = ?, expires_at = ? WHERE id = ? AND expires_at > ?`,
			now.UnixNano(), now.Add(ttl).UnixNano(), id, now.UnixNano())
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("server %s: its lease has expired: %w", id, delegate.ErrLeaseLost)
		}
		out, err = scanServer(tx.QueryRow(`SELECT `+serverColumns+` FROM servers WHERE id = ?`, id), now)
		return err
	})
	if err != nil {
		return delegate.Server{}, fmt.Errorf("renew lease: %w", err)
	}
	return out, nil
}

// ExpireServer ends a lease now.
func (s *ServerStore) ExpireServer(ctx context.Context, id string) error {
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		_, err := tx.Exec(`UPDATE servers SET expires_at = min(expires_at, ?) WHERE id = ?`, time.Now().UnixNano(), id)
		return err
	})
	if err != nil {
		return fmt.Errorf("expire lease of %s: %w", id, err)
	}
	return nil
}

// DrainServer marks a server that stops claiming.
func (s *ServerStore) DrainServer(ctx context.Context, id string) error {
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		_, err := tx.Exec(`UPDATE servers SET draining = 1 WHERE id = ?`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("drain %s: %w", id, err)
	}
	return nil
}

// Servers lists the servers, live first, newest first.
func (s *ServerStore) Servers(ctx context.Context) ([]delegate.Server, time.Time, error) {
	now := time.Now().UTC()
	rows, err := s.db.rdb.QueryContext(ctx, `SELECT `+serverColumns+` FROM servers ORDER BY expires_at > ? DESC, started_at DESC, id`,
		now.UnixNano())
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("servers: %w", err)
	}
	defer rows.Close()
	var out []delegate.Server
	for rows.Next() {
		srv, err := scanServer(rows, now)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("servers: %w", err)
		}
		out = append(out, srv)
	}
	return out, now, rows.Err()
}

// AcquireTerm elects holder for duty name, or renews its term.
func (s *ServerStore) AcquireTerm(ctx context.Context, name, holder string, ttl time.Duration) (delegate.Term, error) {
	var t delegate.Term
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		now := time.Now().UTC()
		var (
			cur     delegate.Term
			expires int64
		)
		err := tx.QueryRow(`SELECT name, holder, term, expires_at FROM terms WHERE name = ?`, name).
			Scan(&cur.Name, &cur.Holder, &cur.Term, &expires)
		cur.ExpiresAt = fromNanos(expires)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		case cur.Holder == holder && cur.ExpiresAt.After(now):
			t = cur // renewed: the same term
		case cur.ExpiresAt.After(now):
			return &delegate.TermHeldError{Term: cur}
		}
		if t.Term == 0 {
			if err := tx.QueryRow(`UPDATE counters SET value = value + 1 WHERE name = 'terms' RETURNING value`).Scan(&t.Term); err != nil {
				return err
			}
			t.Name, t.Holder = name, holder
		}
		t.ExpiresAt = now.Add(ttl)
		_, err = tx.Exec(`INSERT OR REPLACE INTO terms (name, holder, term, expires_at) VALUES (?, ?, ?, ?)`,
			t.Name, t.Holder, t.Term, t.ExpiresAt.UnixNano())
		return err
	})
	if err != nil {
		return delegate.Term{}, fmt.Errorf("term %s: %w", name, err)
	}
	return t, nil
}

// ResignTerm gives a term up, if it is still the duty's.
func (s *ServerStore) ResignTerm(ctx context.Context, t delegate.Term) error {
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		_, err := tx.Exec(`DELETE FROM terms WHERE name = ? AND holder = ? AND term = ?`, t.Name, t.Holder, t.Term)
		return err
	})
	if err != nil {
		return fmt.Errorf("resign %s: %w", t.Name, err)
	}
	return nil
}

// AdoptJobs takes the unfinished jobs of dead owners, a batch at a time,
// in one write transaction (writes are serial: nothing else holds them).
func (s *ServerStore) AdoptJobs(ctx context.Context, owner string, from []string, limit int) ([]delegate.Adopted, error) {
	if len(from) == 0 || limit <= 0 {
		return nil, nil
	}
	var out []delegate.Adopted
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		out = out[:0]
		now := time.Now().UnixNano()
		var live bool
		if err := tx.QueryRow(`SELECT EXISTS (SELECT 1 FROM servers WHERE id = ? AND expires_at > ?)`, owner, now).Scan(&live); err != nil {
			return err
		}
		if !live {
			return fmt.Errorf("server %s: its lease has expired: %w", owner, delegate.ErrLeaseLost)
		}
		for _, prev := range from {
			if prev == owner || len(out) >= limit {
				continue
			}
			var dead bool
			if err := tx.QueryRow(`SELECT NOT EXISTS (SELECT 1 FROM servers WHERE id = ? AND expires_at > ?)`, prev, now).Scan(&dead); err != nil {
				return err
			}
			if !dead {
				continue
			}
			rows, err := tx.Query(`UPDATE jobs SET owner = ?, epoch = epoch + 1, updated_at = ?
				WHERE seq IN (SELECT seq FROM jobs WHERE owner = ? AND status IN `+active+` ORDER BY seq LIMIT ?)
				RETURNING id`, owner, now, prev, limit-len(out))
			if err != nil {
				return err
			}
			taken, err := s.takenJobs(tx, rows, prev)
			if err != nil {
				return err
			}
			out = append(out, taken...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("adopt jobs: %w", err)
	}
	return out, nil
}

// takenJobs reads the ids an UPDATE … RETURNING id of jobs gave, closes
// its rows (the transaction's one connection is then free), and returns
// each job, with its manifest, as taken from server from.
func (s *ServerStore) takenJobs(tx *sql.Tx, rows *sql.Rows, from string) ([]delegate.Adopted, error) {
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []delegate.Adopted
	for _, id := range ids {
		j, seq, err := scanJob(s.db.JobStore.stmt.wGetJob.in(tx).QueryRow(id, ""))
		if err != nil {
			return nil, err
		}
		if err := s.db.JobStore.withManifest(context.Background(), s.db.JobStore.stmt.wManifest.in(tx), j, seq); err != nil {
			return nil, err
		}
		out = append(out, delegate.Adopted{Job: j, From: from})
	}
	return out, nil
}

// RejoinServer gives a server whose lease expired a new one, and takes
// back the jobs it owned that no other server adopted, each at its epoch
// plus one, in one write transaction.
func (s *ServerStore) RejoinServer(ctx context.Context, srv delegate.Server, ttl time.Duration) (delegate.Server, []delegate.Adopted, error) {
	if srv.ID == "" || ttl <= 0 {
		return delegate.Server{}, nil, fmt.Errorf("rejoin: %w: an id and a positive lease", delegate.ErrInvalid)
	}
	var (
		out  delegate.Server
		jobs []delegate.Adopted
	)
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		jobs = nil
		now := time.Now().UTC()
		res, err := tx.Exec(`UPDATE servers SET renewed_at = ?, expires_at = ? WHERE id = ? AND expires_at <= ?`,
			now.UnixNano(), now.Add(ttl).UnixNano(), srv.ID, now.UnixNano())
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			if _, err := tx.Exec(`INSERT INTO servers (`+serverColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0)`,
				srv.ID, srv.Host, srv.HostID, srv.PIDNamespace, srv.Addr, srv.Backend, now.UnixNano(), now.UnixNano(),
				now.Add(ttl).UnixNano()); err != nil {
				if strings.Contains(err.Error(), "UNIQUE") {
					return fmt.Errorf("server %s: its lease is live: %w", srv.ID, delegate.ErrConflict)
				}
				return err
			}
		}
		if out, err = scanServer(tx.QueryRow(`SELECT `+serverColumns+` FROM servers WHERE id = ?`, srv.ID), now); err != nil {
			return err
		}
		rows, err := tx.Query(`UPDATE jobs SET epoch = epoch + 1, updated_at = ? WHERE owner = ? AND status IN `+active+` RETURNING id`,
			now.UnixNano(), srv.ID)
		if err != nil {
			return err
		}
		if jobs, err = s.takenJobs(tx, rows, srv.ID); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return delegate.Server{}, nil, fmt.Errorf("rejoin server %s: %w", srv.ID, err)
	}
	return out, jobs, nil
}

// Now is the host's clock, which every process sharing the file reads.
func (s *ServerStore) Now(ctx context.Context) (time.Time, error) { return time.Now().UTC(), nil }

// checkFence refuses a write under ctx's fence that is no longer job id's.
func checkFence(ctx context.Context, tx *sql.Tx, id string) error {
	f, fenced := delegate.FenceOf(ctx)
	if !fenced {
		return nil
	}
	var (
		owner string
		epoch int64
	)
	err := tx.QueryRow(`SELECT owner, epoch FROM jobs WHERE id = ?`, id).Scan(&owner, &epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return delegate.JobNotFound(id)
	}
	if err != nil {
		return err
	}
	return f.Check(id, owner, epoch)
}
