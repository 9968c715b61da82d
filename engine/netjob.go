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
// network made before the sandbox, and its end, here; the starter's steps
// that open it (start.go), the job's environment (command.go), the
// widening (engine_network.go), and the reads of its log
// (reader_network.go).

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

// sandboxNetworkID is the id of a kept sandbox's network: the job's that
// made it, or its own.
func sandboxNetworkID(sb *delegate.Sandbox) string {
	if sb.JobID != "" {
		return sb.JobID
	}
	return sb.ID
}

// ownsNetwork: the job may have a network of its own (networkStep), one
// that ends with it. A command in a kept sandbox uses the sandbox's, and
// a job whose network reaches nothing has none.
func ownsNetwork(j *delegate.Job) bool {
	return j.Manifest.Sandbox == "" && j.Manifest.Network.Reaches()
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

// endNetwork ends job id's network (through eg) when the job ends, unless
// the kept sandbox it made (kept, if any) goes on with it.
func endNetwork(store delegate.SandboxStore, eg *Egress, id, kept string) {
	if eg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if kept != "" {
		if sb, err := store.GetSandbox(ctx, kept); err == nil && !sb.State.Terminal() {
			return // the kept sandbox's now
		}
	}
	eg.end(ctx, id)
}
