package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// ServeCallback forwards every connection on ln, a listener in token's
// sandbox, to the server's callback address (Config.Callback), whatever
// the job's allowlist says (a job with no network at all gets nothing).
// The job's callback URL names ln's address; the bytes are not looked at.
func (p *Proxy) ServeCallback(ctx context.Context, ln net.Listener, token string) error {
	if token == "" {
		return fmt.Errorf("%w: a callback listener belongs to one job: give its token", ErrInvalid)
	}
	if !p.guard.callback.IsValid() {
		return fmt.Errorf("%w: no Config.Callback to forward to", ErrInvalid)
	}
	cb := p.guard.callback
	return p.serve(ctx, ln, token, ViaCallback, func(ctx context.Context, c net.Conn) {
		untrack := p.conns.add(token, c)
		defer untrack()
		e := Entry{Time: time.Now(), Via: ViaCallback, Addr: cb.Addr(), Port: cb.Port()}
		pol, err := p.cfg.Policies.Policy(ctx, token)
		switch {
		case err != nil:
			e.Rule, e.Err = "error", err.Error()
		case pol.Mode == None:
			e.Rule = "network none"
		default:
			e.Allowed, e.Rule = true, "callback "+cb.String()
		}
		if !e.Allowed {
			p.record(token, e)
			return
		}
		up, _, err := p.out.dial(ctx, []netip.Addr{cb.Addr()}, cb.Port())
		if err != nil {
			e.Err = err.Error()
			p.record(token, e)
			return
		}
		defer up.Close()
		e.Sent, e.Received, err = pipe(c, nil, up, p.cfg.IdleTimeout)
		if err != nil {
			e.Err = err.Error()
		}
		e.Duration = time.Since(e.Time)
		p.record(token, e)
	})
}
