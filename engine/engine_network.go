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
)

// The engine's side of jobs' networks: the allowlist widened on request or
// by an answer, and a network ended with its job.

var _ delegate.NetworkService = (*Engine)(nil)

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
		e.audit.Record(ctx, delegate.AuditWidened, id, "added "+strings.Join(added, ", ")+" (by "+by+")")
		e.widenSandbox(context.WithoutCancel(ctx), id, n.Policy.Allow)
	}
	return e.Network(ctx, id, delegate.NetworkLogOptions{Denied: true, Limit: delegate.MaxResultDenials})
}

// widenSandbox writes a kept sandbox's widened allowlist into its record,
// which sandboxes show and the dashboard read (the proxy reads the
// network's): id is the sandbox, a command in it, or the job that made
// it.
func (e *Engine) widenSandbox(ctx context.Context, id string, allow []string) {
	sbx := id
	if !strings.HasPrefix(id, "sbx-") {
		j, err := e.store.GetJob(ctx, id)
		if err != nil || j.Sandbox == "" {
			return
		}
		sbx = j.Sandbox
	}
	_, err := e.store.UpdateSandbox(ctx, sbx, func(sb *delegate.Sandbox) error {
		if sb.Network.Mode == delegate.NetworkAllowlist {
			sb.Network.Allow = slices.Clone(allow)
		}
		return nil
	})
	if err != nil {
		e.log.Warn("a kept sandbox's record keeps its allowlist as it was", "sandbox", sbx, "err", err)
	}
}

// askNetwork puts the egress proxy's questions (Egress.serveAsks): a request the
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
