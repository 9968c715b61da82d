package main

import (
	"errors"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// onTmpfs: path, or the nearest of its parents that exists, is on a
// tmpfs (statfs).
func onTmpfs(path string) bool {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		var s unix.Statfs_t
		err := unix.Statfs(p, &s)
		if err == nil {
			return s.Type == unix.TMPFS_MAGIC
		}
		if !errors.Is(err, fs.ErrNotExist) || p == filepath.Dir(p) {
			return false
		}
	}
}
