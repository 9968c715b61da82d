package oauthrs

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// jwks serves a key set that the test changes, counting fetches.
type jwks struct {
	mu      sync.Mutex
	keys    []jose.JSONWebKey
	fetches int
}

func (j *jwks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.fetches++
	json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: j.keys})
}

func (j *jwks) set(keys ...jose.JSONWebKey) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.keys = keys
}

func (j *jwks) count() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.fetches
}

// signingKey is a new ES256 key named kid, and its public half.
func signingKey(t *testing.T, kid string) (jose.JSONWebKey, jose.JSONWebKey) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	priv := jose.JSONWebKey{Key: k, KeyID: kid, Algorithm: string(jose.ES256), Use: "sig"}
	return priv, priv.Public()
}

func sign(t *testing.T, key jose.JSONWebKey, payload string) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := s.Sign([]byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestKeyRotation: keys are cached; a token signed with a key the
// issuer has just added is refused while the last fetch is recent, and
// accepted once minRefresh has passed (one fetch more); a key the issuer
// withdrew stops verifying after maxKeyAge; keys meant for encryption
// are not used to verify.
func TestKeyRotation(t *testing.T) {
	set := &jwks{}
	srv := httptest.NewServer(set)
	defer srv.Close()
	now := time.Unix(1_800_000_000, 0)
	ks := &keySet{url: srv.URL, client: srv.Client(), now: func() time.Time { return now }}
	privA, pubA := signingKey(t, "a")
	privB, pubB := signingKey(t, "b")
	set.set(pubA)
	ctx := context.Background()
	verify := func(tok string) error { _, err := ks.VerifySignature(ctx, tok); return err }

	tokA, tokB := sign(t, privA, `{"n":1}`), sign(t, privB, `{"n":2}`)
	if err := verify(tokA); err != nil || set.count() != 1 {
		t.Fatalf("key a: %v after %d fetches", err, set.count())
	}
	set.set(pubA, pubB) // the issuer adds b
	now = now.Add(minRefresh / 2)
	if err := verify(tokB); err == nil || !strings.Contains(err.Error(), `publishes no key "b"`) || set.count() != 1 {
		t.Fatalf("key b moments after a fetch: %v after %d fetches", err, set.count())
	}
	now = now.Add(minRefresh)
	if err := verify(tokB); err != nil || set.count() != 2 {
		t.Fatalf("key b after minRefresh: %v after %d fetches", err, set.count())
	}
	set.set(pubB) // the issuer withdraws a
	if err := verify(tokA); err != nil || set.count() != 2 {
		t.Fatalf("key a, cached: %v after %d fetches", err, set.count())
	}
	now = now.Add(maxKeyAge + time.Second)
	if err := verify(tokA); err == nil || set.count() != 3 {
		t.Fatalf("key a, withdrawn an hour ago: %v after %d fetches", err, set.count())
	}
	// A key for encryption only is not a signing key.
	privC, pubC := signingKey(t, "c")
	pubC.Use = "enc"
	set.set(pubB, pubC)
	now = now.Add(minRefresh + time.Second)
	if err := verify(sign(t, privC, `{"n":3}`)); err == nil {
		t.Fatal("a token verified with an encryption key")
	}
}
