package delegate

import (
	"fmt"
)

// NoSpaceError: the server's data dir is (nearly) full. A submission or an
// open_sandbox is refused below the floor of free space (Setting names
// it), and work that failed writing there says so, instead of failing
// later with a job stuck or its output lost. It wraps ErrUnavailable (the
// same request works once there is room), and its text says what to do.
type NoSpaceError struct {
	Dir   string // the data dir
	Free  int64  // bytes free there (for an unprivileged process)
	Floor int64  // the floor it is below; 0 when a write failed (ENOSPC)
	// Setting is the floor's environment variable (DELEGATE_MIN_FREE).
	Setting string
	// Err is the write's own error, when one failed (for the log: its
	// words, ENOSPC or SQLite's, are not in Error's text).
	Err error
}

func (e *NoSpaceError) Error() string {
	if e.Dir == "" {
		return "no space left on the server's data dir: free space there (delegate gc removes finished jobs past their retention)"
	}
	if e.Floor > 0 {
		return fmt.Sprintf("no space left on %s: %s free, below the floor of %s (%s); free space there "+
			"(delegate gc removes finished jobs past their retention) or lower %s", e.Dir, FormatBytes(e.Free), FormatBytes(e.Floor),
			e.Setting, e.Setting)
	}
	return fmt.Sprintf("no space left on %s (%s free): free space there (delegate gc removes finished jobs past their retention)",
		e.Dir, FormatBytes(e.Free))
}

// Unwrap lets errors.Is(err, ErrUnavailable) match, and the write's own
// error.
func (e *NoSpaceError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrUnavailable}
	}
	return []error{ErrUnavailable, e.Err}
}

// FormatBytes writes a size for people: 512 B, 12.5 MiB, 3.0 GiB.
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
