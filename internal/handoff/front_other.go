//go:build !linux || !cgo

package handoff

// cFront: no C front end; Try hands the command off in Go.
const cFront = false
