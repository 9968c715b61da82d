package mock

import (
	"context"

	"github.com/delegate-dev/delegate"
)

// NetworkService is a delegate.NetworkService whose methods call the
// function fields of the same names (Fn appended); an unset one panics.
type NetworkService struct {
	NetworkFn      func(ctx context.Context, id string, opts delegate.NetworkLogOptions) (*delegate.NetworkReport, error)
	AllowNetworkFn func(ctx context.Context, id string, rules []string, by string) (*delegate.NetworkReport, error)
}

var _ delegate.NetworkService = (*NetworkService)(nil)

func (s *NetworkService) Network(ctx context.Context, id string, opts delegate.NetworkLogOptions) (*delegate.NetworkReport, error) {
	if s.NetworkFn == nil {
		panic("mock.NetworkService: unexpected call to Network (set NetworkFn)")
	}
	return s.NetworkFn(ctx, id, opts)
}

func (s *NetworkService) AllowNetwork(ctx context.Context, id string, rules []string, by string) (*delegate.NetworkReport, error) {
	if s.AllowNetworkFn == nil {
		panic("mock.NetworkService: unexpected call to AllowNetwork (set AllowNetworkFn)")
	}
	return s.AllowNetworkFn(ctx, id, rules, by)
}
