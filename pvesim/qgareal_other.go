//go:build !linux

package pvesim

import "os"

// dirFlags: the real agent is Linux's (qgaBinary finds none elsewhere).
const dirFlags = os.O_RDONLY
