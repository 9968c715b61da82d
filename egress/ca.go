package egress

import (
	"cmp"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strings"
	"sync"
	"time"
)

// CA is one job's certificate authority, which the proxy uses to stand in
// for the hosts it injects credentials for. Its certificate goes into that
// job's sandbox trust bundle only (SSL_CERT_FILE, NODE_EXTRA_CA_CERTS,
// REQUESTS_CA_BUNDLE, GIT_SSL_CAINFO), and it is name-constrained to the
// injected hosts: even a stolen key could not vouch for any other name, nor
// for any IP address. Make one per job (NewCA) and Destroy it with the job.
type CA struct {
	hosts    []string
	cert     *x509.Certificate
	certPEM  []byte
	notAfter time.Time

	mu      sync.Mutex
	key     *ecdsa.PrivateKey // nil once destroyed
	leafKey *ecdsa.PrivateKey
	leaves  map[string]*tls.Certificate
}

// errDestroyed: the job is over.
var errDestroyed = errors.New("the job's CA was destroyed")

// clockSkew: a VM's clock may lag the server's; certificates start earlier
// by this much.
const clockSkew = time.Hour

// NewCA makes a job's CA for the injected hosts, valid for validFor (the
// job's timeout with a margin).
func NewCA(hosts []string, validFor time.Duration) (*CA, error) {
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%w: a CA needs at least one host", ErrInvalid)
	}
	if validFor <= 0 {
		return nil, fmt.Errorf("%w: a CA's validity must be positive (got %s)", ErrInvalid, validFor)
	}
	hs := make([]string, 0, len(hosts))
	for _, h := range hosts {
		n, reason := normalizeName(h)
		if reason != "" || strings.Contains(h, "*") {
			return nil, fmt.Errorf("%w: CA host %q: %s", ErrInvalid, h, cmp.Or(reason, "no wildcard"))
		}
		if !slices.Contains(hs, n) {
			hs = append(hs, n)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(),
		Subject:               pkix.Name{Organization: []string{"delegate"}, CommonName: "delegate job CA for " + strings.Join(hs, ", ")},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		// A name constraint on each host (and its subdomains, as RFC 5280
		// has it), marked critical so that a client that does not
		// understand it refuses the CA rather than trusting it for all.
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         hs,
		ExcludedIPRanges: []*net.IPNet{
			{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)},
			{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
		},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	return newCA(der, key)
}

func newCA(der []byte, key *ecdsa.PrivateKey) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA || !cert.PermittedDNSDomainsCritical || len(cert.PermittedDNSDomains) == 0 {
		return nil, fmt.Errorf("%w: not a name-constrained CA certificate", ErrInvalid)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("leaf key: %w", err)
	}
	return &CA{
		hosts:    cert.PermittedDNSDomains,
		cert:     cert,
		certPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		notAfter: cert.NotAfter,
		key:      key,
		leafKey:  leafKey,
		leaves:   map[string]*tls.Certificate{},
	}, nil
}

// CertPEM is the CA's certificate, for the sandbox's trust bundle.
func (c *CA) CertPEM() []byte { return slices.Clone(c.certPEM) }

// Hosts are the names the CA may vouch for.
func (c *CA) Hosts() []string { return slices.Clone(c.hosts) }

// MarshalPEM returns the certificate and the private key, for a store that
// must bring a running job's CA back after a restart (the sandbox trusts
// this CA and no other). Keep it as private as the job's token.
func (c *CA) MarshalPEM() ([]byte, error) {
	c.mu.Lock()
	key := c.key
	c.mu.Unlock()
	if key == nil {
		return nil, errDestroyed
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return append(c.CertPEM(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})...), nil
}

// ParseCA reads what MarshalPEM wrote.
func ParseCA(data []byte) (*CA, error) {
	var certDER []byte
	var key *ecdsa.PrivateKey
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		switch b.Type {
		case "CERTIFICATE":
			certDER = b.Bytes
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("CA key: %w", err)
			}
			ek, ok := k.(*ecdsa.PrivateKey)
			if !ok {
				return nil, fmt.Errorf("%w: CA key is %T, not ECDSA", ErrInvalid, k)
			}
			key = ek
		}
	}
	if certDER == nil || key == nil {
		return nil, fmt.Errorf("%w: a CA needs a CERTIFICATE and a PRIVATE KEY block", ErrInvalid)
	}
	return newCA(certDER, key)
}

// Destroy forgets the CA's keys and certificates: nothing is issued after
// it. (Go cannot promise to wipe memory; the keys become garbage.)
func (c *CA) Destroy() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.key, c.leafKey, c.leaves = nil, nil, nil
}

// covers says whether host is one of the CA's names.
func (c *CA) covers(host string) bool {
	return slices.Contains(c.hosts, host)
}

// leaf returns the certificate the proxy shows the job for host.
func (c *CA) leaf(host string) (*tls.Certificate, error) {
	if !c.covers(host) {
		return nil, fmt.Errorf("the job's CA does not cover %s", host)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.key == nil {
		return nil, errDestroyed
	}
	if l, ok := c.leaves[host]; ok {
		return l, nil
	}
	tmpl := &x509.Certificate{
		SerialNumber: randSerial(),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    time.Now().Add(-clockSkew),
		NotAfter:     c.notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, c.leafKey.Public(), c.key)
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	l := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: c.leafKey, Leaf: leaf}
	c.leaves[host] = l
	return l, nil
}

func randSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux; nothing to go on with
	}
	return n
}
