package local

// SupervisorMemory is the memory that the supervisors of running
// sandboxes (each sandbox's shim and init, not its job) use: their
// proportional set size (PSS, from /proc/PID/smaps_rollup), in which a
// page shared by n processes counts 1/n for each. It is what a running
// sandbox adds to the host besides its job.
type SupervisorMemory struct {
	Sandboxes int   // sandboxes whose supervisors were measured
	Processes int   // shims (keepers) and inits (and spares)
	PSS       int64 // bytes, all of them together
	PSSAnon   int64 // of which anonymous memory: theirs alone
	PSSFile   int64 // of which file pages (the binary, libc), shared
}

// PerSandbox is PSS divided by the number of sandboxes (0 for none).
func (m SupervisorMemory) PerSandbox() int64 {
	if m.Sandboxes == 0 {
		return 0
	}
	return m.PSS / int64(m.Sandboxes)
}
