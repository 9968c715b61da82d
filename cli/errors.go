package cli

import (
	"errors"

	"github.com/delegate-dev/delegate"
)

// ExitUnavailable is what a command exits with when something delegate
// needs (the sandbox backend, the store) does not answer now, so that a
// script may try again later (sysexits.h's EX_UNAVAILABLE).
const ExitUnavailable = 69

// serviceErrors is the one table from a job service error's kind to the
// command's exit status and a line that says what to do next. A kind not
// here exits ExitError with the error alone: the person at the terminal
// runs this server, and its words (SQL, the Proxmox API) are theirs to read.
// `delegate run` exits ExitRunError whatever the kind (see Execute).
var serviceErrors = map[delegate.Kind]struct {
	exit int
	hint string
}{
	delegate.KindNotFound:    {ExitError, "'delegate jobs list' shows the jobs."},
	delegate.KindNotFinished: {ExitError, "'delegate jobs logs ID --follow' follows the job until it ends."},
	delegate.KindUnavailable: {ExitUnavailable, "Try again later."},
}

// notFoundHints replace the hint for what is not a job.
var notFoundHints = map[string]string{
	"artifact": "'delegate jobs artifacts ID' lists a job's artifacts.",
}

// serviceExit is the exit status and the hint ("" none) for err.
func serviceExit(err error) (int, string) {
	a, ok := serviceErrors[delegate.ErrorKind(err)]
	if !ok {
		return ExitError, ""
	}
	var nf *delegate.NotFoundError
	if errors.As(err, &nf) && nf.There != "" {
		return a.exit, "" // the error says what there is
	}
	if errors.As(err, &nf) && notFoundHints[nf.Resource] != "" {
		return a.exit, notFoundHints[nf.Resource]
	}
	return a.exit, a.hint
}
