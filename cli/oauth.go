package cli

import (
	"strings"

	"github.com/delegate-dev/delegate/oauthrs"
)

// loadOAuth reads the settings of an external issuer whose access tokens
// `serve --http` accepts (oauthrs): DELEGATE_OAUTH_ISSUERS
// (comma-separated), DELEGATE_OAUTH_RESOURCE and DELEGATE_OAUTH_NAME_CLAIM.
// None set: no issuer. Any set: all are checked together, each mistake
// named.
func (c *Config) loadOAuth(getenv func(string) string, errs *[]string) {
	issuers, resource, claim := getenv(oauthrs.EnvIssuers), getenv(oauthrs.EnvResource), getenv(oauthrs.EnvNameClaim)
	if issuers == "" && resource == "" && claim == "" {
		return
	}
	for _, iss := range strings.Split(issuers, ",") {
		if iss = strings.TrimSpace(iss); iss != "" {
			c.OAuth.Issuers = append(c.OAuth.Issuers, iss)
		}
	}
	c.OAuth.Resource, c.OAuth.NameClaim = resource, claim
	if err := c.OAuth.Check(); err != nil {
		*errs = append(*errs, strings.Split(err.Error(), "\n")...)
	}
}

// OAuthVerifier is the verifier of the configured issuer's tokens, or nil
// when none is configured.
func (c *Config) OAuthVerifier() (*oauthrs.Verifier, error) {
	if len(c.OAuth.Issuers) == 0 {
		return nil, nil
	}
	return oauthrs.New(c.OAuth)
}
