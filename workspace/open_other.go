//go:build unix && !linux

package workspace

// openBeneath: see open_linux.go. Without openat2, the portable walk.
func openBeneath(dirfd int, rel string, flags int, mode uint32) (int, error) {
	return openWalk(dirfd, rel, flags, mode, false)
}

// openAcross: see open_linux.go.
func openAcross(dirfd int, rel string, flags int, mode uint32) (int, error) {
	return openWalk(dirfd, rel, flags, mode, true)
}
