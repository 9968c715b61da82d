//go:build !linux

package cli

// hostMemory is unknown here: the local backend, whose maxima it sets,
// runs on Linux only.
func hostMemory() int64 { return 0 }
