package mcpserver

import (
	"context"
	"net/http"
	"strings"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/httpauth"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Every MCP request is its principal's: over HTTP the one the guard
// (httpauth) admitted it as, over stdio the local user. The SDK hands a
// request's HTTP context to no handler, only its token information, so
// the principal travels there (withTokenInfo) and the middleware puts it
// back in the context that the tools, resources and task methods see.

// Keys of auth.TokenInfo.Extra.
const (
	extraPrincipal  = "delegate.principal"
	extraCredential = "delegate.credential"
)

// withTokenInfo passes the principal that httpauth put in an HTTP
// request's context (and the context of its credential) on to the SDK,
// which gives it to every MCP request of that HTTP request, and binds a
// session to its principal's name: a session's later requests must come
// from the same one (the SDK refuses others with 403).
func withTokenInfo(next http.Handler) http.Handler {
	verify := func(ctx context.Context, _ string, _ *http.Request) (*auth.TokenInfo, error) {
		p := delegate.PrincipalOf(ctx)
		scopes := make([]string, len(p.Scopes))
		for i, s := range p.Scopes {
			scopes[i] = string(s)
		}
		return &auth.TokenInfo{UserID: p.Name, Scopes: scopes,
			Extra: map[string]any{extraPrincipal: p, extraCredential: httpauth.CredentialOf(ctx)}}, nil
	}
	withInfo := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if delegate.PrincipalOf(r.Context()) == nil || httpauth.BearerOf(r) == "" {
			next.ServeHTTP(w, r) // no guard, or an open one: the local user
			return
		}
		withInfo.ServeHTTP(w, r)
	})
}

// principals is the receiving middleware that puts each request's
// principal in its context, and closes a session when the credential it
// was opened with is revoked or expires (httpauth.Guard.Recheck). The
// registration lasts as long as the guard keeps the credential: a
// session idle longer has timed out already.
func principals(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		p := delegate.Local() // stdio, or HTTP without a guard
		if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
			// Credentials that name no principal of ours (a verifier
			// other than withTokenInfo's) get none of the local user's
			// rights: a principal of that name without scopes.
			p = &delegate.Principal{Name: extra.TokenInfo.UserID}
			if p.Name == "" {
				p.Name = "(unnamed credentials)"
			}
			if q, ok := extra.TokenInfo.Extra[extraPrincipal].(*delegate.Principal); ok && q != nil {
				p = q
			}
			cred, _ := extra.TokenInfo.Extra[extraCredential].(context.Context)
			if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss != nil && cred != nil && method == "initialize" {
				context.AfterFunc(cred, func() { ss.Close() })
			}
		}
		return next(delegate.WithPrincipal(ctx, p), method, req)
	}
}

// need refuses ctx's principal what needs scope s.
func need(ctx context.Context, s delegate.Scope, what string) error {
	return principalOf(ctx).Need(s, what)
}

// principalOf is ctx's principal: the local user when none is set (a
// server used in-process, as the tests and the bench do).
func principalOf(ctx context.Context) *delegate.Principal {
	if p := delegate.PrincipalOf(ctx); p != nil {
		return p
	}
	return delegate.Local()
}

// canSubscribe refuses a subscription to what ctx's principal cannot
// read (another's job or sandbox) as the read would: not found.
func canSubscribe(ctx context.Context, svc Services, uri string) error {
	if rest, ok := strings.CutPrefix(uri, "job://"); ok {
		id, _, _ := strings.Cut(rest, "/")
		_, err := svc.Jobs.Get(ctx, id)
		return subscribeError(uri, err)
	}
	if id, ok := strings.CutPrefix(uri, "sandbox://"); ok && svc.Sandboxes != nil {
		_, err := svc.Sandboxes.GetSandbox(ctx, id)
		return subscribeError(uri, err)
	}
	return mcp.ResourceNotFoundError(uri)
}

func subscribeError(uri string, err error) error {
	if err != nil && delegate.ErrorKind(err) == delegate.KindNotFound {
		return mcp.ResourceNotFoundError(uri)
	}
	return err
}
