package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/delegate-dev/delegate"
)

// SandboxStore keeps the kept sandboxes. A sandbox is a row with the
// columns its queries select by (id, state, backend and instance) and the
// rest as JSON: it is read and written whole, rarely (a resume, a file
// call, a timer), never on a command's way. What its commands change (how
// many were submitted, how many have not ended, when the last one ended,
// and so whether it is running or idle) is read from its jobs, through
// an index, as it is read: a command costs the sandbox no write, and the
// counts cannot drift from the jobs they count (a server killed between
// a command's end and a count's update once left one to recount).
type SandboxStore struct {
	db   *DB
	stmt struct {
		get, uncounted, list, live, byInstance *readStmt  // readers
		wGet, wInsert, wUpdate                 *writeStmt // writer
	}
}

var _ delegate.SandboxStore = (*SandboxStore)(nil)

func newSandboxStore(ctx context.Context, db *DB) (*SandboxStore, error) {
	s := &SandboxStore{db: db}
	return s, db.prepare(ctx, []statement{
		{db.rdb, &s.stmt.get, `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE id = ?1` + mine},
		{db.rdb, &s.stmt.uncounted, `SELECT ` + uncountedColumns + ` FROM sandboxes WHERE id = ?1` + mine},
		{db.rdb, &s.stmt.list, `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE ?2 = '' OR principal = ?2 ORDER BY seq DESC LIMIT ?1`},
		{db.rdb, &s.stmt.live, `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE state NOT IN ('released', 'gone')` + mine + ` ORDER BY seq DESC LIMIT ?1`},
		{db.rdb, &s.stmt.byInstance, `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE backend = ? AND instance = ? ORDER BY seq DESC LIMIT 1`},
		{db.wdb, &s.stmt.wGet, `SELECT ` + uncountedColumns + ` FROM sandboxes WHERE id = ?1` + mine},
		{db.wdb, &s.stmt.wInsert, `INSERT INTO sandboxes (id, state, backend, instance, data, principal) VALUES (?, ?, ?, ?, ?, ?)`},
		{db.wdb, &s.stmt.wUpdate, `UPDATE sandboxes SET state = ?, instance = ?, data = ? WHERE id = ?`},
	})
}

// sandboxColumns are a sandbox's row and its activity, from its jobs
// through the index jobs_kept (each subquery repeats the index's
// condition, a sandbox named, so that SQLite uses it): commands
// submitted, commands not ended, the last end (ns, 0 for none).
const sandboxColumns = `data, principal,
	(SELECT count(*) FROM jobs WHERE sandbox = sandboxes.id AND sandbox != ''),` + activityColumns

// uncountedColumns are sandboxColumns without the count of commands
// submitted, the one that reads an index entry for each (the others read
// the ones not ended, and the last).
const uncountedColumns = `data, principal, 0,` + activityColumns

const activityColumns = `
	(SELECT count(*) FROM jobs WHERE sandbox = sandboxes.id AND sandbox != '' AND finished_at = 0),
	(SELECT coalesce(max(finished_at), 0) FROM jobs WHERE sandbox = sandboxes.id AND sandbox != '')`

// sandboxRow is a sandbox as it is stored: every field, the ones the API
// leaves out included, but for its activity (sandboxColumns).
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
	// Rows written before the activity was read from the jobs have
	// "commands" and "running" too: ignored.
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

// activity is what a sandbox's jobs say of it (sandboxColumns).
type activity struct {
	commands, running int
	lastEnd           time.Time
}

// apply gives sb its activity. A live sandbox, unless paused, is running
// while a command of it has not ended, idle otherwise; it was last used
// when it was last used itself (opened, resumed, a file call) or when its
// last command ended, whichever is later.
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
func scanSandbox(row scanner) (*delegate.Sandbox, activity, error) {
	var data []byte
	var principal string
	var commands, running, lastEnd int64
	if err := row.Scan(&data, &principal, &commands, &running, &lastEnd); err != nil {
		return nil, activity{}, err
	}
	var r sandboxRow
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, activity{}, fmt.Errorf("decode a sandbox: %w", err)
	}
	sb := r.sandbox()
	sb.Principal = principal
	a := activity{int(commands), int(running), fromNanos(lastEnd)}
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
	var refused error // admit's, returned as it is
	err = s.db.w.do(ctx, func(tx *sql.Tx) error {
		var rerr error
		if refused, rerr = admitIn(ctx, tx, sb.Principal, admit); refused != nil || rerr != nil {
			return cmp.Or(refused, rerr)
		}
		_, err := s.stmt.wInsert.in(tx).Exec(sb.ID, string(row.State), sb.Backend, sb.Instance, data, sb.Principal)
		return err
	})
	if refused != nil {
		return refused
	}
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox reads one.
func (s *SandboxStore) GetSandbox(ctx context.Context, id string) (*delegate.Sandbox, error) {
	return s.getBy(ctx, s.stmt.get, id)
}

// GetSandboxUncounted reads one without counting its commands.
func (s *SandboxStore) GetSandboxUncounted(ctx context.Context, id string) (*delegate.Sandbox, error) {
	return s.getBy(ctx, s.stmt.uncounted, id)
}

// getBy reads sandbox id with st, a statement of one of the column sets.
func (s *SandboxStore) getBy(ctx context.Context, st *readStmt, id string) (*delegate.Sandbox, error) {
	sb, _, err := scanSandbox(st.QueryRowContext(ctx, id, delegate.ReaderOf(ctx)))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, delegate.SandboxNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return sb, nil
}

// UpdateSandbox changes one in a transaction. A released or gone sandbox
// is final: fn is not called, and ErrTerminal is returned with it. The
// sandbox is read uncounted (a file call updates it too).
func (s *SandboxStore) UpdateSandbox(ctx context.Context, id string, fn func(*delegate.Sandbox) error) (*delegate.Sandbox, error) {
	return s.update(ctx, id, fn, nil)
}

// update is UpdateSandbox; a non-nil admit decides first, in the
// transaction (QuotaStore.UpdateSandboxAdmitted).
func (s *SandboxStore) update(ctx context.Context, id string, fn func(*delegate.Sandbox) error, admit delegate.Admit) (*delegate.Sandbox, error) {
	var out *delegate.Sandbox
	var refused error // admit's, returned as it is
	reader := delegate.ReaderOf(ctx)
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		sb, act, err := scanSandbox(s.stmt.wGet.in(tx).QueryRow(id, reader))
		if errors.Is(err, sql.ErrNoRows) {
			return delegate.SandboxNotFound(id)
		}
		if err != nil {
			return fmt.Errorf("update sandbox %s: %w", id, err)
		}
		if sb.State.Terminal() {
			out = sb
			return fmt.Errorf("sandbox %s is %s: %w", id, sb.State, delegate.ErrTerminal)
		}
		var rerr error
		if refused, rerr = admitIn(ctx, tx, sb.Principal, admit); refused != nil || rerr != nil {
			return cmp.Or(refused, rerr)
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
		if _, err := s.stmt.wUpdate.in(tx).Exec(string(row.State), sb.Instance, data, id); err != nil {
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
	st := s.stmt.list
	if live {
		st = s.stmt.live
	}
	rows, err := st.QueryContext(ctx, limit, delegate.ReaderOf(ctx))
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
	sb, _, err := scanSandbox(s.stmt.byInstance.QueryRowContext(ctx, backend, instance))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, &delegate.NotFoundError{Resource: "sandbox", ID: instance, Reason: "no sandbox is that " + backend + " instance"}
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox of instance %s: %w", instance, err)
	}
	return sb, nil
}
