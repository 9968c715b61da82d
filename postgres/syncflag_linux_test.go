package postgres_test

import (
	"os"
	"syscall"
)

// syncFlag opens a file whose writes are flushed as they are made, as
// PostgreSQL's wal_sync_method=open_datasync opens its WAL.
const syncFlag = syscall.O_DSYNC

// datasync flushes f's data (not its times), as PostgreSQL's default
// wal_sync_method does.
func datasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
