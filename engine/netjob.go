package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/egress"
	"github.com/delegate-dev/delegate/sandbox"
)

// A job's network through the egress proxy: what the engine does for it
// besides the proxy's own work (network.go) — the checks at submit, the
// network made before the sandbox, the job's environment, the widening,
// and the reads of its log.

var _ delegate.NetworkService = (*Engine)(nil)

// checkNetwork checks a job's (or a kept sandbox's) network against the
// backend: an allowlist's rules, and an allowlist or an injected secret
// only where the backend enforces them. field names the network
// ("manifest.network"). Whether egress itself is there is checkEgress's.
func checkNetwork(b sandbox.Backend, n delegate.Network, secrets []string, bindings map[string]egress.Binding, field string) error {
	if n.Mode == delegate.NetworkAllowlist {
		if _, err := egress.ParseRules(n.Allow); err != nil {
			var re *egress.RuleError
			if errors.As(err, &re) {
				return &delegate.FieldError{Field: fmt.Sprintf("%s.allow[%d]", field, re.Index), Rule: fmt.Sprintf("%q: %s", re.Value, re.Reason)}
			}
			return &delegate.FieldError{Field: field + ".allow", Rule: err.Error()}
		}
	}
	caps := b.Capabilities()
	if n.Mode == delegate.NetworkAllowlist && !caps.EgressProxy {
		return &delegate.FieldError{Field: field, Rule: fmt.Sprintf("an allowlist needs a backend whose sandboxes reach out only through delegate's egress proxy, which the %s backend here does not (set network: egress or none)", b.Name())}
	}
	for i, s := range secrets {
		bd, bound := bindings[s]
		if !bound {
			continue
		}
		f := fmt.Sprintf("manifest.secrets[%d]", i)
		if !n.Reaches() {
			return &delegate.FieldError{Field: f, Rule: fmt.Sprintf("%s is injected by the proxy for %s (%s%s), and this job has no network: set network to egress or an allowlist", s, bd.Host, s, egress.InjectSuffix)}
		}
		if !caps.EgressProxy {
			return &delegate.FieldError{Field: f, Rule: fmt.Sprintf("%s is injected by delegate's egress proxy for %s, which the %s backend here does not route through", s, bd.Host, b.Name())}
		}
		if !caps.EgressTrust {
			return &delegate.FieldError{Field: f, Rule: fmt.Sprintf("%s is injected by delegate's egress proxy for %s, which needs the job's CA in the sandbox's trust, which the %s backend does not install", s, bd.Host, b.Name())}
		}
	}
	return nil
}

// jobNetwork is a network made for a job or a kept sandbox.
type jobNetwork struct {
	id     string
	token  string
	caCert []byte   // the CA's certificate (PEM), for the sandbox's trust
	inject []string // the secrets the proxy injects
}

// spec is the sandbox's side of the network.
func (n *jobNetwork) spec() *sandbox.Egress {
	if n == nil {
		return nil
	}
	return &sandbox.Egress{Token: n.token, CACert: n.caCert}
}

// openNetwork stores a new network for id (a job's, a kept sandbox's),
// with a token of its own and, when it injects secrets, a CA valid for
// validFor. It returns nil when the network does not go through the
// proxy (none, or a backend without it).
func openNetwork(ctx context.Context, store delegate.NetworkStore, cfg Config, b sandbox.Backend, id string, n delegate.Network, secrets []string, validFor time.Duration) (*jobNetwork, error) {
	if !n.Reaches() || !b.Capabilities().EgressProxy {
		return nil, nil
	}
	if cfg.Egress == nil {
		return nil, errors.New("this server has no egress proxy for the job's network")
	}
	token, hash := newToken()
	jn := &jobNetwork{id: id, token: token}
	st := &delegate.NetworkState{ID: id, Policy: n, TokenHash: hash, Token: token, CreatedAt: time.Now().UTC()}
	var hosts []string
	for _, s := range secrets {
		if bd, ok := cfg.SecretBindings[s]; ok {
			jn.inject = append(jn.inject, s)
			if !slices.Contains(hosts, bd.Host) {
				hosts = append(hosts, bd.Host)
			}
		}
	}
	if len(hosts) > 0 {
		ca, err := egress.NewCA(hosts, validFor+caMargin)
		if err != nil {
			return nil, fmt.Errorf("the job's CA: %w", err)
		}
		pem, err := ca.MarshalPEM()
		if err != nil {
			return nil, fmt.Errorf("the job's CA: %w", err)
		}
		jn.caCert = ca.CertPEM()
		ca.Destroy() // the proxy reads it from the store
		st.CA, st.Inject = pem, jn.inject
	}
	if err := store.CreateNetwork(ctx, st); err != nil {
		return nil, err
	}
	return jn, nil
}

// networkStep opens the job's network, before its sandbox: the sandbox is
// made with it.
func (r *runner) networkStep(ctx context.Context, a *attempt) error {
	m := a.job.Manifest
	jn, err := openNetwork(ctx, r.store, r.cfg, r.backend(), a.job.ID, m.Network, m.Secrets, time.Duration(m.TimeoutSeconds())*time.Second)
	if err != nil {
		return fmt.Errorf("the job's network: %w", err)
	}
	a.net = jn
	return nil
}

// attachNetwork finds the network of the kept sandbox a command runs in,
// for its environment.
func (r *runner) attachNetwork(ctx context.Context, a *attempt, sb *delegate.Sandbox) error {
	if !sb.Network.Reaches() {
		return nil // none was made (openNetwork): no read on a command's way
	}
	n, err := r.store.GetNetwork(ctx, sandboxNetworkID(sb))
	if errors.Is(err, delegate.ErrNotFound) {
		return nil // its network is not the proxy's
	}
	if err != nil {
		return err
	}
	a.net = &jobNetwork{id: n.ID, token: n.Token, inject: n.Inject}
	return nil
}

// sandboxNetworkID is the id of a kept sandbox's network: the job's that
// made it, or its own.
func sandboxNetworkID(sb *delegate.Sandbox) string {
	if sb.JobID != "" {
		return sb.JobID
	}
	return sb.ID
}

// networkEnv adds to a job's environment what its network needs: the
// proxy's address, the trust bundle when the proxy stands in for hosts,
// a placeholder for each secret the proxy injects, and the callback URL
// as the sandbox reaches it.
func (r *runner) networkEnv(env map[string]string, jn *jobNetwork, jobID string) {
	if jn == nil {
		return
	}
	router, ok := r.backend().(sandbox.EgressRouter)
	if !ok {
		return
	}
	route := router.EgressRoute(jn.token)
	for _, k := range []string{"http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"} {
		env[k] = route.ProxyURL
	}
	env["no_proxy"], env["NO_PROXY"] = route.NoProxy, route.NoProxy
	if len(jn.caCert) > 0 && route.TrustFile != "" {
		for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS", "PIP_CERT"} {
			env[k] = route.TrustFile
		}
	}
	for _, s := range jn.inject {
		env[s] = Placeholder
	}
	if route.CallbackURL != "" && r.cfg.CallbackURL != "" {
		env["DELEGATE_CALLBACK_URL"] = strings.TrimSuffix(route.CallbackURL, "/") + "/callback/" + jobID
	}
}

// ownsNetwork: the job may have a network of its own (networkStep), one
// that ends with it. A command in a kept sandbox uses the sandbox's, and
// a job whose network reaches nothing has none.
func ownsNetwork(j *delegate.Job) bool {
	return j.Manifest.Sandbox == "" && j.Manifest.Network.Reaches()
}

// endNetwork ends job id's network when the job ends, unless the kept
// sandbox it made (kept, if any) goes on with it.
func (e *Engine) endNetwork(id, kept string) {
	eg := e.cfg.Egress
	if eg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if kept != "" {
		if sb, err := e.store.GetSandbox(ctx, kept); err == nil && !sb.State.Terminal() {
			return // the kept sandbox's now
		}
	}
	eg.end(ctx, id)
}

// resolveNetwork finds the network a job (or a kept sandbox, by its id)
// uses: its own, or its kept sandbox's.
func resolveNetwork(ctx context.Context, store delegate.Store, id string) (string, error) {
	if strings.HasPrefix(id, "sbx-") {
		sb, err := store.GetSandbox(ctx, id)
		if err != nil {
			return "", err
		}
		return sandboxNetworkID(sb), nil
	}
	j, err := store.GetJob(ctx, id)
	if err != nil {
		return "", err
	}
	if j.Manifest.Sandbox != "" {
		sb, err := store.GetSandbox(ctx, j.Manifest.Sandbox)
		if err != nil {
			return "", err
		}
		return sandboxNetworkID(sb), nil
	}
	return j.ID, nil
}

// Network implements delegate.NetworkService.
func (rd *Reader) Network(ctx context.Context, id string, opts delegate.NetworkLogOptions) (*delegate.NetworkReport, error) {
	if opts.Limit < 0 || opts.Limit > delegate.MaxNetworkLog {
		return nil, &delegate.FieldError{Field: "limit", Rule: fmt.Sprintf("must be between 1 and %d (got %d)", delegate.MaxNetworkLog, opts.Limit)}
	}
	if opts.After < 0 {
		return nil, &delegate.FieldError{Field: "after", Rule: fmt.Sprintf("must be 0 or a seq of the log (got %d)", opts.After)}
	}
	netID, err := resolveNetwork(ctx, rd.store, id)
	if err != nil {
		return nil, err
	}
	n, err := rd.store.GetNetwork(ctx, netID)
	if errors.Is(err, delegate.ErrNotFound) {
		return nil, &delegate.NotFoundError{Resource: "network", ID: id, Reason: "its network does not go through delegate's egress proxy (network none, or a backend without it): there is no network log"}
	}
	if err != nil {
		return nil, err
	}
	entries, err := rd.store.NetworkLog(ctx, netID, opts)
	if err != nil {
		return nil, err
	}
	rep := &delegate.NetworkReport{JobID: id, Network: netID, Policy: n.Policy, Inject: n.Inject, Ended: !n.EndedAt.IsZero(),
		Summary: n.Summary, Entries: entries}
	limit := opts.Limit
	if limit == 0 {
		limit = delegate.DefaultNetworkPage
	}
	if len(entries) == limit {
		rep.Next = entries[len(entries)-1].Seq
	}
	return rep, nil
}

// networkResult is the network part of a finished job's result.
func (rd *Reader) networkResult(ctx context.Context, j *delegate.Job) *delegate.NetworkResult {
	if !j.Manifest.Network.Reaches() && j.Manifest.Sandbox == "" {
		return nil
	}
	rep, err := rd.Network(ctx, j.ID, delegate.NetworkLogOptions{Denied: true, Limit: delegate.MaxResultDenials})
	if err != nil {
		return nil
	}
	return &delegate.NetworkResult{Policy: rep.Policy, Summary: rep.Summary, Denied: rep.Entries}
}

// AllowNetwork implements delegate.NetworkService: the rules are added to
// the stored allowlist (the proxy of the server running the job reads it
// within a second, at once when that is this process), and the change is
// in the job's timeline.
func (e *Engine) AllowNetwork(ctx context.Context, id string, rules []string, by string) (*delegate.NetworkReport, error) {
	if len(rules) == 0 {
		return nil, &delegate.FieldError{Field: "allow", Rule: "name at least one host to allow, such as pypi.org or *.pythonhosted.org"}
	}
	if len(rules) > delegate.MaxNetworkRules {
		return nil, &delegate.FieldError{Field: "allow", Rule: fmt.Sprintf("at most %d rules at once", delegate.MaxNetworkRules)}
	}
	parsed, err := egress.ParseRules(rules)
	if err != nil {
		var re *egress.RuleError
		if errors.As(err, &re) {
			return nil, &delegate.FieldError{Field: fmt.Sprintf("allow[%d]", re.Index), Rule: fmt.Sprintf("%q: %s", re.Value, re.Reason)}
		}
		return nil, err
	}
	netID, err := resolveNetwork(ctx, e.store, id)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(id, "job-") {
		if j, err := e.store.GetJob(ctx, id); err == nil && j.Status.Terminal() {
			return nil, fmt.Errorf("job %s is %s: %w: there is no network left to widen", id, j.Status, delegate.ErrTerminal)
		}
	}
	var added []string
	n, err := e.store.UpdateNetwork(ctx, netID, func(n *delegate.NetworkState) error {
		if !n.EndedAt.IsZero() {
			return fmt.Errorf("the network of %s has ended: %w", id, delegate.ErrTerminal)
		}
		if n.Policy.Mode != delegate.NetworkAllowlist {
			return &delegate.FieldError{Field: "allow", Rule: fmt.Sprintf("only an allowlist can be widened; the network of %s is %s", id, n.Policy.Mode)}
		}
		added = added[:0]
		have, _ := egress.ParseRules(n.Policy.Allow)
		for _, r := range parsed {
			if !slices.Contains(have, r) && !slices.Contains(added, r.String()) {
				added = append(added, r.String())
			}
		}
		if len(n.Policy.Allow)+len(added) > delegate.MaxNetworkRules {
			return &delegate.FieldError{Field: "allow", Rule: fmt.Sprintf("the allowlist would have more than %d rules", delegate.MaxNetworkRules)}
		}
		n.Policy.Allow = append(n.Policy.Allow, added...)
		return nil
	})
	if errors.Is(err, delegate.ErrNotFound) {
		return nil, &delegate.NotFoundError{Resource: "network", ID: id, Reason: "its network does not go through delegate's egress proxy: there is no allowlist to widen"}
	}
	if err != nil {
		return nil, err
	}
	if len(added) > 0 {
		if e.cfg.Egress != nil {
			e.cfg.Egress.widened(n)
		}
		msg := fmt.Sprintf("network: allowlist widened by %s: %s", by, strings.Join(added, ", "))
		jobs := []string{id}
		if n.ID != id {
			jobs = append(jobs, n.ID) // the job that made the kept sandbox
		}
		for _, jid := range jobs {
			if strings.HasPrefix(jid, "job-") {
				e.store.AddEvent(context.WithoutCancel(ctx), jid, delegate.Event{Time: time.Now().UTC(), Message: clip(msg)}, maxEvents)
				e.jobs.notify(jid)
			}
		}
		e.log.Info("network allowlist widened", "network", n.ID, "by", by, "added", strings.Join(added, ", "))
	}
	return e.Network(ctx, id, delegate.NetworkLogOptions{Denied: true, Limit: delegate.MaxResultDenials})
}

// askNetwork is the egress proxy's Asker (Egress.SetAsk): a request the
// allowlist of a job with ask: true denies becomes a question on the job
// from "egress" (an MCP Tasks client sees its task input_required, the CLI
// and the dashboard see it too), open until the proxy stops waiting. An
// answer that allows it widens the allowlist (AllowNetwork, by
// "answer") before this returns, so the held request goes through.
func (e *Engine) askNetwork(ctx context.Context, networkID string, q egress.Question) error {
	if !strings.HasPrefix(networkID, "job-") {
		return fmt.Errorf("network %s is a kept sandbox's, whose commands' questions are their own: widen it by its id", networkID)
	}
	target := q.String()
	expires := time.Now().Add(30 * time.Second)
	if d, ok := ctx.Deadline(); ok {
		expires = d
	}
	stored, _, err := e.questions.ask(ctx, networkID, delegate.Question{From: egressFrom,
		Message: fmt.Sprintf("The job's network asks to reach %s, which its allowlist does not name (%s). Allow it?", target, q.Via),
		Form: delegate.Form{Fields: []delegate.Field{{Name: "allow", Type: delegate.FieldBoolean, Required: true,
			Title: clip("Allow " + target), Description: "adds " + clip(target) + " to the job's network allowlist"}}},
		Expires: expires.UTC()})
	if err != nil {
		return err
	}
	ans, err := e.questions.await(ctx, networkID, stored.ID)
	if err != nil || ans == nil || ans.Answer == nil || ans.Answer.Action != delegate.AnswerAccept || ans.Answer.Content["allow"] != true {
		return err
	}
	_, err = e.AllowNetwork(context.WithoutCancel(ctx), networkID, []string{target}, "answer")
	return err
}

// egressFrom names the egress proxy as the asker of a job's question.
const egressFrom = "egress"
