package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"testing/synctest"
)

// TestWriteInSynctestBubble: a write whose leader waits for the writers of
// a larger last group, who do not come, commits alone in a synctest
// bubble too, where the clock stands still while the leader runs (it
// spun there for ever, hanging the engine's tests in bubbles).
func TestWriteInSynctestBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		db, err := Open(ctx, filepath.Join(t.TempDir(), "jobs.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		db.w.mu.Lock()
		db.w.lastGroup = 4 // four writers committed together last time
		db.w.mu.Unlock()
		if err := db.w.do(ctx, func(*sql.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	})
}
