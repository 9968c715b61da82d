package local

import "os"

// Reexec runs a sandbox helper when this process was started as one
// (os.Args[1] is one of the hidden helper subcommands) and then exits;
// otherwise it returns false at once. Call it first thing in main, before
// flags are parsed or anything is written to stdout, and in TestMain of
// tests that use this package.
func Reexec() bool {
	if len(os.Args) < 2 {
		return false
	}
	switch os.Args[1] {
	case shimCommand:
		os.Exit(runShim(os.Args[2:]))
	case initCommand:
		os.Exit(runInit(os.Args[2:]))
	}
	return false
}
