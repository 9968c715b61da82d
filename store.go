package delegate

// Store is everything delegate keeps, one small interface per resource:
// jobs, their progress and timelines, their output, their artifacts. The
// engine takes a Store; a database implements each part on its connections
// (sqlite.DB, postgres.DB), and every implementation passes the same
// contract tests (storetest.Run).
//
// A resource that later work adds (kept sandboxes, questions waiting for
// a person's answer, leases of jobs to servers) gets an interface of its
// own beside these, embedded here, in its own file.
type Store interface {
	JobStore
	ProgressStore
	OutputStore
	ArtifactStore
	SandboxStore
	WorkspaceStore
	QuestionStore // question.go
	NetworkStore
	RetentionStore // retention.go
	ServerStore    // server.go
	TokenStore     // principal.go
	AuditStore     // audit.go
	QuotaStore     // quota.go
}
