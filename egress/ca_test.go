package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"strings"
	"testing"
	"time"
)

func TestCAIssuesForItsHostsOnly(t *testing.T) {
	ca, err := NewCA([]string{"API.test", "other.test", "api.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ca.Hosts(), ","); got != "api.test,other.test" {
		t.Errorf("hosts %q", got)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca.CertPEM()) {
		t.Fatal("CertPEM is not a PEM certificate")
	}
	leaf, err := ca.leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.test", Roots: roots}); err != nil {
		t.Errorf("the leaf does not verify: %v", err)
	}
	if again, _ := ca.leaf("api.test"); again != leaf {
		t.Error("the leaf is made again at each connection")
	}
	if _, err := ca.leaf("evil.test"); err == nil {
		t.Error("a leaf for a host the CA does not cover")
	}
}

// Even with the CA's key, no certificate for another name or for an
// address verifies: the name constraints are in the CA certificate, and
// clients enforce them.
func TestCANameConstraints(t *testing.T) {
	ca, err := NewCA([]string{"api.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	forge := func(dns []string, ips []net.IP) *x509.Certificate {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: randSerial(), Subject: pkix.Name{CommonName: "forged"},
			DNSNames: dns, IPAddresses: ips, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return c
	}
	tests := []struct {
		name   string
		cert   *x509.Certificate
		verify string
		ok     bool
	}{
		{"the host", forge([]string{"api.test"}, nil), "api.test", true},
		{"another host", forge([]string{"evil.test"}, nil), "evil.test", false},
		{"another host beside the host", forge([]string{"api.test", "evil.test"}, nil), "evil.test", false},
		{"an address", forge(nil, []net.IP{net.ParseIP("203.0.113.10")}), "203.0.113.10", false},
	}
	for _, tt := range tests {
		_, err := tt.cert.Verify(x509.VerifyOptions{DNSName: tt.verify, Roots: roots})
		if (err == nil) != tt.ok {
			t.Errorf("%s: Verify = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

func TestCARoundTripAndDestroy(t *testing.T) {
	ca, err := NewCA([]string{"api.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	data, err := ca.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseCA(data)
	if err != nil {
		t.Fatal(err)
	}
	if string(back.CertPEM()) != string(ca.CertPEM()) || back.Hosts()[0] != "api.test" {
		t.Error("ParseCA does not give the same CA")
	}
	leaf, err := back.leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.test", Roots: roots}); err != nil {
		t.Errorf("a leaf of the restored CA does not verify against the original: %v", err)
	}
	ca.Destroy()
	if _, err := ca.leaf("api.test"); err == nil {
		t.Error("a destroyed CA still issues")
	}
	if _, err := ca.MarshalPEM(); err == nil {
		t.Error("a destroyed CA still gives its key")
	}
	for _, bad := range []struct{ hosts []string }{{nil}, {[]string{"*.api.test"}}, {[]string{"a..b"}}} {
		if _, err := NewCA(bad.hosts, time.Hour); err == nil {
			t.Errorf("NewCA(%q) accepted", bad.hosts)
		}
	}
	if _, err := ParseCA(ca.CertPEM()); err == nil {
		t.Error("ParseCA without a key accepted")
	}
}
