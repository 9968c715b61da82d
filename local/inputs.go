package local

import (
	"fmt"
	"regexp"
	"sync"
)

// A command's inputs (sandbox.Command.Inputs) are files in a tmpfs of
// the command's own at InputsDir, made by init from the plan before the
// job starts: owned by the job's user, mode 0400, on a read-only mount.
// Their bytes travel from the server to init in memory (the plan), so
// that untrusted text (the task, a script) never reaches an argument
// list, which every user of the host can read in /proc, nor the disk.
const (
	// InputsDir is where the inputs are, inside the sandbox.
	InputsDir = "/run/delegate/inputs"
	// InputsEnv names InputsDir in the command's environment.
	InputsEnv = "DELEGATE_INPUTS"
	// maxInputs and maxInputBytes bound what one command may be given:
	// the plan carrying them is read whole into memory.
	maxInputs     = 64
	maxInputBytes = 32 << 20
)

// inputName is what an input may be called: one path component of
// letters, digits, '.', '_' and '-', not starting with a dot.
var inputName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$`) })

// validateInputs checks a command's inputs and the one it reads as its
// standard input.
func validateInputs(inputs map[string][]byte, stdin string) error {
	if len(inputs) > maxInputs {
		return fmt.Errorf("exec: %d inputs, at most %d", len(inputs), maxInputs)
	}
	var total int
	for name, data := range inputs {
		if !inputName().MatchString(name) {
			return fmt.Errorf("exec: input %q: a name is 1 to 128 letters, digits, '.', '_' or '-', not starting with '.'", name)
		}
		total += len(data)
	}
	if total > maxInputBytes {
		return fmt.Errorf("exec: inputs of %d bytes, at most %d in all", total, maxInputBytes)
	}
	if _, ok := inputs[stdin]; stdin != "" && !ok {
		return fmt.Errorf("exec: Stdin %q names no input", stdin)
	}
	return nil
}
