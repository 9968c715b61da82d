package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// NetworkStore keeps the networks the egress proxy serves and their logs,
// as the SQLite store does: a network is a row (its id, its token's hash
// and its CA as columns, the rest as JSON); its log is rows of its own,
// each entry as JSON, written in batches.
type NetworkStore struct{ db *DB }

var _ delegate.NetworkStore = (*NetworkStore)(nil)

const networkColumns = `seq, token_hash, token, ca, data`

// networkRow is a network as stored in data: what the columns do not
// hold, and how many entries of its log are kept. The SQLite store's JSON.
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

func scanNetwork(id string, row pgx.Row) (*storedNetwork, error) {
	var (
		seq       int64
		hash, tok string
		ca        []byte
		data      string
		r         networkRow
	)
	if err := row.Scan(&seq, &hash, &tok, &ca, &data); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(data), &r); err != nil {
		return nil, fmt.Errorf("decode network %s: %w", id, err)
	}
	return &storedNetwork{seq: seq, logged: r.Logged, n: &delegate.NetworkState{ID: r.ID, Policy: r.Policy, Inject: r.Inject,
		TokenHash: hash, Token: tok, CA: ca, CreatedAt: r.CreatedAt, EndedAt: r.EndedAt, Summary: r.Summary}}, nil
}

func networkData(n *delegate.NetworkState, logged int64) (string, error) {
	b, err := json.Marshal(networkRow{ID: n.ID, Policy: n.Policy, Inject: n.Inject, CreatedAt: n.CreatedAt, EndedAt: n.EndedAt,
		Summary: n.Summary, Logged: logged})
	return string(b), err
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
	_, err = s.db.exec(ctx, `INSERT INTO networks (id, token_hash, token, ended, ca, data) VALUES ($1, $2, $3, $4, $5, $6)`,
		n.ID, n.TokenHash, n.Token, !n.EndedAt.IsZero(), n.CA, data)
	if isUnique(err) {
		err = fmt.Errorf("network %s exists (or its token is taken): %w", n.ID, delegate.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("create network %s: %w", n.ID, err)
	}
	return nil
}

// GetNetwork reads one by id.
func (s *NetworkStore) GetNetwork(ctx context.Context, id string) (*delegate.NetworkState, error) {
	sn, err := scanNetwork(id, s.db.pool.QueryRow(ctx, `SELECT `+networkColumns+` FROM networks WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, delegate.NetworkNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", id, err)
	}
	return sn.n, nil
}

// NetworkByToken reads the network whose token hashes to hash.
func (s *NetworkStore) NetworkByToken(ctx context.Context, hash string) (*delegate.NetworkState, error) {
	sn, err := scanNetwork("", s.db.pool.QueryRow(ctx, `SELECT `+networkColumns+` FROM networks WHERE token_hash = $1`, hash))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &delegate.NotFoundError{Resource: "network", ID: "(token)"}
	}
	if err != nil {
		return nil, fmt.Errorf("network by token: %w", err)
	}
	return sn.n, nil
}

// LiveNetworks returns the networks not ended, oldest first.
func (s *NetworkStore) LiveNetworks(ctx context.Context) ([]delegate.NetworkState, error) {
	rows, err := s.db.pool.Query(ctx, `SELECT `+networkColumns+` FROM networks WHERE NOT ended ORDER BY seq`)
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

// getForWrite reads a network and locks its row until the commit.
func getForWrite(ctx context.Context, tx pgx.Tx, id string) (*storedNetwork, error) {
	sn, err := scanNetwork(id, tx.QueryRow(ctx, `SELECT `+networkColumns+` FROM networks WHERE id = $1 FOR NO KEY UPDATE`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, delegate.NetworkNotFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", id, err)
	}
	return sn, nil
}

func putNetwork(ctx context.Context, tx pgx.Tx, sn *storedNetwork) error {
	data, err := networkData(sn.n, sn.logged)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE networks SET ended = $1, token = $2, ca = $3, data = $4 WHERE seq = $5`,
		!sn.n.EndedAt.IsZero(), sn.n.Token, sn.n.CA, data, sn.seq)
	return err
}

// UpdateNetwork changes one in a transaction. Its id and token hash stay.
func (s *NetworkStore) UpdateNetwork(ctx context.Context, id string, fn func(*delegate.NetworkState) error) (*delegate.NetworkState, error) {
	var out *delegate.NetworkState
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		sn, err := getForWrite(ctx, tx, id)
		if err != nil {
			return err
		}
		hash := sn.n.TokenHash
		if err := fn(sn.n); err != nil {
			return err
		}
		sn.n.ID, sn.n.TokenHash = id, hash
		if err := putNetwork(ctx, tx, sn); err != nil {
			return fmt.Errorf("update network %s: %w", id, err)
		}
		out = sn.n
		return nil
	})
	return out, err
}

// AppendNetworkLog adds entries to a network's log, counting every one
// in its summary and keeping the first MaxNetworkLog; the entries kept
// go in one statement.
func (s *NetworkStore) AppendNetworkLog(ctx context.Context, id string, entries []delegate.NetworkEntry) error {
	if len(entries) == 0 {
		return nil
	}
	err := s.db.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		sn, err := getForWrite(ctx, tx, id)
		if err != nil {
			return err
		}
		sum := &sn.n.Summary
		var (
			seqs              []int64
			allowed, attempts []bool
			data              []string
		)
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
			b, err := json.Marshal(e)
			if err != nil {
				return err
			}
			seqs, allowed, attempts, data = append(seqs, e.Seq), append(allowed, e.Allowed), append(attempts, e.Attempt()), append(data, string(b))
		}
		if len(seqs) > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO network_log (network_seq, seq, allowed, attempt, data)
				SELECT $1, * FROM unnest($2::bigint[], $3::boolean[], $4::boolean[], $5::text[])`, sn.seq, seqs, allowed, attempts, data); err != nil {
				return fmt.Errorf("append to network log %s: %w", id, err)
			}
		}
		return putNetwork(ctx, tx, sn)
	})
	if err != nil {
		return fmt.Errorf("network log %s: %w", id, err)
	}
	return nil
}

// countEntry adds e to a summary (as the SQLite store does).
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
	cond := ``
	if opts.Denied {
		cond = ` AND NOT l.allowed AND l.attempt`
	}
	rows, err := s.db.pool.Query(ctx, `SELECT l.data FROM network_log l JOIN networks n ON n.seq = l.network_seq
		WHERE n.id = $1 AND l.seq > $2`+cond+` ORDER BY l.seq LIMIT $3`, id, opts.After, limit)
	if err != nil {
		return nil, fmt.Errorf("network log %s: %w", id, err)
	}
	defer rows.Close()
	out := []delegate.NetworkEntry{}
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("network log %s: %w", id, err)
		}
		var e delegate.NetworkEntry
		if err := json.Unmarshal([]byte(data), &e); err != nil {
			return nil, fmt.Errorf("network log %s: %w", id, err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
