package delegate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// NetworkMode is what a job's network may reach.
type NetworkMode string

const (
	// NetworkNone: nothing (the default, except for claude jobs).
	NetworkNone NetworkMode = "none"
	// NetworkEgress: every name and public address, never link-local
	// addresses (cloud metadata), the server's own addresses (except its
	// callback) nor, unless the operator allows them, private ranges.
	NetworkEgress NetworkMode = "egress"
	// NetworkAllowlist: only the names of Network.Allow (and their ports,
	// when a rule gives one), with egress's exceptions too.
	NetworkAllowlist NetworkMode = "allowlist"
)

// Network is manifest.network: "none", "egress", or an allowlist,
// {"allow": ["pypi.org", "*.pythonhosted.org", "github.com:443"],
// "ask": true}. In JSON the first two are strings and an allowlist is an
// object (its mode is implied).
type Network struct {
	Mode NetworkMode
	// Allow is an allowlist's rules: a host name, "*." and a domain (the
	// names below it), either with ":port" (that port only). The engine
	// checks their syntax (egress.ParseRule).
	Allow []string
	// Ask: a request the allowlist denies waits (up to 30 s) for a person
	// to allow its name (the job's question, MCP Tasks' input_required).
	Ask bool
}

// Bounds of an allowlist.
const (
	MaxNetworkRules     = 256
	MaxNetworkRuleBytes = 260 // a host name (253), "*." and ":65535"
)

// Egress is the plain egress network.
func Egress() Network { return Network{Mode: NetworkEgress} }

// Allowlist is an allowlist network of rules.
func Allowlist(rules ...string) Network { return Network{Mode: NetworkAllowlist, Allow: rules} }

// IsZero says whether n was left out (the server's default applies).
func (n Network) IsZero() bool { return n.Mode == "" && n.Allow == nil && !n.Ask }

// Reaches says whether n reaches anything outside the sandbox.
func (n Network) Reaches() bool { return n.Mode == NetworkEgress || n.Mode == NetworkAllowlist }

func (n Network) String() string {
	if n.Mode != NetworkAllowlist {
		return string(n.Mode)
	}
	s := "allowlist " + strings.Join(n.Allow, ", ")
	if len(n.Allow) == 0 {
		s = "allowlist (empty)"
	}
	if n.Ask {
		s += " (ask)"
	}
	return s
}

// networkObject is an allowlist's JSON.
type networkObject struct {
	Allow []string `json:"allow"`
	Ask   bool     `json:"ask,omitempty"`
}

// MarshalJSON writes a mode as its string and an allowlist as an object.
func (n Network) MarshalJSON() ([]byte, error) {
	if n.Mode == NetworkAllowlist {
		o := networkObject{Allow: n.Allow, Ask: n.Ask}
		if o.Allow == nil {
			o.Allow = []string{}
		}
		return json.Marshal(o)
	}
	return json.Marshal(string(n.Mode))
}

// UnmarshalJSON reads what MarshalJSON writes (a stored manifest). A
// client's manifest is read by internal/jsonin, strictly.
func (n *Network) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' {
		var o networkObject
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&o); err != nil {
			return fmt.Errorf("network: %w", err)
		}
		if o.Allow == nil {
			o.Allow = []string{}
		}
		*n = Network{Mode: NetworkAllowlist, Allow: o.Allow, Ask: o.Ask}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("network: must be \"none\", \"egress\" or {\"allow\": [...]}: %w", err)
	}
	*n = Network{Mode: NetworkMode(s)}
	return nil
}

// Validate checks n's shape, naming field (manifest.network) and the
// rule: the engine checks the allowlist's rules themselves.
func (n Network) Validate(field string) error {
	switch n.Mode {
	case "", NetworkNone, NetworkEgress:
		if n.Allow != nil || n.Ask {
			return fieldErr(field, "must be none, egress, or an allowlist {\"allow\": [...], \"ask\": true|false}; allow and ask go with an allowlist only")
		}
		return nil
	case NetworkAllowlist:
	default:
		return fieldErr(field, "must be none, egress or {\"allow\": [\"pypi.org\", \"*.pythonhosted.org\", \"github.com:443\"]} (got %q)", n.Mode)
	}
	if len(n.Allow) > MaxNetworkRules {
		return fieldErr(field+".allow", "must have at most %d rules (got %d)", MaxNetworkRules, len(n.Allow))
	}
	for i, r := range n.Allow {
		if r == "" || len(r) > MaxNetworkRuleBytes || strings.ContainsRune(r, 0) {
			return fieldErr(fmt.Sprintf("%s.allow[%d]", field, i), "must be a host name such as pypi.org, *.pythonhosted.org or github.com:443 (1 to %d bytes)", MaxNetworkRuleBytes)
		}
	}
	return nil
}

// The network log. Every connection and DNS query of a job whose network
// goes through delegate's egress proxy is an entry, kept with the job.
// It lives in the store (NetworkStore) beside the job; a restart keeps
// it, and the job's result, the MCP resource job://{id}/network, the CLI
// and the dashboard read it (NetworkService).

// NetworkState is a network the egress proxy serves: a job's, or a kept
// sandbox's (which its commands share). ID is the job's id or the
// sandbox's.
type NetworkState struct {
	ID string `json:"id"`
	// Policy is the network as it is now: the manifest's, with what was
	// allowed since (AllowNetwork).
	Policy Network `json:"policy"`
	// Inject names the secrets the proxy adds to requests for their host
	// (the operator's NAME_INJECT bindings); never their values.
	Inject []string `json:"inject,omitempty"`
	// TokenHash is the SHA-256 of the network's token, by which the proxy
	// asks for its policy. Token is the token itself, kept (like the CA)
	// while the network lives, for the commands of a kept sandbox that
	// must name it to the proxy (a VM's proxy URL); emptied at its end.
	TokenHash string `json:"-"`
	Token     string `json:"-"`
	// CA is the network's own certificate authority (certificate and
	// key, PEM), made when it injects secrets: a restarted server serves
	// the same one, which the sandbox trusts. Destroyed (emptied) when
	// the network ends.
	CA        []byte    `json:"-"`
	CreatedAt time.Time `json:"created_at"`
	// EndedAt: the network was revoked (its job ended, its sandbox went).
	EndedAt time.Time      `json:"ended_at,omitzero"`
	Summary NetworkSummary `json:"summary"`
}

// NetworkSummary counts a network's log.
type NetworkSummary struct {
	Allowed  int64 `json:"allowed"`  // connections and DNS queries let through
	Denied   int64 `json:"denied"`   // refused
	Sent     int64 `json:"sent"`     // bytes from the job, all connections
	Received int64 `json:"received"` // bytes to the job
	// Unlogged counts the entries counted here but not kept (past
	// MaxNetworkLog); Lost those the proxy could not deliver at all.
	Unlogged int64 `json:"unlogged,omitempty"`
	Lost     int64 `json:"lost,omitempty"`
	// DeniedNames are what was denied ("denied.test:443", an address),
	// once each, the first MaxDeniedNames.
	DeniedNames []string `json:"denied_names,omitempty"`
}

// Bounds of a network log.
const (
	MaxNetworkLog  = 5000
	MaxDeniedNames = 100
)

// NetworkEntry is one line of a network log.
type NetworkEntry struct {
	Seq  int64     `json:"seq"` // its place in the log, from 1
	Time time.Time `json:"time"`
	// Via: connect, http (the proxy variables), transparent-tls,
	// transparent-http (a redirected connection), dns, callback; policy
	// (the allowlist changed) and log (entries lost) are not attempts.
	Via      string `json:"via"`
	Name     string `json:"name,omitempty"`  // the host name asked for
	QType    string `json:"qtype,omitempty"` // a DNS query's type
	Addr     string `json:"addr,omitempty"`  // the address connected to
	Port     int    `json:"port,omitempty"`
	Sent     int64  `json:"sent,omitempty"`
	Received int64  `json:"received,omitempty"`
	Allowed  bool   `json:"allowed"`
	// Rule is what decided ("allow *.pythonhosted.org", "not in
	// allowlist", "link-local 169.254.0.0/16 (cloud metadata)").
	Rule string `json:"rule,omitempty"`
	// Injected names the header the proxy set from a secret (never its
	// value).
	Injected   string `json:"injected,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	Err        string `json:"error,omitempty"`
	Lost       int64  `json:"lost,omitempty"` // Via log: entries lost
}

// Target is what the entry tried to reach: name:port, or addr:port; a
// DNS query's name alone.
func (e NetworkEntry) Target() string {
	if e.Via == "dns" && e.Name != "" {
		return e.Name
	}
	h := e.Name
	if h == "" {
		h = e.Addr
		if strings.Contains(h, ":") {
			h = "[" + h + "]"
		}
	}
	if e.Port != 0 {
		return fmt.Sprintf("%s:%d", h, e.Port)
	}
	return h
}

// Attempt says whether the entry is a connection or a query (not a
// change of policy nor a note of entries lost).
func (e NetworkEntry) Attempt() bool { return e.Via != "policy" && e.Via != "log" }

// NetworkLogOptions select entries of a network log.
type NetworkLogOptions struct {
	// After: entries after this Seq (0 from the start).
	After int64
	// Limit: at most this many (0 for DefaultNetworkPage, at most
	// MaxNetworkLog).
	Limit int
	// Denied: only the denied attempts.
	Denied bool
}

// DefaultNetworkPage is how many entries a read returns by default.
const DefaultNetworkPage = 200

// NetworkStore keeps the networks the egress proxy serves and their logs.
type NetworkStore interface {
	// CreateNetwork stores a new network (ErrConflict if its id or token
	// hash is taken).
	CreateNetwork(ctx context.Context, n *NetworkState) error
	// GetNetwork returns one by id (*NotFoundError if none).
	GetNetwork(ctx context.Context, id string) (*NetworkState, error)
	// NetworkByToken returns the network whose token hashes to hash.
	NetworkByToken(ctx context.Context, hash string) (*NetworkState, error)
	// UpdateNetwork changes one in a transaction: fn sees it as stored.
	UpdateNetwork(ctx context.Context, id string, fn func(*NetworkState) error) (*NetworkState, error)
	// LiveNetworks returns the networks not ended.
	LiveNetworks(ctx context.Context) ([]NetworkState, error)
	// AppendNetworkLog adds entries to a network's log and counts them in
	// its summary: entries past MaxNetworkLog are counted, not kept. Seq
	// is set by the store.
	AppendNetworkLog(ctx context.Context, id string, entries []NetworkEntry) error
	// NetworkLog reads entries of a network's log, oldest first.
	NetworkLog(ctx context.Context, id string, opts NetworkLogOptions) ([]NetworkEntry, error)
}

// NetworkReport is a job's network as a reader sees it: the policy now,
// the counts, and entries of its log.
type NetworkReport struct {
	JobID string `json:"job_id"`
	// Network is the id of the network (the job's, or its kept sandbox's).
	Network string         `json:"network"`
	Policy  Network        `json:"policy"`
	Inject  []string       `json:"inject,omitempty"`
	Ended   bool           `json:"ended"`
	Summary NetworkSummary `json:"summary"`
	Entries []NetworkEntry `json:"entries"`
	// Next continues the log after Entries (NetworkLogOptions.After); 0
	// when there was nothing after them yet.
	Next int64 `json:"next,omitempty"`
}

// NetworkResult is the network part of a job's result: its counts, and
// the attempts it denied (the first MaxResultDenials).
type NetworkResult struct {
	Policy  Network        `json:"policy"`
	Summary NetworkSummary `json:"summary"`
	Denied  []NetworkEntry `json:"denied"`
}

// MaxResultDenials is how many denied attempts a job's result lists.
const MaxResultDenials = 20

// NetworkService reads a job's network log and widens its allowlist.
// The engine implements it; the adapters (MCP, CLI, dashboard) use it.
type NetworkService interface {
	// Network returns a job's (or a kept sandbox's) network: *NotFoundError
	// for a job whose network is not the egress proxy's (none, or a
	// backend without it).
	Network(ctx context.Context, id string, opts NetworkLogOptions) (*NetworkReport, error)
	// AllowNetwork adds rules to the allowlist of a running job (or a
	// kept sandbox): the next attempt sees them, held requests go
	// through, and the change is in the job's timeline and network log.
	// by says who asked ("mcp", "cli", "dashboard", "answer").
	AllowNetwork(ctx context.Context, id string, rules []string, by string) (*NetworkReport, error)
}

// NetworkNotFound is the error for a job with no network of the proxy's.
func NetworkNotFound(id string) *NotFoundError {
	return &NotFoundError{Resource: "network", ID: id}
}
