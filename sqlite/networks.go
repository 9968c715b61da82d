package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
)

// NetworkStore keeps the networks the egress proxy serves and their logs:
// a network is a row (its id, its token's hash and its CA as columns, the
// rest as JSON); its log is rows of its own, each entry as JSON, written
// in batches (the engine gathers a network's entries for a moment).
type NetworkStore struct {
	db   *DB
	stmt struct {
		get, byToken, live, log, logDenied *readStmt  // readers
		wGet, wInsert, wUpdate, wAppend    *writeStmt // writer
	}
}

var _ delegate.NetworkStore = (*NetworkStore)(nil)

func newNetworkStore(ctx context.Context, db *DB) (*NetworkStore, error) {
	s := &NetworkStore{db: db}
	return s, db.prepare(ctx, []statement{
		{db.rdb, &s.stmt.get, `SELECT seq, token_hash, token, ca, data FROM networks WHERE id = ?`},
		{db.rdb, &s.stmt.byToken, `SELECT seq, token_hash, token, ca, data FROM networks WHERE token_hash = ?`},
		{db.rdb, &s.stmt.live, `SELECT seq, token_hash, token, ca, data FROM networks WHERE ended = 0 ORDER BY seq`},
		{db.rdb, &s.stmt.log, `SELECT l.data FROM network_log l JOIN networks n ON n.seq = l.network_seq
			WHERE n.id = ? AND l.seq > ? ORDER BY l.seq LIMIT ?`},
		{db.rdb, &s.stmt.logDenied, `SELECT l.data FROM network_log l JOIN networks n ON n.seq = l.network_seq
			WHERE n.id = ? AND l.seq > ? AND l.allowed = 0 AND l.attempt = 1 ORDER BY l.seq LIMIT ?`},
		{db.wdb, &s.stmt.wGet, `SELECT seq, token_hash, token, ca, data FROM networks WHERE id = ?`},
		{db.wdb, &s.stmt.wInsert, `INSERT INTO networks (id, token_hash, token, ended, ca, data) VALUES (?, ?, ?, ?, ?, ?)`},
		{db.wdb, &s.stmt.wUpdate, `UPDATE networks SET ended = ?, token = ?, ca = ?, data = ? WHERE seq = ?`},
		{db.wdb, &s.stmt.wAppend, `INSERT INTO network_log (network_seq, seq, allowed, attempt, data) VALUES (?, ?, ?, ?, ?)`},
	})
}

// networkRow is a network as stored in data: what the columns do not hold,
// and how many entries of its log are kept.
type networkRow struct {
	ID        string                  `json:"id"`
	Policy    delegate.Network        `json:"policy"`
	Inject    []string                `json:"inject,omitempty"`
	CreatedAt time.Time               `json:"createdAt"`
	EndedAt   time.Time               `json:"endedAt,omitzero"`
	Summary   delegate.NetworkSummary `json:"summary"`
	Logged    int64                   `json:"logged"`
}

type storedNetwork struct {
	seq    int64
	logged int64
	n      *delegate.NetworkState
}

func scanNetwork(id string, sc interface{ Scan(...any) error }) (*storedNetwork, error) {
	var (
		seq  int64
		hash string
		tok  string
		ca   []byte
		data []byte
		row  networkRow
	)
	if err := sc.Scan(&seq, &hash, &tok, &ca, &data); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &row); err != nil {
		return nil, fmt.Errorf("decode network %s: %w", id, err)
	}
	return &storedNetwork{seq: seq, logged: row.Logged, n: &delegate.NetworkState{ID: row.ID, Policy: row.Policy, Inject: row.Inject,
		TokenHash: hash, Token: tok, CA: ca, CreatedAt: row.CreatedAt, EndedAt: row.EndedAt, Summary: row.Summary}}, nil
}

func networkData(n *delegate.NetworkState, logged int64) ([]byte, error) {
	return json.Marshal(networkRow{ID: n.ID, Policy: n.Policy, Inject: n.Inject, CreatedAt: n.CreatedAt, EndedAt: n.EndedAt,
		Summary: n.Summary, Logged: logged})
}

// CreateNetwork stores a new network.
func (s *NetworkStore) CreateNetwork(ctx context.Context, n *delegate.NetworkState) error {
	if n.ID == "" || n.TokenHash == "" {
		return fmt.Errorf("create network: an id and a token hash are required: %w", delegate.ErrInvalid)
	}
	data, err := networkData(n, 0)
	if err != nil {
		return err
	}
	err = s.db.w.do(ctx, func(tx *sql.Tx) error {
		_, err := s.stmt.wInsert.in(tx).Exec(n.ID, n.TokenHash, n.Token, boolInt(!n.EndedAt.IsZero()), n.CA, data)
		if err != nil && strings.Contains(err.Error(), "UNIQUE") {
			return fmt.Errorf("network %s exists (or its token is taken): %w", n.ID, delegate.ErrConflict)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("create network %s: %w", n.ID, err)
	}
	return nil
}

// GetNetwork reads one by id.
func (s *NetworkStore) GetNetwork(ctx context.Context, id string) (*delegate.NetworkState, error) {
	sn, err := scanNetwork(id, s.stmt.get.QueryRowContext(ctx, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, delegate.NetworkNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", id, err)
	}
	return sn.n, nil
}

// NetworkByToken reads the network whose token hashes to hash.
func (s *NetworkStore) NetworkByToken(ctx context.Context, hash string) (*delegate.NetworkState, error) {
	sn, err := scanNetwork("", s.stmt.byToken.QueryRowContext(ctx, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, &delegate.NotFoundError{Resource: "network", ID: "(token)"}
	}
	if err != nil {
		return nil, fmt.Errorf("network by token: %w", err)
	}
	return sn.n, nil
}

// LiveNetworks returns the networks not ended, oldest first.
func (s *NetworkStore) LiveNetworks(ctx context.Context) ([]delegate.NetworkState, error) {
	rows, err := s.stmt.live.QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("live networks: %w", err)
	}
	defer rows.Close()
	var out []delegate.NetworkState
	for rows.Next() {
		sn, err := scanNetwork("", rows)
		if err != nil {
			return nil, fmt.Errorf("live networks: %w", err)
		}
		out = append(out, *sn.n)
	}
	return out, rows.Err()
}

// getForWrite reads a network on the write connection.
func (s *NetworkStore) getForWrite(tx *sql.Tx, id string) (*storedNetwork, error) {
	sn, err := scanNetwork(id, s.stmt.wGet.in(tx).QueryRow(id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, delegate.NetworkNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", id, err)
	}
	return sn, nil
}

func (s *NetworkStore) put(tx *sql.Tx, sn *storedNetwork) error {
	data, err := networkData(sn.n, sn.logged)
	if err != nil {
		return err
	}
	_, err = s.stmt.wUpdate.in(tx).Exec(boolInt(!sn.n.EndedAt.IsZero()), sn.n.Token, sn.n.CA, data, sn.seq)
	return err
}

// UpdateNetwork changes one in a transaction. Its id and token hash stay.
func (s *NetworkStore) UpdateNetwork(ctx context.Context, id string, fn func(*delegate.NetworkState) error) (*delegate.NetworkState, error) {
	var out *delegate.NetworkState
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		sn, err := s.getForWrite(tx, id)
		if err != nil {
			return err
		}
		hash := sn.n.TokenHash
		if err := fn(sn.n); err != nil {
			return err
		}
		sn.n.ID, sn.n.TokenHash = id, hash
		if err := s.put(tx, sn); err != nil {
			return fmt.Errorf("update network %s: %w", id, err)
		}
		out = sn.n
		return nil
	})
	return out, err
}

// AppendNetworkLog adds entries to a network's log, counting every one
// in its summary and keeping the first MaxNetworkLog.
func (s *NetworkStore) AppendNetworkLog(ctx context.Context, id string, entries []delegate.NetworkEntry) error {
	if len(entries) == 0 {
		return nil
	}
	err := s.db.w.do(ctx, func(tx *sql.Tx) error {
		sn, err := s.getForWrite(tx, id)
		if err != nil {
			return err
		}
		sum := &sn.n.Summary
		for _, e := range entries {
			countEntry(sum, e)
			if sn.logged >= delegate.MaxNetworkLog {
				if e.Attempt() {
					sum.Unlogged++
				}
				continue
			}
			sn.logged++
			e.Seq = sn.logged
			data, err := json.Marshal(e)
			if err != nil {
				return err
			}
			if _, err := s.stmt.wAppend.in(tx).Exec(sn.seq, e.Seq, boolInt(e.Allowed), boolInt(e.Attempt()), data); err != nil {
				return fmt.Errorf("append to network log %s: %w", id, err)
			}
		}
		return s.put(tx, sn)
	})
	if err != nil {
		return fmt.Errorf("network log %s: %w", id, err)
	}
	return nil
}

// countEntry adds e to a summary.
func countEntry(sum *delegate.NetworkSummary, e delegate.NetworkEntry) {
	switch {
	case e.Via == "log":
		sum.Lost += e.Lost
	case !e.Attempt():
	case e.Allowed:
		sum.Allowed++
		sum.Sent += e.Sent
		sum.Received += e.Received
	default:
		sum.Denied++
		if t := e.Target(); len(sum.DeniedNames) < delegate.MaxDeniedNames && !slices.Contains(sum.DeniedNames, t) {
			sum.DeniedNames = append(sum.DeniedNames, t)
		}
	}
}

// NetworkLog reads entries of a network's log, oldest first.
func (s *NetworkStore) NetworkLog(ctx context.Context, id string, opts delegate.NetworkLogOptions) ([]delegate.NetworkEntry, error) {
	limit := opts.Limit
	if limit <= 0 {
		limit = delegate.DefaultNetworkPage
	}
	limit = min(limit, delegate.MaxNetworkLog)
	st := s.stmt.log
	if opts.Denied {
		st = s.stmt.logDenied
	}
	rows, err := st.QueryContext(ctx, id, opts.After, limit)
	if err != nil {
		return nil, fmt.Errorf("network log %s: %w", id, err)
	}
	defer rows.Close()
	out := []delegate.NetworkEntry{}
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("network log %s: %w", id, err)
		}
		var e delegate.NetworkEntry
		if err := json.Unmarshal(data, &e); err != nil {
			return nil, fmt.Errorf("network log %s: %w", id, err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
