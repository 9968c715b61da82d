package postgres_test

import (
	"context"
	"slices"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit/pgproxy"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestSubmitCommitsOnce: the engine's whole Submit (not the store's call
// alone) on PostgreSQL is one round trip and one transaction that writes,
// so one commit, whose WAL flush a durable server waits for once. The
// round trips are counted on the wire (countingProxy); the transactions
// that wrote by the transaction ids the server handed out meanwhile
// (pg_current_snapshot's xmax: the next id to be assigned; a transaction
// that only reads takes none). Medians of 15 submits, so that a write of
// the engine's own in the background (none is due here) cannot decide.
func TestSubmitCommitsOnce(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.New(t)
	proxy := pgproxy.New(t, dbURL)
	eng := newEngine(t, open(t, proxy.URL)) // its one run slot taken: what is submitted stays pending
	watch, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	nextXID := func() int64 {
		var x int64
		if err := watch.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	m := delegate.Manifest{AgentType: delegate.AgentScript, Task: "make test", Env: map[string]string{"A": "b"}}
	// The first prepares the statement on its connection (pgx's cache).
	if _, err := eng.Submit(ctx, m, delegate.SubmitOptions{}); err != nil {
		t.Fatal(err)
	}
	var trips, xids []int64
	for range 15 {
		t0, x0 := proxy.Trips(), nextXID()
		if _, err := eng.Submit(ctx, m, delegate.SubmitOptions{}); err != nil {
			t.Fatal(err)
		}
		trips, xids = append(trips, proxy.Trips()-t0), append(xids, nextXID()-x0)
	}
	median := func(v []int64) int64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	if median(trips) != 1 || median(xids) != 1 {
		t.Errorf("a submit: %d round trips and %d transactions that wrote (medians; each: %v, %v), want 1 and 1", median(trips), median(xids), trips, xids)
	}
	t.Logf("round trips %v; transactions that wrote %v", trips, xids)
}
