package local

import "log/slog"

// Config configures a Backend.
type Config struct {
	// Dir holds one directory per sandbox (e.g. $DATA/sandboxes). It is
	// created with mode 0700 if missing.
	Dir string
	// SelfExe is the binary re-executed for the helper processes (shim and
	// init); its main must call Reexec first. Default: os.Executable().
	SelfExe string
	// PidsMax caps the processes and threads of one sandbox. Default 512.
	PidsMax int
	// Logger receives the backend's own events; nil discards them.
	Logger *slog.Logger
}

// DefaultPidsMax is used when Config.PidsMax is zero.
const DefaultPidsMax = 512

// DefaultOutputLimit is the output kept when Command.OutputLimit is zero or
// negative, so a forgotten limit cannot fill the server's disk.
const DefaultOutputLimit = 16 << 20
