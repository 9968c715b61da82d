package httpauth

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const secret = "0123456789abcdef-test-token"

func mustNew(t *testing.T, token string) *Token {
	t.Helper()
	tok, err := New(token)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestNewRefusesWeakTokens(t *testing.T) {
	for _, tc := range []struct {
		token, want string
	}{
		{"", "at least 16"},
		{"short", "at least 16"},
		{"0123456789abcde", "at least 16"},
		{"0123456789 abcdef", "spaces"},
		{"0123456789abcdef\n", "spaces"},
		{"0123456789abcdef\x00", "control"},
	} {
		_, err := New(tc.token)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%q) = %v, want an error about %q", tc.token, err, tc.want)
		}
	}
	if _, err := New(secret); err != nil {
		t.Errorf("New(%q): %v", secret, err)
	}
}

func TestBearer(t *testing.T) {
	tok := mustNew(t, secret)
	for _, tc := range []struct {
		header string
		want   bool
	}{
		{"Bearer " + secret, true},
		{"bearer " + secret, true}, // the scheme is case-insensitive (RFC 9110)
		{"Bearer  " + secret + " ", true},
		{"", false},
		{secret, false},
		{"Basic " + secret, false},
		{"Bearer " + secret + "x", false},
		{"Bearer " + secret[:len(secret)-1], false},
		{"Bearer", false},
	} {
		r := httptest.NewRequest("GET", "/mcp", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		if got := tok.Bearer(r); got != tc.want {
			t.Errorf("Authorization %q: Bearer = %v, want %v", tc.header, got, tc.want)
		}
	}
}

func TestRequire(t *testing.T) {
	tok := mustNew(t, secret)
	h := tok.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("inside")) }))
	for _, tc := range []struct {
		header, challenge string
		code              int
	}{
		{"", `Bearer realm="delegate"`, 401},
		{"Bearer wrong-token-wrong-token", `Bearer realm="delegate", error="invalid_token"`, 401},
		{"Bearer " + secret, "", 200},
	} {
		r := httptest.NewRequest("POST", "/mcp", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code || w.Header().Get("WWW-Authenticate") != tc.challenge {
			t.Errorf("%q: %d WWW-Authenticate %q, want %d %q", tc.header, w.Code, w.Header().Get("WWW-Authenticate"), tc.code, tc.challenge)
		}
		if (w.Code == 200) != strings.Contains(w.Body.String(), "inside") {
			t.Errorf("%q: body %q", tc.header, w.Body)
		}
	}
	// A nil token guards nothing.
	var none *Token
	w := httptest.NewRecorder()
	none.Require(h).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != 401 { // h itself still requires tok
		t.Errorf("nil.Require wrapped h: %d", w.Code)
	}
	w = httptest.NewRecorder()
	none.Require(http.NotFoundHandler()).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != 404 {
		t.Errorf("nil.Require: %d, want the handler's own 404", w.Code)
	}
}

// sessionCookie signs in and returns the cookie that was set.
func sessionCookie(t *testing.T, tok *Token, r *http.Request) *http.Cookie {
	t.Helper()
	w := httptest.NewRecorder()
	tok.StartSession(w, r)
	cookies := w.Result().Cookies()
	if len(cookies) != 1 {
		t.Fatalf("StartSession set %d cookies", len(cookies))
	}
	return cookies[0]
}

func TestSessionCookie(t *testing.T) {
	tok := mustNew(t, secret)
	issued := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	now := issued
	tok.now = func() time.Time { return now }
	c := sessionCookie(t, tok, httptest.NewRequest("POST", "/login", nil))
	if c.Name != CookieName || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.Secure {
		t.Errorf("cookie attributes: %+v", c)
	}
	if strings.Contains(c.Value, secret) {
		t.Errorf("the cookie carries the token itself: %q", c.Value)
	}
	withCookie := func(v string) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.AddCookie(&http.Cookie{Name: CookieName, Value: v})
		return r
	}
	if !tok.Session(withCookie(c.Value)) || !tok.Allowed(withCookie(c.Value)) {
		t.Fatal("the cookie just issued is refused")
	}
	parts := strings.Split(c.Value, ".")
	forged := []string{
		"",
		"v1",
		parts[0] + "." + parts[1] + ".AAAA",
		parts[0] + "." + "9999999999" + "." + parts[2], // a later expiry with the old MAC
		"v2." + parts[1] + "." + parts[2],
		c.Value + ".x",
	}
	for _, v := range forged {
		if tok.Session(withCookie(v)) {
			t.Errorf("forged session %q accepted", v)
		}
	}
	// Another token's sessions are not this one's.
	other := mustNew(t, secret+"-other")
	other.now = tok.now
	if other.Session(withCookie(c.Value)) {
		t.Error("a session of another token is accepted")
	}
	// Sessions expire.
	now = now.Add(DefaultSessionAge - time.Second)
	if !tok.Session(withCookie(c.Value)) {
		t.Error("session refused before it expires")
	}
	now = now.Add(2 * time.Second)
	if tok.Session(withCookie(c.Value)) {
		t.Error("expired session accepted")
	}
	// A shorter session age refuses cookies issued under the longer one.
	now = issued.Add(time.Minute)
	tok.SessionAge = time.Hour
	if tok.Session(withCookie(c.Value)) {
		t.Error("a session longer than SessionAge is accepted")
	}
}

func TestSessionCookieSecureOverTLS(t *testing.T) {
	tok := mustNew(t, secret)
	r := httptest.NewRequest("POST", "https://example.test/login", nil)
	r.TLS = &tls.ConnectionState{}
	if c := sessionCookie(t, tok, r); !c.Secure {
		t.Errorf("cookie over TLS is not Secure: %+v", c)
	}
	w := httptest.NewRecorder()
	EndSession(w, r)
	c := w.Result().Cookies()[0]
	if c.MaxAge >= 0 || c.Value != "" || !c.Secure {
		t.Errorf("EndSession cookie: %+v", c)
	}
}

func TestAllowed(t *testing.T) {
	tok := mustNew(t, secret)
	r := httptest.NewRequest("GET", "/", nil)
	if tok.Allowed(r) {
		t.Error("a request with nothing is allowed")
	}
	r.Header.Set("Authorization", "Bearer "+secret)
	if !tok.Allowed(r) {
		t.Error("a request with the bearer token is refused")
	}
	var none *Token
	if !none.Allowed(httptest.NewRequest("GET", "/", nil)) || !none.Session(httptest.NewRequest("GET", "/", nil)) {
		t.Error("a nil token refuses requests")
	}
}
