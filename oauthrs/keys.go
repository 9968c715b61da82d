package oauthrs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	jose "github.com/go-jose/go-jose/v4"
)

// Key refresh: the issuer's keys are fetched at the first token, again
// when a token names a key not among them (the issuer rotated its keys),
// but not more often than minRefresh (a stream of tokens naming made-up
// keys does not become a stream of requests to the issuer), and again
// once they are maxKeyAge old (a key the issuer withdrew stops being
// trusted).
const (
	minRefresh = 10 * time.Second
	maxKeyAge  = time.Hour
	// maxJWKS bounds the key set document read.
	maxJWKS = 1 << 20
)

// keySet is an issuer's published keys (its JWKS), cached. It implements
// oidc.KeySet.
type keySet struct {
	url    string
	client *http.Client
	now    func() time.Time

	mu      sync.Mutex
	keys    []jose.JSONWebKey
	fetched time.Time // when keys were fetched; zero: never
	tried   time.Time // the last fetch, done or failed
	failure error     // why the last fetch failed
}

// VerifySignature checks jwt's signature with the key it names (or each
// key, when it names none) and returns its payload.
func (k *keySet) VerifySignature(ctx context.Context, jwt string) ([]byte, error) {
	jws, err := jose.ParseSigned(jwt, signingAlgs)
	if err != nil {
		return nil, err
	}
	kid := jws.Signatures[0].Header.KeyID
	keys, err := k.current(ctx, false)
	if err != nil {
		return nil, err
	}
	if payload, ok := verifyWith(jws, keys, kid); ok {
		return payload, nil
	}
	if keys, err = k.current(ctx, true); err != nil {
		return nil, err
	}
	if payload, ok := verifyWith(jws, keys, kid); ok {
		return payload, nil
	}
	if kid != "" && !hasKey(keys, kid) {
		return nil, fmt.Errorf("the issuer publishes no key %q at %s", kid, k.url)
	}
	return nil, errors.New("no key the issuer publishes verifies it")
}

func verifyWith(jws *jose.JSONWebSignature, keys []jose.JSONWebKey, kid string) ([]byte, bool) {
	for i := range keys {
		if kid != "" && keys[i].KeyID != kid {
			continue
		}
		if payload, err := jws.Verify(&keys[i]); err == nil {
			return payload, true
		}
	}
	return nil, false
}

func hasKey(keys []jose.JSONWebKey, kid string) bool {
	for _, key := range keys {
		if key.KeyID == kid {
			return true
		}
	}
	return false
}

// current is the keys, fetched when there are none yet, when they are
// too old, or when refresh asks and the last fetch is minRefresh ago.
func (k *keySet) current(ctx context.Context, refresh bool) ([]jose.JSONWebKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	fresh := !k.fetched.IsZero() && now.Sub(k.fetched) <= maxKeyAge
	recent := now.Sub(k.tried) < minRefresh
	switch {
	case fresh && (!refresh || recent):
		return k.keys, nil
	case recent:
		return nil, unreachable(k.url, k.failure)
	}
	k.tried = now
	keys, err := k.fetch(ctx)
	if err != nil {
		k.failure = err
		if fresh {
			return k.keys, nil // keep what there is while the issuer is away
		}
		return nil, unreachable(k.url, err)
	}
	k.keys, k.fetched, k.failure = keys, now, nil
	return keys, nil
}

func unreachable(url string, err error) error {
	return &TokenError{kind: delegate.ErrUnavailable,
		Reason: fmt.Sprintf("the issuer's keys could not be fetched from %s to check the token: %v; try again later", url, err)}
}

// fetch reads the key set, keeping the signing keys go-jose understands
// and skipping the others (RFC 7517: a key of an unknown type is ignored).
func (k *keySet) fetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKS+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxJWKS {
		return nil, fmt.Errorf("the key set is larger than %d bytes", maxJWKS)
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		return nil, fmt.Errorf("the key set is not JSON: %w", err)
	}
	var keys []jose.JSONWebKey
	for _, raw := range set.Keys {
		var key jose.JSONWebKey
		if json.Unmarshal(raw, &key) != nil || !key.Valid() || !key.IsPublic() || key.Use == "enc" {
			continue
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, errors.New("the key set has no signing key delegate can use")
	}
	return keys, nil
}
