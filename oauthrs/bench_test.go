package oauthrs_test

import (
	"context"
	"testing"

	"github.com/delegate-dev/delegate/oauthrs"
	"github.com/delegate-dev/delegate/oauthrs/oauthtest"
)

// BenchmarkAuthenticate: what checking an issuer's access token costs a
// request once the keys are cached (an RS256 signature and the claims),
// beside the cost of refusing an opaque token (parsing only) as the
// baseline. The Guard pays it on each request and each second for each
// credential in use.
func BenchmarkAuthenticate(b *testing.B) {
	op := oauthtest.Start(b)
	op.AddClient("agent", "s", oauthtest.Client{Audience: []string{resource}})
	v, err := oauthrs.New(oauthrs.Config{Issuers: []string{op.Issuer}, Resource: resource})
	if err != nil {
		b.Fatal(err)
	}
	token := op.Token(b, "agent", "s", "delegate:jobs")
	ctx := context.Background()
	if _, err := v.Authenticate(ctx, token); err != nil {
		b.Fatal(err)
	}
	b.Run("valid", func(b *testing.B) {
		for b.Loop() {
			if _, err := v.Authenticate(ctx, token); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("opaque", func(b *testing.B) {
		for b.Loop() {
			if _, err := v.Authenticate(ctx, "2YotnFZFEjr1zCsicMWpAA"); err == nil {
				b.Fatal("accepted")
			}
		}
	})
}
