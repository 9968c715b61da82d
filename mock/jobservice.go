// Package mock holds hand-written test doubles of the services in the
// root package: JobService, SandboxService and CallbackService stand in
// for the engine when the adapters (MCP, the CLI, the dashboard; the callback endpoints)
// are tested. The sandbox backend's double, sandboxtest.Fake, lives beside
// the contract suite it passes.
package mock

import (
	"context"

	"github.com/delegate-dev/delegate"
)

// JobService is a delegate.JobService whose every method calls the
// function field of the same name with Fn appended, so that a test of an
// adapter (MCP, HTTP, CLI) says exactly what the service answers. Calling
// a method whose function is not set panics: the test did not expect it.
type JobService struct {
	SubmitFn       func(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error)
	GetFn          func(ctx context.Context, id string) (*delegate.Job, error)
	ListFn         func(ctx context.Context, opts delegate.ListOptions) (*delegate.JobPage, error)
	WaitFn         func(ctx context.Context, id string) (*delegate.Job, error)
	CancelFn       func(ctx context.Context, id string) (*delegate.Job, bool, error)
	ReleaseFn      func(ctx context.Context, id string) (*delegate.Job, bool, error)
	ResultFn       func(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error)
	LogsFn         func(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error)
	TimelineFn     func(ctx context.Context, id string) ([]delegate.Event, error)
	ArtifactsFn    func(ctx context.Context, id string) ([]delegate.Artifact, error)
	ReadArtifactFn func(ctx context.Context, id, name string) (delegate.Artifact, []byte, error)
	WatchFn        func(ctx context.Context) <-chan string
}

var _ delegate.JobService = (*JobService)(nil)

func unexpected(method string) {
	panic("mock.JobService: unexpected call to " + method + " (set " + method + "Fn)")
}

// CallbackService is a delegate.CallbackService that calls CallbackFn (the
// callback endpoints' test double).
type CallbackService struct {
	CallbackFn     func(ctx context.Context, id, token string, r delegate.Report) (*delegate.Job, error)
	AuthenticateFn func(ctx context.Context, id, token string) error
}

var _ delegate.CallbackService = (*CallbackService)(nil)

func (s *CallbackService) Callback(ctx context.Context, id, token string, r delegate.Report) (*delegate.Job, error) {
	if s.CallbackFn == nil {
		panic("mock.CallbackService: unexpected call to Callback (set CallbackFn)")
	}
	return s.CallbackFn(ctx, id, token, r)
}

func (s *CallbackService) Authenticate(ctx context.Context, id, token string) error {
	if s.AuthenticateFn == nil {
		panic("mock.CallbackService: unexpected call to Authenticate (set AuthenticateFn)")
	}
	return s.AuthenticateFn(ctx, id, token)
}

func (s *JobService) Submit(ctx context.Context, m delegate.Manifest, opts delegate.SubmitOptions) (*delegate.Job, error) {
	if s.SubmitFn == nil {
		unexpected("Submit")
	}
	return s.SubmitFn(ctx, m, opts)
}

func (s *JobService) Get(ctx context.Context, id string) (*delegate.Job, error) {
	if s.GetFn == nil {
		unexpected("Get")
	}
	return s.GetFn(ctx, id)
}

func (s *JobService) List(ctx context.Context, opts delegate.ListOptions) (*delegate.JobPage, error) {
	if s.ListFn == nil {
		unexpected("List")
	}
	return s.ListFn(ctx, opts)
}

func (s *JobService) Wait(ctx context.Context, id string) (*delegate.Job, error) {
	if s.WaitFn == nil {
		unexpected("Wait")
	}
	return s.WaitFn(ctx, id)
}

func (s *JobService) Cancel(ctx context.Context, id string) (*delegate.Job, bool, error) {
	if s.CancelFn == nil {
		unexpected("Cancel")
	}
	return s.CancelFn(ctx, id)
}

func (s *JobService) Release(ctx context.Context, id string) (*delegate.Job, bool, error) {
	if s.ReleaseFn == nil {
		unexpected("Release")
	}
	return s.ReleaseFn(ctx, id)
}

func (s *JobService) Result(ctx context.Context, id string, opts delegate.ResultOptions) (*delegate.JobResult, error) {
	if s.ResultFn == nil {
		unexpected("Result")
	}
	return s.ResultFn(ctx, id, opts)
}

func (s *JobService) Logs(ctx context.Context, id string, opts delegate.LogOptions) (*delegate.LogPage, error) {
	if s.LogsFn == nil {
		unexpected("Logs")
	}
	return s.LogsFn(ctx, id, opts)
}

func (s *JobService) Timeline(ctx context.Context, id string) ([]delegate.Event, error) {
	if s.TimelineFn == nil {
		unexpected("Timeline")
	}
	return s.TimelineFn(ctx, id)
}

func (s *JobService) Artifacts(ctx context.Context, id string) ([]delegate.Artifact, error) {
	if s.ArtifactsFn == nil {
		unexpected("Artifacts")
	}
	return s.ArtifactsFn(ctx, id)
}

func (s *JobService) ReadArtifact(ctx context.Context, id, name string) (delegate.Artifact, []byte, error) {
	if s.ReadArtifactFn == nil {
		unexpected("ReadArtifact")
	}
	return s.ReadArtifactFn(ctx, id, name)
}

func (s *JobService) Watch(ctx context.Context) <-chan string {
	if s.WatchFn == nil {
		unexpected("Watch")
	}
	return s.WatchFn(ctx)
}
