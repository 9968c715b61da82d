package postgres_test

import (
	"context"
	"os"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/postgres"
	"github.com/delegate-dev/delegate/postgres/pgtest"
	"github.com/delegate-dev/delegate/storetest"
)

// One PostgreSQL server for the package's tests; a database each.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func open(t testing.TB, url string) *postgres.DB {
	t.Helper()
	s, err := postgres.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestStore runs the store contract (storetest) on PostgreSQL: each
// handle the suite opens is another pool of connections to the test's
// database, as another server sharing it has.
func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Open {
		url := pgtest.New(t)
		return func() delegate.Store { return open(t, url) }
	})
}
