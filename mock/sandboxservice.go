package mock

import (
	"context"
	"io/fs"

	"github.com/delegate-dev/delegate"
)

// SandboxService is a delegate.SandboxService whose every method calls the
// function field of the same name with Fn appended, as JobService does.
// Calling a method whose function is not set panics: the test did not
// expect it. An adapter reaches it by type assertion on the service it is
// given (the engine implements both): embed JobService and SandboxService
// in one struct to stand in for it.
type SandboxService struct {
	OpenSandboxFn      func(ctx context.Context, spec delegate.SandboxSpec) (*delegate.Sandbox, error)
	GetSandboxFn       func(ctx context.Context, id string) (*delegate.Sandbox, error)
	ListSandboxesFn    func(ctx context.Context, opts delegate.SandboxListOptions) ([]delegate.Sandbox, error)
	ReleaseSandboxFn   func(ctx context.Context, id string) (*delegate.Sandbox, bool, error)
	ReadSandboxFileFn  func(ctx context.Context, id, path string, offset, length int64) (*delegate.FileContent, error)
	WriteSandboxFileFn func(ctx context.Context, id, path string, data []byte, mode fs.FileMode) error
	ListSandboxFilesFn func(ctx context.Context, id string, opts delegate.FileListOptions) (*delegate.FileListing, error)
}

var _ delegate.SandboxService = (*SandboxService)(nil)

func unexpectedSandbox(method string) {
	panic("mock.SandboxService: unexpected call to " + method + " (set " + method + "Fn)")
}

func (s *SandboxService) OpenSandbox(ctx context.Context, spec delegate.SandboxSpec) (*delegate.Sandbox, error) {
	if s.OpenSandboxFn == nil {
		unexpectedSandbox("OpenSandbox")
	}
	return s.OpenSandboxFn(ctx, spec)
}

func (s *SandboxService) GetSandbox(ctx context.Context, id string) (*delegate.Sandbox, error) {
	if s.GetSandboxFn == nil {
		unexpectedSandbox("GetSandbox")
	}
	return s.GetSandboxFn(ctx, id)
}

func (s *SandboxService) ListSandboxes(ctx context.Context, opts delegate.SandboxListOptions) ([]delegate.Sandbox, error) {
	if s.ListSandboxesFn == nil {
		unexpectedSandbox("ListSandboxes")
	}
	return s.ListSandboxesFn(ctx, opts)
}

func (s *SandboxService) ReleaseSandbox(ctx context.Context, id string) (*delegate.Sandbox, bool, error) {
	if s.ReleaseSandboxFn == nil {
		unexpectedSandbox("ReleaseSandbox")
	}
	return s.ReleaseSandboxFn(ctx, id)
}

func (s *SandboxService) ReadSandboxFile(ctx context.Context, id, path string, offset, length int64) (*delegate.FileContent, error) {
	if s.ReadSandboxFileFn == nil {
		unexpectedSandbox("ReadSandboxFile")
	}
	return s.ReadSandboxFileFn(ctx, id, path, offset, length)
}

func (s *SandboxService) WriteSandboxFile(ctx context.Context, id, path string, data []byte, mode fs.FileMode) error {
	if s.WriteSandboxFileFn == nil {
		unexpectedSandbox("WriteSandboxFile")
	}
	return s.WriteSandboxFileFn(ctx, id, path, data, mode)
}

func (s *SandboxService) ListSandboxFiles(ctx context.Context, id string, opts delegate.FileListOptions) (*delegate.FileListing, error) {
	if s.ListSandboxFilesFn == nil {
		unexpectedSandbox("ListSandboxFiles")
	}
	return s.ListSandboxFilesFn(ctx, id, opts)
}
