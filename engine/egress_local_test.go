//go:build linux

package engine_test

import (
	"context"
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/egress"
	"github.com/delegate-dev/delegate/engine"
	"github.com/delegate-dev/delegate/internal/testnet"
)

// injectSecret is the operator's secret the proxy adds for inject.test.
const injectSecret = "s3cr3t-value-for-inject"

// egressFixture is an engine over a real local backend whose sandboxes
// go through the egress proxy, in the test internet.
func egressFixture(t *testing.T, w *testnet.W) (*engine.Engine, *engine.Egress, *localFixture) {
	t.Helper()
	f := newLocal(t)
	secrets := map[string]string{"INJ_TOKEN": injectSecret}
	secret := func(name string) (string, bool) { v, ok := secrets[name]; return v, ok }
	b, err := egress.ParseBinding("INJ_TOKEN", "inject.test X-Api-Key Key {}")
	if err != nil {
		t.Fatal(err)
	}
	bindings := map[string]egress.Binding{"INJ_TOKEN": b}
	eg, err := engine.NewEgress(f.store, engine.EgressConfig{Bindings: bindings, Secret: secret,
		Proxy: egress.Config{Resolver: w.Resolver, RootCAs: w.Roots}})
	if err != nil {
		t.Fatal(err)
	}
	f.lcfg.Egress = eg.Proxy()
	backend := f.backend(t)
	f.cfg.Egress, f.cfg.SecretBindings, f.cfg.Secret = eg, bindings, secret
	eng := f.engine(t, backend)
	t.Cleanup(func() {
		eng.Close()
		backend.Close()
		eg.Close()
	})
	return eng, eg, f
}

// reachProbe says, for allowed.test and denied.test, whether the job
// reached it ("reached http://allowed.test/") or was refused.
const reachProbe = `for u in http://allowed.test/ http://denied.test/; do curl -sf --max-time 5 "$u" >/dev/null && echo "reached $u" || echo "refused $u"; done`

// allowlistedSandbox is, in the test internet, an engine over
// egressFixture and a kept sandbox of it whose allowlist is allowed.test.
// ok is false in the test's first run, which runs it again in namespaces
// of its own (testnet.Isolate): that run has nothing more to do.
func allowlistedSandbox(t *testing.T) (eng *engine.Engine, f *localFixture, sb *delegate.Sandbox, ok bool) {
	t.Helper()
	if !testnet.Isolate(t) {
		return nil, nil, nil, false
	}
	eng, _, f = egressFixture(t, testnet.World(t))
	sb, err := eng.OpenSandbox(context.Background(), delegate.SandboxSpec{Network: delegate.Allowlist("allowed.test")})
	if err != nil {
		t.Fatal(err)
	}
	return eng, f, sb, true
}

// runToEnd submits m, waits for its end and returns the job and its
// output.
func runToEnd(t *testing.T, eng *engine.Engine, m delegate.Manifest) (*delegate.Job, string) {
	t.Helper()
	ctx := context.Background()
	j, err := eng.Submit(ctx, m, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if j, err = eng.Wait(ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	res, err := eng.Result(ctx, j.ID, delegate.ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return j, string(res.Output)
}

func file(path string, data []byte) delegate.File {
	return delegate.File{Path: path, Content: base64.StdEncoding.EncodeToString(data)}
}

// TestEgressAllowlistJob: a job with an allowlist reaches its names over
// HTTP and HTTPS and nothing else; a secret bound to inject.test reaches
// that site in a header while the job's environment, files and /proc hold
// only a placeholder; the job's result, its network log and its timeline
// tell each attempt; the network ends with the job.
func TestEgressAllowlistJob(t *testing.T) {
	t.Parallel()
	if !testnet.Isolate(t) {
		return
	}
	w := testnet.World(t)
	eng, _, f := egressFixture(t, w)
	ctx := context.Background()
	// The secret, reversed: the script finds it without its text being
	// anywhere in the sandbox (nor in an argument list).
	rev := []rune(injectSecret)
	slices.Reverse(rev)
	script := `
set -u
curl -sS --max-time 10 --cacert /workspace/roots.pem https://allowed.test/
curl -sS --max-time 10 https://inject.test/
curl -sS --max-time 10 -f http://denied.test/ || echo denied-ok
curl -sS --max-time 10 -f --noproxy '*' http://169.254.169.254/ || echo metadata-ok
echo "env=$INJ_TOKEN"
echo "trust=$SSL_CERT_FILE"
pat=$(printf %s "$REV" | rev)
found=0
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline $(find /workspace /tmp /run -type f ! -path /run/delegate/status 2>/dev/null); do
	c=$(tr '\0' ' ' < "$f" 2>/dev/null) || continue
	case "$c" in *"$pat"*) found=1; echo "secret in $f";; esac
done
echo "found=$found"
`
	job, err := eng.Submit(ctx, delegate.Manifest{Task: script, Network: delegate.Allowlist("allowed.test", "inject.test"),
		Secrets: []string{"INJ_TOKEN"}, Env: map[string]string{"REV": string(rev)}, StatusMode: delegate.StatusModeDetailed,
		Files: []delegate.File{file("roots.pem", w.RootsBytes)}}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done, err := eng.Wait(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	res, err := eng.Result(ctx, job.ID, delegate.ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := string(res.Output) + string(res.Stderr)
	t.Logf("job %s: %s\n%s", done.Status, done.Error, out)
	for _, want := range []string{"hello from allowed", "hello from inject", "denied-ok", "metadata-ok", "env=" + engine.Placeholder,
		"trust=/run/delegate/ca-bundle.pem", "found=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("the job's output lacks %q", want)
		}
	}
	if strings.Contains(out, injectSecret) {
		t.Error("the secret is in the job's output")
	}
	var got []string
	for _, r := range w.Sites["inject"].Requests() {
		got = append(got, r.Header.Get("X-Api-Key"))
	}
	if !slices.Equal(got, []string{"Key " + injectSecret}) {
		t.Errorf("inject.test saw X-Api-Key %q, want the secret once", got)
	}
	if n := w.Sites["denied"].Hits() + w.Sites["metadata"].Hits(); n != 0 {
		t.Errorf("denied.test or the metadata service was reached %d times", n)
	}
	// The result: counts and the denied attempts.
	if res.Network == nil {
		t.Fatal("the result has no network part")
	}
	if s := res.Network.Summary; s.Allowed < 2 || s.Denied < 2 || s.Received == 0 {
		t.Errorf("result summary %+v", s)
	}
	var denied []string
	for _, e := range res.Network.Denied {
		denied = append(denied, e.Target())
	}
	for _, want := range []string{"denied.test:80", "169.254.169.254:80"} {
		if !slices.Contains(denied, want) {
			t.Errorf("the result's denied attempts %v lack %s", denied, want)
		}
	}
	// The log: each attempt, and the injected header named (not its
	// value). The network ends just after the job (its end is not on the
	// job's path), so the report may say so a moment later.
	var rep *delegate.NetworkReport
	eventually(t, "the network ended after its job", func() bool {
		var err error
		if rep, err = eng.Network(ctx, job.ID, delegate.NetworkLogOptions{}); err != nil {
			t.Fatal(err)
		}
		return rep.Ended
	})
	injected := false
	for _, e := range rep.Entries {
		injected = injected || (e.Name == "inject.test" && e.Injected == "X-Api-Key" && e.Allowed)
	}
	if !injected || !rep.Ended || rep.Policy.Mode != delegate.NetworkAllowlist {
		t.Errorf("network report: injected %v, ended %v, policy %v; entries %+v", injected, rep.Ended, rep.Policy, rep.Entries)
	}
	// The timeline tells the denials.
	tl, _ := eng.Timeline(ctx, job.ID)
	var msgs []string
	for _, ev := range tl {
		msgs = append(msgs, ev.Message)
	}
	if !slices.ContainsFunc(msgs, func(m string) bool { return strings.HasPrefix(m, "network: denied denied.test:80") }) {
		t.Errorf("the timeline lacks the denial: %q", msgs)
	}
	// Its network ended with it: the CA and the token are gone.
	n, err := f.store.GetNetwork(ctx, job.ID)
	if err != nil || n.EndedAt.IsZero() || len(n.CA) != 0 || n.Token != "" {
		t.Errorf("network after the job: %+v, %v", n, err)
	}
}

// TestEgressWidenRunningJob: a running job's allowlist widened (as the MCP
// tool and the CLI do) lets its next attempt through; the widening is in
// its timeline and its network log.
func TestEgressWidenRunningJob(t *testing.T) {
	t.Parallel()
	if !testnet.Isolate(t) {
		return
	}
	w := testnet.World(t)
	eng, _, _ := egressFixture(t, w)
	ctx := context.Background()
	job, err := eng.Submit(ctx, delegate.Manifest{
		Task:    `i=0; until curl -sf --max-time 5 http://denied.test/; do i=$((i+1)); [ $i -lt 300 ] || exit 3; sleep 0.1; done; echo reached`,
		Network: delegate.Allowlist("allowed.test"), StatusMode: delegate.StatusModeDetailed}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Wait for a denial in the log, then widen.
	eventuallyWithin(t, 20*time.Second, "a denial logged", func() bool {
		rep, err := eng.Network(ctx, job.ID, delegate.NetworkLogOptions{Denied: true})
		return err == nil && len(rep.Entries) > 0
	})
	if _, err := eng.AllowNetwork(ctx, job.ID, []string{"denied.test", "bad rule/"}, "test"); err == nil || !strings.Contains(err.Error(), "allow[1]") {
		t.Errorf("a bad rule: %v, want an error naming allow[1]", err)
	}
	if _, err := eng.AllowNetwork(ctx, job.ID, []string{"denied.test"}, "test"); err != nil {
		t.Fatal(err)
	}
	done, err := eng.Wait(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != delegate.StatusSuccess {
		t.Fatalf("job %s: %s", done.Status, done.Error)
	}
	if w.Sites["denied"].Hits() == 0 {
		t.Error("denied.test was never reached after the widening")
	}
	tl, _ := eng.Timeline(ctx, job.ID)
	widened := false
	for _, ev := range tl {
		widened = widened || strings.Contains(ev.Message, "allowlist widened by test: denied.test")
	}
	if !widened {
		t.Errorf("the timeline lacks the widening: %+v", tl)
	}
	rep, _ := eng.Network(ctx, job.ID, delegate.NetworkLogOptions{Limit: delegate.MaxNetworkLog})
	policy := false
	for _, e := range rep.Entries {
		policy = policy || (e.Via == "policy" && strings.Contains(e.Rule, "denied.test"))
	}
	if !policy || !slices.Contains(rep.Policy.Allow, "denied.test") {
		t.Errorf("the log lacks the widening, or the policy %v lacks it", rep.Policy)
	}
	if _, err := eng.AllowNetwork(ctx, job.ID, []string{"other.test"}, "test"); err == nil {
		t.Error("a finished job's allowlist was widened")
	}
}

// TestEgressModeJob: network egress through the proxy reaches any public
// name, and still not the metadata service, a private range or the host.
func TestEgressModeJob(t *testing.T) {
	t.Parallel()
	if !testnet.Isolate(t) {
		return
	}
	w := testnet.World(t)
	eng, _, _ := egressFixture(t, w)
	ctx := context.Background()
	job, err := eng.Submit(ctx, delegate.Manifest{Network: delegate.Egress(), Task: `
for u in http://allowed.test/ http://denied.test/ http://metadata.test/ http://private.test/ http://host.test:8081/ http://169.254.169.254/; do
	if curl -sf --max-time 5 "$u" >/dev/null; then echo "reached $u"; else echo "refused $u"; fi
done`}, delegate.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eng.Wait(ctx, job.ID)
	res, err := eng.Result(ctx, job.ID, delegate.ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := string(res.Output)
	for _, want := range []string{"reached http://allowed.test/", "reached http://denied.test/", "refused http://metadata.test/",
		"refused http://private.test/", "refused http://host.test:8081/", "refused http://169.254.169.254/"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, s := range []string{"metadata", "private", "host"} {
		if n := w.Sites[s].Hits(); n != 0 {
			t.Errorf("%s reached %d times", s, n)
		}
	}
}

// TestEgressSubmitChecks: rules are checked at submit, naming the rule.
func TestEgressSubmitChecks(t *testing.T) {
	t.Parallel()
	if !testnet.Isolate(t) {
		return
	}
	w := testnet.World(t)
	eng, _, _ := egressFixture(t, w)
	for _, tc := range []struct {
		m               delegate.Manifest
		wantField, rule string
	}{
		{delegate.Manifest{Task: "true", Network: delegate.Allowlist("ok.test", "https://x.test/")}, "manifest.network.allow[1]", "not a URL"},
		{delegate.Manifest{Task: "true", Network: delegate.Allowlist("*.com")}, "manifest.network.allow[0]", "top-level domain"},
		{delegate.Manifest{Task: "true", Network: delegate.Allowlist("10.0.0.1")}, "manifest.network.allow[0]", "an address, not a name"},
		{delegate.Manifest{Task: "true", Secrets: []string{"INJ_TOKEN"}}, "manifest.secrets[0]", "has no network"},
	} {
		_, err := eng.Submit(context.Background(), tc.m, delegate.SubmitOptions{})
		var fe *delegate.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.wantField || !strings.Contains(fe.Rule, tc.rule) {
			t.Errorf("%v: got %v, want %s: ...%s", tc.m.Network, err, tc.wantField, tc.rule)
		}
	}
}

// TestEgressKeptSandbox: a kept sandbox opened with an allowlist gives
// its commands one network through the proxy (local sandboxes of many
// commands have one now); widened by the sandbox's id, the next command
// reaches the new name; released, the network ends.
func TestEgressKeptSandbox(t *testing.T) {
	t.Parallel()
	eng, f, sb, ok := allowlistedSandbox(t)
	if !ok {
		return
	}
	ctx := context.Background()
	command := func(task string) string {
		t.Helper()
		_, out := runToEnd(t, eng, delegate.Manifest{Task: task, Sandbox: sb.ID})
		return out
	}
	out := command(reachProbe)
	if !strings.Contains(out, "reached http://allowed.test/") || !strings.Contains(out, "refused http://denied.test/") {
		t.Fatalf("first command:\n%s", out)
	}
	if _, err := eng.AllowNetwork(ctx, sb.ID, []string{"denied.test"}, "test"); err != nil {
		t.Fatal(err)
	}
	if out := command(reachProbe); !strings.Contains(out, "reached http://denied.test/") {
		t.Errorf("after widening the sandbox's allowlist:\n%s", out)
	}
	rep, err := eng.Network(ctx, sb.ID, delegate.NetworkLogOptions{Denied: true})
	if err != nil || rep.Network != sb.ID || rep.Summary.Denied == 0 {
		t.Errorf("the sandbox's log: %+v, %v", rep, err)
	}
	if _, _, err := eng.ReleaseSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := f.store.GetNetwork(ctx, sb.ID); err != nil || n.EndedAt.IsZero() {
		t.Errorf("the network of a released sandbox: %+v, %v", n, err)
	}
}

// TestEgressPersistentJob: the network of a persistent job goes on with
// the sandbox it keeps (its next command reaches the allowed name with
// it) and ends when the sandbox is released; the job's own end leaves it.
func TestEgressPersistentJob(t *testing.T) {
	t.Parallel()
	if !testnet.Isolate(t) {
		return
	}
	w := testnet.World(t)
	eng, _, f := egressFixture(t, w)
	ctx := context.Background()
	probe := `curl -sf --max-time 5 http://allowed.test/ >/dev/null && echo reached || echo refused`
	job, out := runToEnd(t, eng, delegate.Manifest{Task: probe, Lifecycle: delegate.LifecyclePersistent, Network: delegate.Allowlist("allowed.test")})
	if job.Sandbox != "" {
		// Released below; a failure before that must not leave it running
		// (a leaked sandbox outlives the test binary).
		t.Cleanup(func() { eng.ReleaseSandbox(context.Background(), job.Sandbox) })
	}
	if job.Sandbox == "" || !strings.Contains(out, "reached") {
		t.Fatalf("persistent job: sandbox %q, output %q", job.Sandbox, out)
	}
	if _, out := runToEnd(t, eng, delegate.Manifest{Task: probe, Sandbox: job.Sandbox}); !strings.Contains(out, "reached") {
		t.Errorf("the kept sandbox's next command: %q", out)
	}
	if n, err := f.store.GetNetwork(ctx, job.ID); err != nil || !n.EndedAt.IsZero() {
		t.Errorf("the network of a kept sandbox after its job and a command: %+v, %v", n, err)
	}
	if _, _, err := eng.ReleaseSandbox(ctx, job.Sandbox); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the network ended with its sandbox", func() bool {
		n, err := f.store.GetNetwork(ctx, job.ID)
		return err == nil && !n.EndedAt.IsZero()
	})
}

// TestEgressAsk: with ask: true a denied request waits for a person: the
// job's question (from "egress") is answered — yes: the allowlist is
// widened and the held request goes through; no: it is refused at once,
// not after the 30 s.
func TestEgressAsk(t *testing.T) {
	t.Parallel()
	if !testnet.Isolate(t) {
		return
	}
	w := testnet.World(t)
	eng, _, _ := egressFixture(t, w)
	ctx := context.Background()
	for _, yes := range []bool{true, false} {
		n := delegate.Allowlist("allowed.test")
		n.Ask = true
		job, err := eng.Submit(ctx, delegate.Manifest{Network: n, StatusMode: delegate.StatusModeDetailed,
			Task: `start=$(date +%s); if curl -sf --max-time 40 http://denied.test/ >/dev/null; then echo reached; else echo refused; fi; echo "after $(( $(date +%s) - start ))s"`},
			delegate.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var q delegate.Question
		var ended *delegate.Job
		eventuallyWithin(t, 20*time.Second, "the proxy's question", func() bool {
			qs, _ := eng.Questions(ctx, job.ID)
			for _, x := range qs {
				if x.From == "egress" && x.State == delegate.QuestionOpen {
					q = x
				}
			}
			if j, err := eng.Get(ctx, job.ID); q.ID == "" && err == nil && j.Status.Terminal() {
				ended = j // no question will come: say why below
			}
			return q.ID != "" || ended != nil
		})
		if q.ID == "" {
			// A CI run once waited 20 s here: what the job did, to see
			// whether its request reached the proxy at all.
			res, _ := eng.Result(ctx, job.ID, delegate.ResultOptions{})
			tl, _ := eng.Timeline(ctx, job.ID)
			var output string
			if res != nil {
				output = string(res.Output)
			}
			t.Fatalf("the job ended (%s: %s) without the proxy's question; output %q; timeline %+v", ended.Status, ended.Error, output, tl)
		}
		if !strings.Contains(q.Message, "denied.test:80") || len(q.Form.Fields) != 1 || q.Form.Fields[0].Name != "allow" || q.Expires.IsZero() {
			t.Errorf("the question: %+v", q)
		}
		a := delegate.Answer{Action: delegate.AnswerAccept, Content: map[string]any{"allow": true}, By: "test"}
		if !yes {
			a = delegate.Answer{Action: delegate.AnswerDecline, By: "test"}
		}
		if _, err := eng.Answer(ctx, job.ID, q.ID, a); err != nil {
			t.Fatal(err)
		}
		eng.Wait(ctx, job.ID)
		res, err := eng.Result(ctx, job.ID, delegate.ResultOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := string(res.Output)
		if yes && (!strings.Contains(out, "reached") || w.Sites["denied"].Hits() == 0) {
			t.Errorf("allowed: %s", out)
		}
		if !yes && (!strings.Contains(out, "refused") || strings.Contains(out, "after 3")) {
			t.Errorf("declined: %s (it must not wait the 30 s out)", out)
		}
		tl, _ := eng.Timeline(ctx, job.ID)
		widened := false
		for _, ev := range tl {
			widened = widened || strings.Contains(ev.Message, "allowlist widened by answer: denied.test:80")
		}
		if widened != yes {
			t.Errorf("widened %v, want %v: %+v", widened, yes, tl)
		}
		w.Sites["denied"].Reset()
	}
}
