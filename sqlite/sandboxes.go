package sqlite

import (
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
// rest as JSON: it is read and written whole, rarely (a command's start
// and end, a timer), never on a hot path.
type SandboxStore struct {
	db   *DB
	stmt struct {
		get, list, live, byInstance *sql.Stmt // readers
		wGet, wInsert, wUpdate      *sql.Stmt // writer
	}
}

var _ delegate.SandboxStore = (*SandboxStore)(nil)

func newSandboxStore(ctx context.Context, db *DB) (*SandboxStore, error) {
	s := &SandboxStore{db: db}
	return s, prepare(ctx, []statement{
		{db.rdb, &s.stmt.get, `SELECT data FROM sandboxes WHERE id = ?`},
		{db.rdb, &s.stmt.list, `SELECT data FROM sandboxes ORDER BY seq DESC LIMIT ?`},
		{db.rdb, &s.stmt.live, `SELECT data FROM sandboxes WHERE state NOT IN ('released', 'gone') ORDER BY seq DESC LIMIT ?`},
		{db.rdb, &s.stmt.byInstance, `SELECT data FROM sandboxes WHERE backend = ? AND instance = ? ORDER BY seq DESC LIMIT 1`},
		{db.wdb, &s.stmt.wGet, `SELECT data FROM sandboxes WHERE id = ?`},
		{db.wdb, &s.stmt.wInsert, `INSERT INTO sandboxes (id, state, backend, instance, data) VALUES (?, ?, ?, ?, ?)`},
		{db.wdb, &s.stmt.wUpdate, `UPDATE sandboxes SET state = ?, instance = ?, data = ? WHERE id = ?`},
	})
}

// sandboxRow is a sandbox as it is stored: every field, the ones the API
// leaves out included.
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
	Commands     int                   `json:"commands"`
	Running      int                   `json:"running"`
	Reason       string                `json:"reason,omitempty"`
}

func toRow(sb *delegate.Sandbox) sandboxRow {
	return sandboxRow{sb.ID, sb.State, sb.Backend, sb.Instance, sb.JobID, sb.Owner, sb.Resources, sb.Template, sb.Network,
		sb.CreatedAt, sb.LastUsedAt, sb.PausedAt, sb.ExpiresAt, sb.EndedAt, sb.IdleTimeout, sb.PauseTimeout,
		sb.Commands, sb.Running, sb.Reason}
}

func (r sandboxRow) sandbox() *delegate.Sandbox {
	return &delegate.Sandbox{ID: r.ID, State: r.State, Backend: r.Backend, Instance: r.Instance, JobID: r.JobID, Owner: r.Owner,
		Resources: r.Resources, Template: r.Template, Network: r.Network, CreatedAt: r.CreatedAt, LastUsedAt: r.LastUsedAt,
		PausedAt: r.PausedAt, ExpiresAt: r.ExpiresAt, EndedAt: r.EndedAt, IdleTimeout: r.IdleTimeout, PauseTimeout: r.PauseTimeout,
		Commands: r.Commands, Running: r.Running, Reason: r.Reason}
}

func decodeSandbox(data []byte) (*delegate.Sandbox, error) {
	var r sandboxRow
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("decode a sandbox: %w", err)
	}
	return r.sandbox(), nil
}

// CreateSandbox stores a new sandbox.
func (s *SandboxStore) CreateSandbox(ctx context.Context, sb *delegate.Sandbox) error {
	data, err := json.Marshal(toRow(sb))
	if err != nil {
		return err
	}
	err = s.db.w.do(ctx, func(tx *sql.Tx) error {
		_, err := tx.Stmt(s.stmt.wInsert).Exec(sb.ID, string(sb.State), sb.Backend, sb.Instance, data)
		return err
	})
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox reads one.
func (s *SandboxStore) GetSandbox(ctx context.Context, id string) (*delegate.Sandbox, error) {
	var data []byte
	err := s.stmt.get.QueryRowContext(ctx, id).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, delegate.SandboxNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return decodeSandbox(data)
}

// UpdateSandbox changes one in a transaction. A released or gone sandbox
// is final: fn is not called, and ErrTerminal is returned with it.
func (s *SandboxStore) UpdateSandbox(ctx context.Context, id string, fn func(*delegate.Sandbox) error) (*delegate.Sandbox, error) {
	var out *delegate.Sandbox
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		var data []byte
		err := tx.Stmt(s.stmt.wGet).QueryRow(id).Scan(&data)
		if errors.Is(err, sql.ErrNoRows) {
			return delegate.SandboxNotFound(id)
		}
		if err != nil {
			return fmt.Errorf("update sandbox %s: %w", id, err)
		}
		sb, err := decodeSandbox(data)
		if err != nil {
			return err
		}
		if sb.State.Terminal() {
			out = sb
			return fmt.Errorf("sandbox %s is %s: %w", id, sb.State, delegate.ErrTerminal)
		}
		if err := fn(sb); err != nil {
			return err
		}
		sb.ID = id
		if data, err = json.Marshal(toRow(sb)); err != nil {
			return err
		}
		if _, err := tx.Stmt(s.stmt.wUpdate).Exec(string(sb.State), sb.Instance, data, id); err != nil {
			return fmt.Errorf("update sandbox %s: %w", id, err)
		}
		out = sb
		return nil
	})
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
	rows, err := st.QueryContext(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	out := []delegate.Sandbox{}
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		sb, err := decodeSandbox(data)
		if err != nil {
			return nil, err
		}
		out = append(out, *sb)
	}
	return out, rows.Err()
}

// SandboxOfInstance finds the sandbox a backend instance is.
func (s *SandboxStore) SandboxOfInstance(ctx context.Context, backend, instance string) (*delegate.Sandbox, error) {
	var data []byte
	err := s.stmt.byInstance.QueryRowContext(ctx, backend, instance).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, &delegate.NotFoundError{Resource: "sandbox", ID: instance, Reason: "no sandbox is that " + backend + " instance"}
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox of instance %s: %w", instance, err)
	}
	return decodeSandbox(data)
}
