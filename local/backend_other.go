//go:build !linux

package local

import (
	"context"
	"errors"
	"runtime"

	"github.com/delegate-dev/delegate/sandbox"
)

// errUnsupported: the backend is built on Linux namespaces and cgroups.
var errUnsupported = errors.New("the local backend runs on Linux only (this is " + runtime.GOOS + "); use DELEGATE_BACKEND=proxmox")

// Backend is unavailable on this system; New always fails.
type Backend struct{}

var _ sandbox.Backend = (*Backend)(nil)

// New reports that the backend cannot run here.
func New(cfg Config) (*Backend, error) { return nil, errUnsupported }

// Check reports that the backend cannot run here.
func (b *Backend) Check() error { return errUnsupported }

// CheckTemplate reports that the backend cannot run here.
func (b *Backend) CheckTemplate(ctx context.Context, name string) error { return errUnsupported }

func (b *Backend) Name() string                       { return "local" }
func (b *Backend) Capabilities() sandbox.Capabilities { return sandbox.Capabilities{} }
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Instance, error) {
	return nil, errUnsupported
}
func (b *Backend) Recover(ctx context.Context, id string) (sandbox.Instance, error) {
	return nil, errUnsupported
}
func (b *Backend) List(ctx context.Context) ([]sandbox.Info, error) { return nil, errUnsupported }
func (b *Backend) Destroy(ctx context.Context, id string) error     { return errUnsupported }
func (b *Backend) Close() error                                     { return nil }
func runShim(args []string) int                                     { return 2 }
func runInit(args []string) int                                     { return 2 }
func runExec() int                                                  { return 2 }
func runExtract(args []string) int                                  { return 2 }
func runUsernsHold() int                                            { return 2 }
