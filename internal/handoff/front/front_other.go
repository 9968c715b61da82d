//go:build !linux || !cgo

package front

// cFront: no C front end; Try hands the command off in Go.
const cFront = false
