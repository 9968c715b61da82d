//go:build unix && !linux

package workspace

import "path/filepath"

// openBeneath: see open_linux.go. Without openat2, the portable walk.
func openBeneath(dirfd int, rel string, flags int, mode uint32) (int, error) {
	return openWalk(dirfd, rel, flags, mode, false)
}

// openAcross: see open_linux.go.
func openAcross(dirfd int, rel string, flags int, mode uint32) (int, error) {
	return openWalk(dirfd, rel, flags, mode, true)
}

// fdPath is the path of dir with its links resolved, "" when it cannot
// say (without /proc, by the path rather than the descriptor).
func fdPath(_ int, dir string) string {
	p, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return ""
	}
	return p
}
