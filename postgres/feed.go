package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/jackc/pgx/v5"
)

// The job feed (delegate.JobFeed): a trigger on jobs (migration 6)
// notifies channel jobsChannel when a job starts running or ends, with
// "id status origin" as its payload; origin is the delegate.origin
// setting of the connection that made the change, which every
// connection of a DB's pool sets to the DB's own tag, so that a DB's
// listener leaves out its own process's changes.
//
// Only these changes notify: a transaction that notifies takes a lock
// over the whole database while it commits, so that notifying commits do
// not share their WAL flush (group commit). A submit (the insert) and
// the passage through provisioning are not told; a job's start and its
// end, which a waiter or a follower on another server acts on, are.
const (
	jobsChannel   = "delegate_jobs"
	originSetting = "delegate.origin"
	// feedQuiet is how long the listener waits for a notification before
	// it asks the connection whether it still lives (a connection cut
	// without a word would otherwise wait for TCP's keep-alives).
	feedQuiet = 30 * time.Second
)

func newOrigin() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

var _ delegate.JobFeed = (*DB)(nil)

// FollowJobs listens on a connection of its own (not one of the pool's):
// see delegate.JobFeed.
func (db *DB) FollowJobs(ctx context.Context, listening func(), changed func(id string, status delegate.Status)) error {
	conn, err := pgx.ConnectConfig(ctx, db.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("job feed: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+jobsChannel); err != nil {
		return fmt.Errorf("job feed: listen: %w", err)
	}
	listening()
	for {
		wctx, cancel := context.WithTimeout(ctx, feedQuiet)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && errors.Is(wctx.Err(), context.DeadlineExceeded):
			pctx, cancel := context.WithTimeout(ctx, feedQuiet/3)
			err = conn.Ping(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("job feed: the connection went quiet and does not answer: %w", err)
			}
			continue
		case err != nil:
			return fmt.Errorf("job feed: %w", err)
		}
		id, rest, _ := strings.Cut(n.Payload, " ")
		status, origin, _ := strings.Cut(rest, " ")
		if origin != db.origin {
			changed(id, delegate.Status(status))
		}
	}
}
