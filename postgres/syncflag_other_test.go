//go:build !linux

package postgres_test

import "os"

// syncFlag: os.O_SYNC where O_DSYNC is not spelled the same.
const syncFlag = os.O_SYNC

// datasync: fsync where fdatasync is not.
func datasync(f *os.File) error { return f.Sync() }
