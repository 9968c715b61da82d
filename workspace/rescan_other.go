//go:build unix && !linux

package workspace

// stampsLocally: see rescan_linux.go; elsewhere Rescan always scans
// again.
func stampsLocally(int) bool { return false }
