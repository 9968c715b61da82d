//go:build linux && cgo

package front

// The front end in C (front_linux.c) runs before the Go runtime starts;
// this import has cgo build it into the program.

import "C"

// cFront: front_linux.c has tried the hand-off already.
const cFront = true
