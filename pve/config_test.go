package pve

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate/internal/testkit"
)

func TestConfigFromEnv(t *testing.T) {
	base := map[string]string{
		"PROXMOX_HOST":        "pve.example.com",
		"PROXMOX_USER":        "delegate@pve",
		"PROXMOX_TOKEN_NAME":  "ci",
		"PROXMOX_TOKEN_VALUE": "8d3f1c2e-0000-4000-8000-000000000000",
	}
	tests := []struct {
		name    string
		env     map[string]string // merged over base; "" deletes
		wantErr []string          // variables the error must name
		check   func(t *testing.T, c Config)
	}{
		{name: "minimal", check: func(t *testing.T, c Config) {
			if c.Host != "pve.example.com" || c.User != "delegate@pve" || c.TokenName != "ci" || c.SSLMode != "" {
				t.Errorf("%+v", c)
			}
			cc, err := c.withDefaults()
			if err != nil || cc.Port != 8006 || cc.SSLMode != SSLStrict || cc.RetryAttempts != 3 || cc.Timeout != 30*time.Second {
				t.Errorf("defaults: %+v %v", cc, err)
			}
		}},
		{name: "everything", env: map[string]string{
			"PROXMOX_PORT": "443", "PROXMOX_SSL_MODE": "verify", "PROXMOX_FINGERPRINT": strings.Repeat("ab:", 31) + "ab",
			"PROXMOX_TIMEOUT": "45s", "PROXMOX_RETRY_ATTEMPTS": "5", "PROXMOX_RETRY_DELAY": "0.5",
		}, check: func(t *testing.T, c Config) {
			if c.Port != 443 || c.SSLMode != SSLVerify || c.Timeout != 45*time.Second || c.RetryAttempts != 5 || c.RetryDelay != 500*time.Millisecond {
				t.Errorf("%+v", c)
			}
		}},
		{name: "no retries", env: map[string]string{"PROXMOX_RETRY_ATTEMPTS": "0"}, check: func(t *testing.T, c Config) {
			if cc, _ := c.withDefaults(); cc.RetryAttempts != 0 {
				t.Errorf("retries %d", cc.RetryAttempts)
			}
		}},
		{name: "load settings", env: map[string]string{"PROXMOX_RATE_LIMIT": "50", "PROXMOX_RATE_BURST": "80", "PROXMOX_NODE_CALLS": "3"},
			check: func(t *testing.T, c Config) {
				if cc, _ := c.withDefaults(); cc.RateLimit != 50 || cc.RateBurst != 80 || cc.NodeCalls != 3 {
					t.Errorf("%+v", cc)
				}
			}},
		{name: "load defaults", check: func(t *testing.T, c Config) {
			if cc, _ := c.withDefaults(); cc.RateLimit != 20 || cc.RateBurst != 40 || cc.NodeCalls != 2 {
				t.Errorf("%+v", cc)
			}
		}},
		{name: "no limits", env: map[string]string{"PROXMOX_RATE_LIMIT": "0", "PROXMOX_NODE_CALLS": "0"}, check: func(t *testing.T, c Config) {
			if cc, _ := c.withDefaults(); cc.RateLimit >= 0 || cc.NodeCalls >= 0 {
				t.Errorf("%+v", cc)
			}
		}},
		{name: "bad load settings", env: map[string]string{"PROXMOX_RATE_LIMIT": "fast", "PROXMOX_RATE_BURST": "0", "PROXMOX_NODE_CALLS": "-2"},
			wantErr: []string{"PROXMOX_RATE_LIMIT=", "PROXMOX_RATE_BURST=", "PROXMOX_NODE_CALLS="}},
		{name: "missing", env: map[string]string{"PROXMOX_HOST": "", "PROXMOX_TOKEN_VALUE": ""},
			wantErr: []string{"PROXMOX_HOST: must be set", "PROXMOX_TOKEN_VALUE: must be set"}},
		{name: "bad values", env: map[string]string{
			"PROXMOX_PORT": "80000", "PROXMOX_SSL_MODE": "loose", "PROXMOX_TIMEOUT": "soon",
			"PROXMOX_RETRY_ATTEMPTS": "-1", "PROXMOX_RETRY_DELAY": "-2s", "PROXMOX_FINGERPRINT": "12:34",
		}, wantErr: []string{"PROXMOX_PORT", "PROXMOX_SSL_MODE", "PROXMOX_TIMEOUT", "PROXMOX_RETRY_ATTEMPTS", "PROXMOX_RETRY_DELAY", "PROXMOX_FINGERPRINT"}},
		{name: "verify without CA or pin", env: map[string]string{"PROXMOX_SSL_MODE": "verify"}, wantErr: []string{"PROXMOX_SSL_MODE"}},
		{name: "user without realm", env: map[string]string{"PROXMOX_USER": "delegate"}, wantErr: []string{"PROXMOX_USER"}},
		{name: "token name with user", env: map[string]string{"PROXMOX_TOKEN_NAME": "delegate@pve!ci"}, wantErr: []string{"PROXMOX_TOKEN_NAME"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tt.env {
				env[k] = v
			}
			c, err := ConfigFromEnv(func(k string) string { return env[k] })
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatal("no error")
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error does not name %s:\n%v", w, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestNewChecksConfig(t *testing.T) {
	good := Config{Host: "h", User: "u@pve", TokenName: "tok", TokenValue: "v"}
	if _, err := New(good); err != nil {
		t.Fatal(err)
	}
	tests := []func(*Config){
		func(c *Config) { c.Host = "" },
		func(c *Config) { c.User = "root" },
		func(c *Config) { c.TokenName = "" },
		func(c *Config) { c.TokenValue = "" },
		func(c *Config) { c.SSLMode = "yes" },
		func(c *Config) { c.SSLMode = SSLVerify },
		func(c *Config) { c.SSLMode, c.Fingerprint = SSLVerify, "zz" },
		func(c *Config) { c.SSLMode, c.CAFile = SSLVerify, "/nonexistent/ca.pem" },
		func(c *Config) { c.Port = 70000 },
	}
	for i, mod := range tests {
		c := good
		mod(&c)
		if _, err := New(c); err == nil {
			t.Errorf("case %d: %+v accepted", i, c)
		}
	}
}

// TestNodeSlots: at most NodeCalls calls to one node are in flight at
// once; calls to other nodes, and to no node, are not held up.
func TestNodeSlots(t *testing.T) {
	s := newNodeSlots(2)
	ctx := context.Background()
	a, _ := s.acquire(ctx, "pve1")
	b, _ := s.acquire(ctx, "pve1")
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.acquire(short, "pve1"); err == nil {
		t.Fatal("a third call to pve1 went")
	}
	if r, err := s.acquire(ctx, "pve2"); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
	if r, err := s.acquire(ctx, ""); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
	a()
	a() // twice: released once
	if r, err := s.acquire(ctx, "pve1"); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
	b()
	for path, node := range map[string]string{"/nodes/pve1/qemu/100/config": "pve1", "/nodes/pve%2D2/tasks": "pve-2", "/nodes": "", "/cluster/resources": ""} {
		if got := pathNode(path); got != node {
			t.Errorf("%s: node %q, want %q", path, got, node)
		}
	}
}

// TestNodeSlotsBackground: background calls (the pool's upkeep) hold at
// most all slots of a node but one, and a freed slot goes to a waiting
// foreground call before a waiting background one.
func TestNodeSlotsBackground(t *testing.T) {
	s := newNodeSlots(2)
	ctx := context.Background()
	bgctx := Background(ctx)
	bg1, err := s.acquire(bgctx, "pve1")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(bgctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.acquire(short, "pve1"); err == nil {
		t.Fatal("a second background call to pve1 went with one slot left")
	}
	fg1, err := s.acquire(ctx, "pve1")
	if err != nil {
		t.Fatal(err)
	}
	// Both slots held: a background call waits first, a foreground one
	// after it; the first freed slot is the foreground one's.
	got := make(chan string, 2)
	go func() {
		r, err := s.acquire(bgctx, "pve1")
		if err == nil {
			got <- "background"
			r()
		}
	}()
	testkit.Eventually(t, 5*time.Second, "the background call waits", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.nodes["pve1"].bg) == 1
	})
	go func() {
		r, err := s.acquire(ctx, "pve1")
		if err == nil {
			got <- "foreground"
			<-got // held until the background call is given up on
			r()
		}
	}()
	testkit.Eventually(t, 5*time.Second, "the foreground call waits", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.nodes["pve1"].fg) == 1
	})
	fg1()
	if first := <-got; first != "foreground" {
		t.Fatalf("the freed slot went to the %s call", first)
	}
	got <- "done"
	bg1()
	if second := <-got; second != "background" {
		t.Fatalf("then %s", second)
	}
	// A one-slot node lets background calls through: nothing else could.
	one := newNodeSlots(1)
	if r, err := one.acquire(bgctx, "pve1"); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
	// A background call given up on while waiting frees nothing of others.
	a, _ := s.acquire(ctx, "pve1")
	b, _ := s.acquire(ctx, "pve1")
	gone, cancelGone := context.WithCancel(bgctx)
	cancelGone()
	if _, err := s.acquire(gone, "pve1"); err == nil {
		t.Fatal("a cancelled call went")
	}
	a()
	b()
	s.mu.Lock()
	q := *s.nodes["pve1"]
	s.mu.Unlock()
	if q.busy != 0 || q.bgBusy != 0 || len(q.fg)+len(q.bg) != 0 {
		t.Fatalf("left %+v", q)
	}
}

// TestConfigHostList: PROXMOX_HOST may list several nodes, host[:port]
// each (an IPv6 address in brackets), with one fingerprint for all or one
// per node; a port in the list wins over PROXMOX_PORT.
func TestConfigHostList(t *testing.T) {
	fp1, fp2 := strings.Repeat("AA:", 31)+"AA", strings.Repeat("BB:", 31)+"BB"
	base := map[string]string{"PROXMOX_USER": "delegate@pve", "PROXMOX_TOKEN_NAME": "tk", "PROXMOX_TOKEN_VALUE": "x", "PROXMOX_SSL_MODE": "verify"}
	read := func(kv map[string]string) (Config, error) {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range kv {
			env[k] = v
		}
		return ConfigFromEnv(func(k string) string { return env[k] })
	}
	c, err := read(map[string]string{"PROXMOX_HOST": "pve1, pve2:8007,[fd00::3]", "PROXMOX_PORT": "8443", "PROXMOX_FINGERPRINT": fp1})
	if err != nil {
		t.Fatal(err)
	}
	eps := c.endpoints()
	var got []string
	for _, e := range eps {
		got = append(got, e.baseURL()+" "+e.Fingerprint[:2])
	}
	want := []string{"https://pve1:8443/api2/json AA", "https://pve2:8007/api2/json AA", "https://[fd00::3]:8443/api2/json AA"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("endpoints %q, want %q", got, want)
	}
	c, err = read(map[string]string{"PROXMOX_HOST": "pve1,pve2", "PROXMOX_FINGERPRINT": fp1 + "," + fp2})
	if err != nil || c.endpoints()[1].Fingerprint != fp2 || c.Fingerprint != fp1 {
		t.Errorf("one fingerprint per host: %+v %v", c, err)
	}
	if _, err := read(map[string]string{"PROXMOX_HOST": "pve1,pve2,pve3", "PROXMOX_FINGERPRINT": fp1 + "," + fp2}); err == nil ||
		!strings.Contains(err.Error(), "lists 2 fingerprints for 3 hosts") {
		t.Errorf("fingerprints for some hosts: %v", err)
	}
	if _, err := read(map[string]string{"PROXMOX_HOST": "pve1,,pve3", "PROXMOX_FINGERPRINT": fp1}); err == nil || !strings.Contains(err.Error(), "entry 2 is empty") {
		t.Errorf("an empty entry: %v", err)
	}
}
