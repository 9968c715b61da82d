//go:build linux

package egress

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// An operator's credential reaches its host, over verified HTTPS, while
// the client holds only a placeholder and sees the secret nowhere: not in
// the response, not in the exchange curl traces, not in the log.
func TestInjection(t *testing.T) {
	const secret = "s3cr3t-0f-the-operat0r"
	var proxyLog bytes.Buffer
	f := newFixture(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&proxyLog, nil)) })
	ca, err := NewCA([]string{"inject.test", "badcert.test"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ca.Destroy)
	in1, err := mustBinding(t, "API_TOKEN", "'inject.test Authorization Bearer {}'").Inject(secret)
	if err != nil {
		t.Fatal(err)
	}
	in2, err := mustBinding(t, "BAD_TOKEN", "badcert.test X-Api-Key {}").Inject(secret)
	if err != nil {
		t.Fatal(err)
	}
	const tok = "job-inject"
	pol := Policy{Mode: Allowlist, Allow: mustRules(t, "allowed.test", "inject.test", "badcert.test"), Inject: []Injection{in1, in2}, CA: ca}
	if err := pol.Validate(); err != nil {
		t.Fatal(err)
	}
	f.jobs.set(tok, pol)
	sb := newSandbox(t, f.p, tok)
	bundle := f.bundle(t, ca)
	site := f.w.Sites["inject"]
	placeholder := []string{"-H", "Authorization: Bearer placeholder-the-job-holds"}

	var traces []string
	for _, tc := range []struct {
		name string
		ns   string
		env  []string
		via  Via
	}{
		{"proxy variables", "", f.proxyEnv(tok), ViaConnect},
		{"proxy variables in the sandbox", sb.ns, []string{"https_proxy=" + sandboxProxyURL}, ViaConnect},
		{"transparent", sb.ns, nil, ViaTransparent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			site.Reset()
			args := append([]string{"--cacert", bundle, "-v", "-i"}, placeholder...)
			res := f.curl(t, tc.ns, tc.env, append(args, "https://inject.test/a", "https://inject.test/b")...)
			if res.code != 0 || strings.Count(res.out, "hello from inject") != 2 {
				t.Fatalf("%v\nlog:\n%s", res, f.dump(tok))
			}
			traces = append(traces, res.out, res.err)
			reqs := site.Requests()
			if len(reqs) != 2 {
				t.Fatalf("the site got %d requests", len(reqs))
			}
			for _, r := range reqs {
				if got := r.Header.Values("Authorization"); len(got) != 1 || got[0] != "Bearer "+secret || !r.TLS {
					t.Errorf("the site got Authorization %q (tls %v)", got, r.TLS)
				}
			}
			if !strings.Contains(res.err, "placeholder-the-job-holds") {
				t.Error("curl's trace does not show what it sent")
			}
			e := f.entry(t, tok, "the injected connection", func(e Entry) bool {
				return e.Via == tc.via && e.Name == "inject.test" && e.Injected == "Authorization"
			})
			if !e.Allowed || e.Sent == 0 || e.Received == 0 {
				t.Errorf("entry %+v", e)
			}
		})
	}

	t.Run("not over plain HTTP", func(t *testing.T) {
		site.Reset()
		res := f.curl(t, "", f.proxyEnv(tok), "http://inject.test/")
		if !strings.Contains(res.out, "hello from inject") {
			t.Fatal(res)
		}
		if got := site.Requests()[0].Header.Get("Authorization"); got != "" {
			t.Errorf("plain HTTP carried Authorization %q", got)
		}
	})
	t.Run("not to other hosts", func(t *testing.T) {
		f.w.Sites["allowed"].Reset()
		res := f.curl(t, "", f.proxyEnv(tok), "--cacert", bundle, "https://allowed.test/")
		if res.code != 0 || f.w.Sites["allowed"].Requests()[0].Header.Get("Authorization") != "" {
			t.Errorf("%v %+v", res, f.w.Sites["allowed"].Requests())
		}
	})
	t.Run("not to a host that cannot prove it is the host", func(t *testing.T) {
		bad := f.w.Sites["badcert"]
		bad.Reset()
		res := f.curl(t, "", f.proxyEnv(tok), "--cacert", bundle, "-i", "https://badcert.test/")
		if !strings.Contains(res.out, "502 Bad Gateway") || bad.Hits() != 0 {
			t.Errorf("%v; the site got %+v", res, bad.Requests())
		}
		f.entry(t, tok, "the unverified host", func(e Entry) bool {
			return e.Name == "badcert.test" && strings.Contains(e.Err, "the credential was not sent")
		})
	})
	t.Run("not on a request naming another host", func(t *testing.T) {
		site.Reset()
		res := f.curl(t, "", f.proxyEnv(tok), "--cacert", bundle, "-i", "-H", "Host: allowed.test", "https://inject.test/")
		if !strings.Contains(res.out, "421 Misdirected Request") || site.Hits() != 0 {
			t.Errorf("%v", res)
		}
	})
	t.Run("a client that does not trust the job's CA", func(t *testing.T) {
		site.Reset()
		res := f.curl(t, "", f.proxyEnv(tok), "https://inject.test/")
		if res.code != 60 || site.Hits() != 0 {
			t.Errorf("%v", res)
		}
		f.entry(t, tok, "the refused handshake", func(e Entry) bool {
			return e.Name == "inject.test" && strings.Contains(e.Err, "TLS with the job")
		})
	})

	all := strings.Join(traces, "\n") + proxyLog.String() + f.dump(tok)
	for _, e := range f.log.Entries(tok) {
		all += e.Rule + e.Err + e.Name
	}
	if strings.Contains(all, secret) {
		t.Error("the secret shows in what the client saw or in the logs")
	}
}
