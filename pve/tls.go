package pve

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// parseFingerprint reads a SHA-256 fingerprint written as hex, with or
// without colons, in either case.
func parseFingerprint(s string) ([]byte, error) {
	h := strings.NewReplacer(":", "", " ", "").Replace(strings.TrimSpace(s))
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != sha256.Size {
		return nil, fmt.Errorf("fingerprint %q is not a SHA-256 fingerprint (32 hex bytes)", s)
	}
	return b, nil
}

// FingerprintMismatchError: the server's certificate is not the pinned
// one.
type FingerprintMismatchError struct {
	Want, Got string
}

func (e *FingerprintMismatchError) Error() string {
	return fmt.Sprintf("server certificate fingerprint %s does not match the configured %s", e.Got, e.Want)
}

func formatFingerprint(sum []byte) string {
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02X", b)
	}
	return strings.Join(parts, ":")
}

// tlsConfig builds the client's TLS settings for the SSL mode.
func tlsConfig(c Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.Host}
	switch c.SSLMode {
	case SSLStrict:
		return tc, nil
	case SSLInsecure:
		tc.InsecureSkipVerify = true
		return tc, nil
	case SSLVerify:
	default:
		return nil, fmt.Errorf("ssl mode %q", c.SSLMode)
	}
	var pin []byte
	if c.Fingerprint != "" {
		var err error
		if pin, err = parseFingerprint(c.Fingerprint); err != nil {
			return nil, err
		}
	}
	var roots *x509.CertPool
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate in it", c.CAFile)
		}
		tc.RootCAs = roots
	}
	if pin == nil {
		return tc, nil // chain to the CA file, name checked
	}
	// Verification is done here: the pin, and the chain and name only
	// when a CA file is configured too.
	tc.InsecureSkipVerify = true
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("server sent no certificate")
		}
		leaf := cs.PeerCertificates[0]
		sum := sha256.Sum256(leaf.Raw)
		if !bytes.Equal(sum[:], pin) {
			return &FingerprintMismatchError{Want: formatFingerprint(pin), Got: formatFingerprint(sum[:])}
		}
		if roots == nil {
			return nil
		}
		inter := x509.NewCertPool()
		for _, ic := range cs.PeerCertificates[1:] {
			inter.AddCert(ic)
		}
		_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: c.Host})
		return err
	}
	return tc, nil
}
