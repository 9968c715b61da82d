package local

import "os"

// The helpers (see doc.go) are this binary re-executed. The C ones, when
// built in, take over before the Go runtime starts; the Go ones are
// dispatched here, in this package's initialisation, which Go runs after
// that of the packages this one imports and before that of the many
// packages of a program that do not come before it (the Go
// specification orders initialisation by import path among packages whose
// imports are done): the sqlite driver, the MCP SDK, the CLI and the rest
// never initialise in a helper, which starts in about half the time and
// memory (docs/BENCHMARKS.md).
func init() {
	if code, ok := dispatchHelper(); ok {
		os.Exit(code)
	}
}

// Reexec runs a sandbox helper when this process was started as one and
// then exits; otherwise it returns false at once. The helpers are
// dispatched when this package is initialised (see above), so by the
// time main calls it there is nothing left to do; it stays for programs
// that call it first thing in main, and for tests' TestMain.
func Reexec() bool {
	if code, ok := dispatchHelper(); ok {
		os.Exit(code)
	}
	return false
}

// extractCommand unpacks a workspace archive into a sandbox's workspace
// (archive_linux.go).
const extractCommand = "__workspace-extract"

// usernsHoldCommand holds a user namespace made for an idmap of a
// checkpoint's layer until its stdin closes (layers_linux.go).
const usernsHoldCommand = "__sandbox-userns"

// dispatchHelper runs the helper os.Args names (the hidden subcommands), if
// any, and returns its exit status.
func dispatchHelper() (int, bool) {
	if len(os.Args) < 2 {
		return 0, false
	}
	switch os.Args[1] {
	case shimCommand:
		return runShim(os.Args[2:]), true
	case initCommand:
		return runInit(os.Args[2:]), true
	case execCommand:
		return runExec(), true
	case extractCommand:
		return runExtract(os.Args[2:]), true
	case usernsHoldCommand:
		return runUsernsHold(), true
	}
	return 0, false
}
