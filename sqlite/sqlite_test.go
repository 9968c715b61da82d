package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sqlite"
	"github.com/delegate-dev/delegate/storetest"
)

func open(t testing.TB, path string) *sqlite.DB {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var newJob = storetest.NewJob

// TestStore runs the store contract (storetest) on SQLite: each handle
// the suite opens is another connection to the test's database file, as
// another process sharing the data dir has.
func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Open {
		path := filepath.Join(t.TempDir(), "jobs.db")
		return func() delegate.Store { return open(t, path) }
	})
}
