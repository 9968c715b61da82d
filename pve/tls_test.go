package pve

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

func TestTLSModes(t *testing.T) {
	var conns atomic.Int32
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reply(w, map[string]any{"version": "9.1.1", "release": "9.1"})
	}))
	ts.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	ts.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	ts.StartTLS()
	defer ts.Close()
	host, port, _ := net.SplitHostPort(ts.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	sum := sha256.Sum256(ts.Certificate().Raw)
	pin := formatFingerprint(sum[:])
	wrongPin := strings.Repeat("00:", 31) + "00"
	caFile := filepath.Join(t.TempDir(), "pve-root-ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}), 0o600)

	tests := []struct {
		name  string
		host  string // default the server's address
		mode  SSLMode
		ca    string
		pin   string
		check func(error) bool // nil: must succeed
	}{
		{name: "default is strict: a self-signed cert fails", check: isCertError},
		{name: "strict", mode: SSLStrict, check: isCertError},
		{name: "verify, pinned", mode: SSLVerify, pin: pin},
		{name: "verify, pin without colons, lower case", mode: SSLVerify, pin: strings.ToLower(strings.ReplaceAll(pin, ":", ""))},
		{name: "verify, wrong pin", mode: SSLVerify, pin: wrongPin, check: func(err error) bool {
			var fp *FingerprintMismatchError
			return errors.As(err, &fp) && fp.Got == pin
		}},
		{name: "verify, CA file", mode: SSLVerify, ca: caFile},
		{name: "verify, CA file, wrong name", mode: SSLVerify, ca: caFile, host: "localhost", check: isCertError},
		{name: "verify, pinned, wrong name is fine", mode: SSLVerify, pin: pin, host: "localhost"},
		{name: "verify, CA file and wrong pin", mode: SSLVerify, ca: caFile, pin: wrongPin, check: func(err error) bool {
			var fp *FingerprintMismatchError
			return errors.As(err, &fp)
		}},
		{name: "insecure", mode: SSLInsecure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := host
			if tt.host != "" {
				h = tt.host
			}
			c, err := New(Config{Host: h, Port: p, User: testUser, TokenName: testToken, TokenValue: testSecret,
				SSLMode: tt.mode, CAFile: tt.ca, Fingerprint: tt.pin, RetryDelay: 1, RateLimit: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			before := conns.Load()
			v, err := c.Version(context.Background())
			if tt.check == nil {
				if err != nil || v.Version != "9.1.1" {
					t.Fatalf("%+v %v", v, err)
				}
				return
			}
			if err == nil || !tt.check(err) {
				t.Fatalf("err = %v", err)
			}
			// A refused certificate is not retried.
			if n := conns.Load() - before; n != 1 {
				t.Errorf("%d connections", n)
			}
		})
	}
}

func isCertError(err error) bool {
	var cv *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	return errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &hn)
}
