//go:build !linux && !darwin

package cli

import "io"

// isTerminal: unknown here, so the output is written as it is.
func isTerminal(w io.Writer) bool { return false }
