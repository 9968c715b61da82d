package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// SandboxStore keeps the kept sandboxes, as the SQLite store does: a row
// each with the columns its queries select by (id, state, backend and
// instance) and the rest as JSON; what its commands change (how many were
// submitted, how many have not ended, when the last one ended) is read
// from its jobs through the index jobs_kept, so that a command costs the
// sandbox no write and the counts cannot drift from the jobs they count.
type SandboxStore struct{ db *DB }

var _ delegate.SandboxStore = (*SandboxStore)(nil)

// sandboxColumns are a sandbox's row and its activity from its jobs
// (each subquery repeats the index's condition, a sandbox named):
// commands submitted, commands not ended, the last end.
const sandboxColumns = `s.data, s.principal,
	(SELECT count(*) FROM jobs WHERE sandbox = s.id AND sandbox <> ''),` + activityColumns

// uncountedColumns are sandboxColumns without the count of commands
// submitted, the one that reads an index entry for each.
const uncountedColumns = `s.data, s.principal, 0::bigint,` + activityColumns

const activityColumns = `
	(SELECT count(*) FROM jobs WHERE sandbox = s.id AND sandbox <> '' AND finished_at IS NULL),
	(SELECT max(finished_at) FROM jobs WHERE sandbox = s.id AND sandbox <> '')`

// sandboxRow is a sandbox as it is stored in data: every field, the ones
// the API leaves out included, but for its activity. The same JSON as the
// SQLite store's, so that `delegate store migrate` copies it as it is.
type sandboxRow struct {
	ID           string                `json:"id"`
	State        delegate.SandboxState `json:"state"`
	Backend      string                `json:"backend"`
	Instance     string                `json:"instance"`
	JobID        string                `json:"jobId,omitempty"`
	Owner        string                `json:"owner,omitempty"`
	Resources    delegate.Resources    `json:"resources"`
	Template     string                `json:"template,omitempty"`
	Network      delegate.Network      `json:"network,omitempty"`
	CreatedAt    time.Time             `json:"createdAt"`
	LastUsedAt   time.Time             `json:"lastUsedAt"`
	PausedAt     time.Time             `json:"pausedAt,omitzero"`
	ExpiresAt    time.Time             `json:"expiresAt"`
	EndedAt      time.Time             `json:"endedAt,omitzero"`
	IdleTimeout  time.Duration         `json:"idleTimeout"`
	PauseTimeout time.Duration         `json:"pauseTimeout"`
	Reason       string                `json:"reason,omitempty"`
	// Checkpoints and forks (issue 38).
	From          string                      `json:"from,omitempty"`
	Checkpoints   []delegate.StoredCheckpoint `json:"checkpoints,omitempty"`
	CheckpointSeq int                         `json:"checkpointSeq,omitempty"`
}

// toRow is what is stored of sb: running is not a state stored (its
// jobs say whether one runs), idle stands for both.
func toRow(sb *delegate.Sandbox) sandboxRow {
	state := sb.State
	if state == delegate.SandboxRunning {
		state = delegate.SandboxIdle
	}
	return sandboxRow{sb.ID, state, sb.Backend, sb.Instance, sb.JobID, sb.Owner, sb.Resources, sb.Template, sb.Network,
		sb.CreatedAt, sb.LastUsedAt, sb.PausedAt, sb.ExpiresAt, sb.EndedAt, sb.IdleTimeout, sb.PauseTimeout,
		sb.Reason, sb.From, delegate.StoreCheckpoints(sb.Checkpoints), sb.CheckpointSeq}
}

func (r sandboxRow) sandbox() *delegate.Sandbox {
	return &delegate.Sandbox{ID: r.ID, State: r.State, Backend: r.Backend, Instance: r.Instance, JobID: r.JobID, Owner: r.Owner,
		Resources: r.Resources, Template: r.Template, Network: r.Network, CreatedAt: r.CreatedAt, LastUsedAt: r.LastUsedAt,
		PausedAt: r.PausedAt, ExpiresAt: r.ExpiresAt, EndedAt: r.EndedAt, IdleTimeout: r.IdleTimeout, PauseTimeout: r.PauseTimeout,
		Reason: r.Reason, From: r.From, Checkpoints: delegate.LoadCheckpoints(r.Checkpoints, r.ID), CheckpointSeq: r.CheckpointSeq}
}

// mine keeps a read of sandboxes s to the reader's in $2 (” for all,
// see delegate.ReaderOf), in the query that reads.
const mine = ` AND ($2 = '' OR s.principal = $2)`

// activity is what a sandbox's jobs say of it (sandboxColumns).
type activity struct {
	commands, running int
	lastEnd           time.Time
}

// apply gives sb its activity. A live sandbox, unless paused, is running
// while a command of it has not ended, idle otherwise; it was last used
// when it was last used itself or when its last command ended, whichever
// is later.
func (a activity) apply(sb *delegate.Sandbox) {
	sb.Commands, sb.Running = a.commands, a.running
	if a.lastEnd.After(sb.LastUsedAt) {
		sb.LastUsedAt = a.lastEnd
	}
	if sb.State == delegate.SandboxIdle || sb.State == delegate.SandboxRunning {
		sb.State = delegate.SandboxIdle
		if a.running > 0 {
			sb.State = delegate.SandboxRunning
		}
	}
}

// scanSandbox reads a row of sandboxColumns: the sandbox with its
// activity.
func scanSandbox(row pgx.Row) (*delegate.Sandbox, activity, error) {
	var (
		data, principal   string
		commands, running int64
		lastEnd           ts
	)
	if err := row.Scan(&data, &principal, &commands, &running, &lastEnd); err != nil {
		return nil, activity{}, err
	}
	var r sandboxRow
	if err := json.Unmarshal([]byte(data), &r); err != nil {
		return nil, activity{}, fmt.Errorf("decode a sandbox: %w", err)
	}
	sb := r.sandbox()
	sb.Principal = principal
	a := activity{int(commands), int(running), lastEnd.time()}
	a.apply(sb)
	return sb, a, nil
}

// CreateSandbox stores a new sandbox.
func (s *SandboxStore) CreateSandbox(ctx context.Context, sb *delegate.Sandbox) error {
	return s.create(ctx, sb, nil)
}

// create stores sb; a non-nil admit decides first, in the transaction
// (QuotaStore.CreateSandboxAdmitted).
func (s *SandboxStore) create(ctx context.Context, sb *delegate.Sandbox, admit delegate.Admit) error {
	if sb.Principal == "" {
		sb.Principal = delegate.OwnerOf(ctx)
	}
	row := toRow(sb)
	data, err := json.Marshal(row)
	if err != nil {
		return err
	}
	refused, err := s.db.admitted(ctx, sb.Principal, admit, statement{
		sql:  `INSERT INTO sandboxes (id, state, backend, instance, data, principal) VALUES ($1, $2, $3, $4, $5, $6)`,
		args: []any{sb.ID, string(row.State), sb.Backend, sb.Instance, string(data), sb.Principal}})
	if refused != nil {
		return refused
	}
	if isUnique(err) {
		err = fmt.Errorf("the id is taken: %w", delegate.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox reads one.
func (s *SandboxStore) GetSandbox(ctx context.Context, id string) (*delegate.Sandbox, error) {
	return s.getBy(ctx, sandboxColumns, id)
}

// GetSandboxUncounted reads one without counting its commands.
func (s *SandboxStore) GetSandboxUncounted(ctx context.Context, id string) (*delegate.Sandbox, error) {
	return s.getBy(ctx, uncountedColumns, id)
}

func (s *SandboxStore) getBy(ctx context.Context, columns, id string) (*delegate.Sandbox, error) {
	sb, _, err := scanSandbox(s.db.pool.QueryRow(ctx, `SELECT `+columns+` FROM sandboxes s WHERE s.id = $1`+mine, id, delegate.ReaderOf(ctx)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, delegate.SandboxNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return sb, nil
}

// UpdateSandbox changes one in a transaction that holds its row. A
// released or gone sandbox is final: fn is not called, and ErrTerminal
// is returned with it. The sandbox is read uncounted.
func (s *SandboxStore) UpdateSandbox(ctx context.Context, id string, fn func(*delegate.Sandbox) error) (*delegate.Sandbox, error) {
	return s.update(ctx, id, fn, nil)
}

// update is UpdateSandbox; a non-nil admit decides first, in the
// transaction, under the principal's quota lock
// (QuotaStore.UpdateSandboxAdmitted).
func (s *SandboxStore) update(ctx context.Context, id string, fn func(*delegate.Sandbox) error, admit delegate.Admit) (*delegate.Sandbox, error) {
	var out *delegate.Sandbox
	var refused error // admit's, returned as it is
	reader := delegate.ReaderOf(ctx)
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if admit != nil {
			// The principal (never changed) first, for its lock: every
			// admitted write takes it before any row's.
			var principal string
			if err := tx.QueryRow(ctx, `SELECT s.principal FROM sandboxes s WHERE s.id = $1`+mine, id, reader).Scan(&principal); errors.Is(err, pgx.ErrNoRows) {
				return delegate.SandboxNotFound(id)
			} else if err != nil {
				return fmt.Errorf("update sandbox %s: %w", id, err)
			}
			if err := quotaLock(ctx, tx, principal); err != nil {
				return err
			}
		}
		// Locked by a statement of its own: the activity read next is
		// then what the last writer of the sandbox left.
		var one int
		if err := tx.QueryRow(ctx, `SELECT 1 FROM sandboxes s WHERE s.id = $1`+mine+` FOR NO KEY UPDATE`, id, reader).Scan(&one); errors.Is(err, pgx.ErrNoRows) {
			return delegate.SandboxNotFound(id)
		} else if err != nil {
			return fmt.Errorf("update sandbox %s: %w", id, err)
		}
		sb, act, err := scanSandbox(tx.QueryRow(ctx, `SELECT `+uncountedColumns+` FROM sandboxes s WHERE s.id = $1`, id))
		if err != nil {
			return fmt.Errorf("update sandbox %s: %w", id, err)
		}
		if sb.State.Terminal() {
			out = sb
			return fmt.Errorf("sandbox %s is %s: %w", id, sb.State, delegate.ErrTerminal)
		}
		if admit != nil {
			h, err := holdings(ctx, tx, sb.Principal)
			if err != nil {
				return fmt.Errorf("what %s holds: %w", sb.Principal, err)
			}
			if refused = admit(h); refused != nil {
				return refused
			}
		}
		if err := fn(sb); err != nil {
			return err
		}
		sb.ID = id
		row := toRow(sb)
		data, err := json.Marshal(row)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE sandboxes SET state = $1, instance = $2, data = $3 WHERE id = $4`,
			string(row.State), sb.Instance, string(data), id); err != nil {
			return fmt.Errorf("update sandbox %s: %w", id, err)
		}
		out = row.sandbox()          // as stored, and as its jobs have it
		out.Principal = sb.Principal // not changed by fn: it is not written
		act.apply(out)
		return nil
	})
	if refused != nil {
		return nil, refused
	}
	return out, err
}

// ListSandboxes lists newest first; live selects those not terminal.
func (s *SandboxStore) ListSandboxes(ctx context.Context, live bool, limit int) ([]delegate.Sandbox, error) {
	if limit <= 0 {
		limit = delegate.DefaultPageSize
	}
	q := `SELECT ` + sandboxColumns + ` FROM sandboxes s WHERE ($2 = '' OR s.principal = $2)`
	if live {
		q += ` AND s.state NOT IN ('released', 'gone')`
	}
	rows, err := s.db.pool.Query(ctx, q+` ORDER BY s.seq DESC LIMIT $1`, limit, delegate.ReaderOf(ctx))
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	out := []delegate.Sandbox{}
	for rows.Next() {
		sb, _, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		out = append(out, *sb)
	}
	return out, rows.Err()
}

// SandboxOfInstance finds the sandbox a backend instance is.
func (s *SandboxStore) SandboxOfInstance(ctx context.Context, backend, instance string) (*delegate.Sandbox, error) {
	sb, _, err := scanSandbox(s.db.pool.QueryRow(ctx, `SELECT `+sandboxColumns+` FROM sandboxes s
		WHERE s.backend = $1 AND s.instance = $2 ORDER BY s.seq DESC LIMIT 1`, backend, instance))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &delegate.NotFoundError{Resource: "sandbox", ID: instance, Reason: "no sandbox is that " + backend + " instance"}
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox of instance %s: %w", instance, err)
	}
	return sb, nil
}
