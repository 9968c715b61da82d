package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// ServerStore keeps the servers that share the database, their leases
// and terms, every time on the database's clock (now()): the servers'
// hosts may disagree on the time, the database is one. It implements
// delegate.ServerStore on a DB.
type ServerStore struct{ db *DB }

var _ delegate.ServerStore = (*ServerStore)(nil)

// forgetAfter: a server whose lease ended this long ago is forgotten
// (delegate servers shows the recently dead, not every incarnation).
const forgetAfter = "1 hour"

const serverColumns = `id, host, host_id, pid_namespace, addr, backend, started_at, renewed_at, expires_at, draining, expires_at > now()`

func scanServer(row pgx.Row) (delegate.Server, error) {
	var s delegate.Server
	err := row.Scan(&s.ID, &s.Host, &s.HostID, &s.PIDNamespace, &s.Addr, &s.Backend, &s.StartedAt, &s.RenewedAt,
		&s.ExpiresAt, &s.Draining, &s.Live)
	s.StartedAt, s.RenewedAt, s.ExpiresAt = s.StartedAt.UTC(), s.RenewedAt.UTC(), s.ExpiresAt.UTC()
	return s, err
}

// interval is d as a PostgreSQL interval's text.
func interval(d time.Duration) string { return fmt.Sprintf("%d microseconds", d.Microseconds()) }

// RegisterServer records a server whose lease runs ttl from now.
func (s *ServerStore) RegisterServer(ctx context.Context, srv delegate.Server, ttl time.Duration) (delegate.Server, error) {
	if srv.ID == "" || ttl <= 0 {
		return delegate.Server{}, fmt.Errorf("register server: %w: an id and a positive lease", delegate.ErrInvalid)
	}
	var out delegate.Server
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM servers WHERE expires_at < now() - $1::interval`, forgetAfter); err != nil {
			return err
		}
		var err error
		out, err = scanServer(tx.QueryRow(ctx, `INSERT INTO servers (id, host, host_id, pid_namespace, addr, backend, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, now() + $7::interval) RETURNING `+serverColumns,
			srv.ID, clean(srv.Host), clean(srv.HostID), clean(srv.PIDNamespace), clean(srv.Addr), clean(srv.Backend), interval(ttl)))
		if isUnique(err) {
			return fmt.Errorf("server %s is registered already: %w", srv.ID, delegate.ErrConflict)
		}
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
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		out, err = scanServer(tx.QueryRow(ctx, `UPDATE servers SET renewed_at = now(), expires_at = now() + $2::interval
			WHERE id = $1 AND expires_at > now() RETURNING `+serverColumns, id, interval(ttl)))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("server %s: its lease has expired: %w", id, delegate.ErrLeaseLost)
		}
		return err
	})
	if err != nil {
		return delegate.Server{}, fmt.Errorf("renew lease: %w", err)
	}
	return out, nil
}

// ExpireServer ends a lease now.
func (s *ServerStore) ExpireServer(ctx context.Context, id string) error {
	if _, err := s.db.exec(ctx, `UPDATE servers SET expires_at = least(expires_at, now()) WHERE id = $1`, id); err != nil {
		return fmt.Errorf("expire lease of %s: %w", id, err)
	}
	return nil
}

// DrainServer marks a server that stops claiming.
func (s *ServerStore) DrainServer(ctx context.Context, id string) error {
	if _, err := s.db.exec(ctx, `UPDATE servers SET draining = true WHERE id = $1`, id); err != nil {
		return fmt.Errorf("drain %s: %w", id, err)
	}
	return nil
}

// Servers lists the servers, live first, newest first.
func (s *ServerStore) Servers(ctx context.Context) ([]delegate.Server, time.Time, error) {
	var now time.Time
	if err := s.db.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, time.Time{}, fmt.Errorf("servers: %w", err)
	}
	rows, err := s.db.pool.Query(ctx, `SELECT `+serverColumns+` FROM servers ORDER BY expires_at > now() DESC, started_at DESC, id`)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("servers: %w", err)
	}
	defer rows.Close()
	var out []delegate.Server
	for rows.Next() {
		srv, err := scanServer(rows)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("servers: %w", err)
		}
		out = append(out, srv)
	}
	return out, now.UTC(), rows.Err()
}

// AcquireTerm elects holder for duty name, or renews its term.
func (s *ServerStore) AcquireTerm(ctx context.Context, name, holder string, ttl time.Duration) (delegate.Term, error) {
	var t delegate.Term
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		// The duty's row, locked: its holder's renewal and the others'
		// elections take turns.
		row := tx.QueryRow(ctx, `INSERT INTO terms (name, holder, term, expires_at)
			VALUES ($1, $2, nextval('term_numbers'), now() + $3::interval)
			ON CONFLICT (name) DO UPDATE SET
				holder = excluded.holder,
				term = CASE WHEN terms.holder = excluded.holder AND terms.expires_at > now() THEN terms.term ELSE excluded.term END,
				expires_at = excluded.expires_at
			WHERE terms.holder = excluded.holder OR terms.expires_at <= now()
			RETURNING name, holder, term, expires_at`, name, holder, interval(ttl))
		err := row.Scan(&t.Name, &t.Holder, &t.Term, &t.ExpiresAt)
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		var held delegate.Term
		if err := tx.QueryRow(ctx, `SELECT name, holder, term, expires_at FROM terms WHERE name = $1`, name).
			Scan(&held.Name, &held.Holder, &held.Term, &held.ExpiresAt); err != nil {
			return err
		}
		held.ExpiresAt = held.ExpiresAt.UTC()
		return &delegate.TermHeldError{Term: held}
	})
	if err != nil {
		return delegate.Term{}, fmt.Errorf("term %s: %w", name, err)
	}
	t.ExpiresAt = t.ExpiresAt.UTC()
	return t, nil
}

// ResignTerm gives a term up, if it is still the duty's.
func (s *ServerStore) ResignTerm(ctx context.Context, t delegate.Term) error {
	if _, err := s.db.exec(ctx, `DELETE FROM terms WHERE name = $1 AND holder = $2 AND term = $3`, t.Name, t.Holder, t.Term); err != nil {
		return fmt.Errorf("resign %s: %w", t.Name, err)
	}
	return nil
}

// AdoptJobs takes the unfinished jobs of dead owners, a batch at a time:
// rows another server is adopting (or writing) are skipped, not waited
// for, and the adopter's own lease is checked in the same statement.
func (s *ServerStore) AdoptJobs(ctx context.Context, owner string, from []string, limit int) ([]delegate.Adopted, error) {
	if len(from) == 0 || limit <= 0 {
		return nil, nil
	}
	var out []delegate.Adopted
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var live bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM servers WHERE id = $1 AND expires_at > now() FOR KEY SHARE)`,
			owner).Scan(&live); err != nil {
			return err
		}
		if !live {
			return fmt.Errorf("server %s: its lease has expired: %w", owner, delegate.ErrLeaseLost)
		}
		rows, err := tx.Query(ctx, `WITH c AS (
				SELECT seq, owner FROM jobs
				WHERE status IN `+active+` AND owner = ANY($2) AND owner <> $1
					AND NOT EXISTS (SELECT 1 FROM servers s WHERE s.id = jobs.owner AND s.expires_at > now())
				ORDER BY seq LIMIT $3 FOR NO KEY UPDATE SKIP LOCKED)
			UPDATE jobs j SET owner = $1, epoch = j.epoch + 1, updated_at = now()
			FROM c WHERE j.seq = c.seq
			RETURNING j.id, c.owner`, owner, from, limit)
		if err != nil {
			return err
		}
		var ids []string
		from := map[string]string{}
		for rows.Next() {
			var id, prev string
			if err := rows.Scan(&id, &prev); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
			from[id] = prev
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range ids {
			j, _, err := s.db.JobStore.getJob(ctx, tx, "id", id, id, false)
			if err != nil {
				return err
			}
			out = append(out, delegate.Adopted{Job: j, From: from[id]})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("adopt jobs: %w", err)
	}
	return out, nil
}

// RejoinServer gives a server whose lease expired a new one, and takes
// back the jobs it owned that no other server adopted, each at its epoch
// plus one (see delegate.ServerStore). A concurrent adoption holds the
// rows it takes: this statement waits for it, then skips the jobs whose
// owner it changed.
func (s *ServerStore) RejoinServer(ctx context.Context, srv delegate.Server, ttl time.Duration) (delegate.Server, []delegate.Adopted, error) {
	if srv.ID == "" || ttl <= 0 {
		return delegate.Server{}, nil, fmt.Errorf("rejoin: %w: an id and a positive lease", delegate.ErrInvalid)
	}
	var (
		out  delegate.Server
		jobs []delegate.Adopted
	)
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		jobs = nil
		var err error
		out, err = scanServer(tx.QueryRow(ctx, `INSERT INTO servers (id, host, host_id, pid_namespace, addr, backend, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, now() + $7::interval)
			ON CONFLICT (id) DO UPDATE SET renewed_at = now(), expires_at = excluded.expires_at WHERE servers.expires_at <= now()
			RETURNING `+serverColumns,
			srv.ID, clean(srv.Host), clean(srv.HostID), clean(srv.PIDNamespace), clean(srv.Addr), clean(srv.Backend), interval(ttl)))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("server %s: its lease is live: %w", srv.ID, delegate.ErrConflict)
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `UPDATE jobs SET epoch = epoch + 1, updated_at = now()
			WHERE owner = $1 AND status IN `+active+` RETURNING id`, srv.ID)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, id := range ids {
			j, _, err := s.db.JobStore.getJob(ctx, tx, "id", id, id, false)
			if err != nil {
				return err
			}
			jobs = append(jobs, delegate.Adopted{Job: j, From: srv.ID})
		}
		return nil
	})
	if err != nil {
		return delegate.Server{}, nil, fmt.Errorf("rejoin server %s: %w", srv.ID, err)
	}
	return out, jobs, nil
}

// Now is the database's clock.
func (s *ServerStore) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := s.db.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("the database's clock: %w", err)
	}
	return now.UTC(), nil
}

// refusal is why a fenced write on job id matched no row: the job is gone,
// or it is held at another epoch (or by another owner) than f.
func (db *DB) refusal(ctx context.Context, q querier, id string, f delegate.Fence) error {
	var (
		owner string
		epoch int64
	)
	err := q.QueryRow(ctx, `SELECT owner, epoch FROM jobs WHERE id = $1`, id).Scan(&owner, &epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return delegate.JobNotFound(id)
	}
	if err != nil {
		return err
	}
	if err := f.Check(id, owner, epoch); err != nil {
		return err
	}
	return fmt.Errorf("job %s: the write matched no row", id)
}

// ClusterValue is the cluster's value name, set to fresh() by the first
// server that asks (every server sharing the database gets the same: the
// Proxmox instance id their VMs are named with, so that any of them
// re-attaches the VMs of another).
func (db *DB) ClusterValue(ctx context.Context, name string, fresh func() string) (string, error) {
	var v string
	err := db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO cluster (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`,
			name, fresh()); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT value FROM cluster WHERE name = $1`, name).Scan(&v)
	})
	if err != nil {
		return "", fmt.Errorf("the cluster's %s: %w", name, err)
	}
	return v, nil
}
