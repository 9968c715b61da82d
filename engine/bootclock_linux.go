package engine

import "golang.org/x/sys/unix"

// bootClock counts through a host suspend, which CLOCK_MONOTONIC does not
// on Linux.
const bootClock = unix.CLOCK_BOOTTIME
