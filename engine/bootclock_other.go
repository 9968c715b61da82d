//go:build !linux

package engine

import "golang.org/x/sys/unix"

// bootClock: macOS's CLOCK_MONOTONIC counts through a sleep already.
const bootClock = unix.CLOCK_MONOTONIC
