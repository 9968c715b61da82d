// Package delegate is the domain of delegate, a server that runs jobs in
// isolated, disposable sandboxes for AI agents (over MCP) and people (the
// command line, a dashboard).
//
// A job is a Manifest (what to run, in which sandbox, with which limits,
// files, network and secrets) and what became of it: its Status, moved by
// one state machine (pending → provisioning → running → success, failed,
// timeout or cancelled; a terminal status is final), its output, exit code
// and artifacts. Everything else depends on this package, which depends on
// nothing of delegate's.
//
// The services are the interfaces the outside reaches jobs through:
// JobService (submit, wait, read results and logs, cancel), and beside it
// CallbackService (a job's reports from inside its sandbox),
// QuestionService (a job's questions to a person), SandboxService (kept
// sandboxes), NetworkService (the egress proxy's log and allowlists) and
// WorkspaceService (what a job changed in a directory it imported). The
// engine (package engine) implements every one over a store (package
// sqlite implements Store) and a sandbox backend (package sandbox's
// contract: local, proxmox, or sandboxtest's in-memory fake). The adapters
// (mcpserver, httpapi, dashboard, cli) take the services they use by
// name, and cmd/delegate wires them.
//
// Errors wrap this package's sentinels (ErrNotFound, ErrInvalid, …):
// ErrorKind classifies one, and each adapter keeps one small table from a
// Kind to its answer.
//
// The example submits a job to an engine over the in-memory fake backend,
// waits for it, and reads its result: what an MCP client does with
// submit_job, wait_job and get_job_result.
package delegate
