package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// gatherFor is the longest a leader waits for the writers of the previous
// group to queue again: a fraction of one commit.
const gatherFor = 50 * time.Microsecond

// maxGatherTurns bounds that wait in turns given to other goroutines: a
// turn takes some 80 ns with nothing else to run, so that on a real clock
// gatherFor ends the wait first.
const maxGatherTurns = 1000

// writer serialises every write through the one write connection and
// commits them in groups: writers that arrive while a transaction is being
// committed queue up, and the first of them then commits all of their
// changes in a single transaction (each in a savepoint of its own, so that
// one failing write does not undo the others). Under load, N concurrent
// writes cost one commit instead of N; alone, a write costs what it did.
//
// Durability is the database's: WAL with synchronous=NORMAL, so a write
// that returned survives the process being killed (it is in the WAL, in
// the kernel's page cache), though not a power cut before the next
// checkpoint.
type writer struct {
	db *sql.DB
	// between, if set, runs after a group has committed, while the write
	// connection is free and no other write can start.
	between func()
	// savepoint, rollbackTo and release are prepared on db once used
	// twice (parsing them for every write of a group cost as much as the
	// write).
	savepoint, rollbackTo, release *writeStmt
	// wanted are the write statements used twice and not prepared yet:
	// the leader prepares them after its group has committed
	// (preparePending).
	wanted []*writeStmt

	mu    sync.Mutex
	queue []*writeOp
	busy  bool // a leader is committing
	// lastGroup is how many writes the last commit carried.
	lastGroup int

	commits, writes atomic.Int64 // transactions committed, writes in them
}

type writeOp struct {
	fn   func(tx *sql.Tx) error
	err  error
	wake chan bool // true: lead the next group; false: done, err is set
}

// do runs fn in a write transaction and returns once that transaction has
// committed (or fn's error). fn may run in another goroutine, in a
// transaction shared with other writes; it must not call the store.
// Once queued, a write is not abandoned when ctx ends: it is quick, and a
// caller cancelled mid-way must not leave half of its changes.
func (w *writer) do(ctx context.Context, fn func(tx *sql.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	op := &writeOp{fn: fn, wake: make(chan bool, 1)}
	w.mu.Lock()
	w.queue = append(w.queue, op)
	if w.busy {
		w.mu.Unlock()
		if lead := <-op.wake; !lead {
			return op.err
		}
		w.mu.Lock()
	}
	// This goroutine leads: it commits everything queued so far, its own
	// write included, then hands the lead to the first write that queued
	// meanwhile.
	w.busy = true
	if wanted := w.lastGroup; wanted > 1 && len(w.queue) < wanted {
		// The writers of the last group are likely on their way back
		// (they were all waiting on that commit): let them queue, for a
		// moment, rather than commit alone and make them wait for this.
		w.mu.Unlock()
		// Bounded in turns too: in a synctest bubble the clock stands
		// still while this goroutine runs.
		for start, turns := time.Now(), 0; time.Since(start) < gatherFor && turns < maxGatherTurns; turns++ {
			runtime.Gosched()
			w.mu.Lock()
			n := len(w.queue)
			w.mu.Unlock()
			if n >= wanted {
				break
			}
		}
		w.mu.Lock()
	}
	group := w.queue
	w.queue = nil
	w.lastGroup = len(group)
	w.mu.Unlock()

	w.commit(group)
	w.preparePending(context.Background())
	if w.between != nil {
		w.between()
	}

	w.mu.Lock()
	if len(w.queue) > 0 {
		w.queue[0].wake <- true
	} else {
		w.busy = false
	}
	w.mu.Unlock()
	for _, o := range group {
		if o != op {
			o.wake <- false
		}
	}
	return op.err
}

// preparePending prepares the write statements wanted prepared, while
// the write connection is free: after a group has committed, before the
// next begins (only the leader uses it then). One that fails stays
// unprepared and runs as text, which reports its error where it is used.
func (w *writer) preparePending(ctx context.Context) {
	for _, s := range w.wanted {
		if st, err := w.db.PrepareContext(ctx, s.text); err == nil {
			s.st = st
		}
	}
	w.wanted = nil
}

// writeStmt is a statement of the write connection, prepared once it has
// been used twice: a process that writes with it once (a CLI command
// writes with a few of the ~30, most once) parses it once, unprepared,
// and a server has it prepared from its second use on. Parsing all of
// them before the first write was 4% of `delegate exec ID -- true`'s
// CPU (issue 41, item 2). It is prepared by the writer's leader between
// transactions: inside one, a prepare would wait for ever on the one
// write connection the transaction holds. Only the leader uses one (a
// write's fn runs in the leader's goroutine), so it needs no lock.
type writeStmt struct {
	w    *writer
	text string
	st   *sql.Stmt // nil until prepared
	uses int       // while not prepared
}

// use counts a use and returns the prepared statement, or nil: then the
// text is run unprepared.
func (s *writeStmt) use() *sql.Stmt {
	if s.st == nil {
		if s.uses++; s.uses == 2 {
			s.w.wanted = append(s.w.wanted, s)
		}
	}
	return s.st
}

// in is s in a write's transaction.
func (s *writeStmt) in(tx *sql.Tx) txStmt { return txStmt{tx, s} }

// txStmt is a write statement in a transaction: tx's copy of the prepared
// statement, or its text run in tx.
type txStmt struct {
	tx *sql.Tx
	s  *writeStmt
}

// Exec is sql.Stmt's.
func (t txStmt) Exec(args ...any) (sql.Result, error) {
	if st := t.s.use(); st != nil {
		return t.tx.Stmt(st).Exec(args...)
	}
	return t.tx.Exec(t.s.text, args...)
}

// QueryRow is sql.Stmt's.
func (t txStmt) QueryRow(args ...any) *sql.Row {
	return t.QueryRowContext(context.Background(), args...)
}

// QueryRowContext is sql.Stmt's.
func (t txStmt) QueryRowContext(ctx context.Context, args ...any) *sql.Row {
	if st := t.s.use(); st != nil {
		return t.tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	return t.tx.QueryRowContext(ctx, t.s.text, args...)
}

// prepared is the statement for many uses in tx: the prepared one, or
// one prepared on tx's connection for tx alone (parsed once, not once a
// use; it counts as one use).
func (t txStmt) prepared() (*sql.Stmt, error) {
	if st := t.s.use(); st != nil {
		return t.tx.Stmt(st), nil
	}
	st, err := t.tx.Prepare(t.s.text)
	if err != nil {
		return nil, fmt.Errorf("prepare %q: %w", t.s.text, err)
	}
	return st, nil
}

// commit runs a group of writes in one transaction.
func (w *writer) commit(group []*writeOp) {
	ctx := context.Background()
	fail := func(err error) {
		for _, o := range group {
			if o.err == nil {
				o.err = err
			}
		}
	}
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		fail(fmt.Errorf("begin: %w", err))
		return
	}
	if len(group) == 1 {
		// Alone: fn's error undoes the whole transaction.
		if err := group[0].fn(tx); err != nil {
			group[0].err = err
			tx.Rollback()
			return
		}
	} else {
		ok := 0
		savepoint, rollbackTo, release := w.savepoint.in(tx), w.rollbackTo.in(tx), w.release.in(tx)
		for _, o := range group {
			if _, err := savepoint.Exec(); err != nil {
				o.err = err
				continue
			}
			if o.err = o.fn(tx); o.err != nil {
				if _, err := rollbackTo.Exec(); err != nil {
					tx.Rollback()
					fail(fmt.Errorf("roll back one write: %w", err))
					return
				}
			} else {
				ok++
			}
			if _, err := release.Exec(); err != nil {
				tx.Rollback()
				fail(fmt.Errorf("release: %w", err))
				return
			}
		}
		if ok == 0 {
			tx.Rollback()
			return
		}
	}
	if err := tx.Commit(); err != nil {
		fail(fmt.Errorf("commit: %w", err))
		return
	}
	w.commits.Add(1)
	w.writes.Add(int64(len(group)))
}
