package pve

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SSLMode says how the server's certificate is checked.
type SSLMode string

const (
	// SSLStrict: the certificate must chain to a system-trusted CA and
	// name the host (what a browser checks). The default.
	SSLStrict SSLMode = "strict"
	// SSLVerify is for self-signed clusters: with CAFile, the certificate
	// must chain to that CA (the cluster's pve-root-ca.pem) and name the
	// host; with Fingerprint, the server's leaf certificate must have that
	// SHA-256 fingerprint (chain and name are then not checked: the pin
	// is stronger). With both, both must hold.
	SSLVerify SSLMode = "verify"
	// SSLInsecure checks nothing. It must be asked for explicitly.
	SSLInsecure SSLMode = "insecure"
)

// Config is how to reach and authenticate to a Proxmox VE API.
type Config struct {
	Host string // host name or address of a cluster node
	Port int    // default 8006
	// Endpoints are more nodes of the same cluster (their Port 0: Port;
	// their Fingerprint "": Fingerprint): a call whose node does not
	// answer goes to the next (PROXMOX_HOST=pve1,pve2:8006,...).
	Endpoints []Endpoint
	// User is "user@realm"; TokenName and TokenValue are the API token's
	// id and secret: the header is PVEAPIToken=User!TokenName=TokenValue.
	User       string
	TokenName  string
	TokenValue string

	SSLMode     SSLMode // default strict
	CAFile      string  // PEM file of the CA to trust (verify mode)
	Fingerprint string  // SHA-256 of the server certificate (verify mode), AA:BB:... or hex

	// Timeout bounds each HTTP attempt; default 30s.
	Timeout time.Duration
	// RetryAttempts is how many times a safe request is retried after a
	// transient failure; default 3 (negative: none). RetryDelay is the
	// first pause, doubled each time; default 1s.
	RetryAttempts int
	RetryDelay    time.Duration
	// RateLimit is the most requests per second the client sends (token
	// bucket), RateBurst how many may go at once; defaults 20 and 40.
	// Negative RateLimit: no limit.
	RateLimit float64
	RateBurst int
	// NodeCalls is the most calls to one node (paths /nodes/{node}/...)
	// in flight at once; default 2. Each node has three pvedaemon workers
	// (pve-manager PVE/Service/pvedaemon.pm), which every agent, config
	// and clone call holds while it runs (an agent call starts with a
	// ping that waits 3 s for a guest still booting): two leave one to the
	// web UI and other clients. Negative: no limit.
	NodeCalls int
	// TaskPollInterval is WaitTask's first pause between polls (it grows
	// to 2s); default 300ms.
	TaskPollInterval time.Duration
	// Logger receives debug lines for each request; nil discards them.
	Logger *slog.Logger
}

// Endpoint is a node's API besides Config.Host's.
type Endpoint struct {
	Host        string
	Port        int
	Fingerprint string
}

var (
	userRe      = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[^\s@!:]+@[A-Za-z][A-Za-z0-9.\-_]+$`) })
	tokenNameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z][A-Za-z0-9.\-_]+$`) })
)

// withDefaults fills in the defaults and checks the result.
func (c Config) withDefaults() (Config, error) {
	if c.Port == 0 {
		c.Port = 8006
	}
	if c.SSLMode == "" {
		c.SSLMode = SSLStrict
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	switch {
	case c.RetryAttempts == 0:
		c.RetryAttempts = 3
	case c.RetryAttempts < 0:
		c.RetryAttempts = 0
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = time.Second
	}
	if c.RateLimit == 0 {
		c.RateLimit = 20
	}
	if c.RateBurst == 0 {
		c.RateBurst = 40
	}
	if c.NodeCalls == 0 {
		c.NodeCalls = 2
	}
	if c.TaskPollInterval == 0 {
		c.TaskPollInterval = 300 * time.Millisecond
	}
	var errs []error
	if c.Host == "" {
		errs = append(errs, errors.New("host is empty"))
	}
	if c.Port < 1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("port %d is not 1..65535", c.Port))
	}
	if !userRe().MatchString(c.User) {
		errs = append(errs, fmt.Errorf("user %q is not user@realm", c.User))
	}
	if !tokenNameRe().MatchString(c.TokenName) {
		errs = append(errs, fmt.Errorf("token name %q must start with a letter and contain only letters, digits, '.', '-', '_'", c.TokenName))
	}
	if c.TokenValue == "" {
		errs = append(errs, errors.New("token value is empty"))
	}
	switch c.SSLMode {
	case SSLStrict, SSLInsecure:
	case SSLVerify:
		if c.CAFile == "" && c.Fingerprint == "" {
			errs = append(errs, errors.New("ssl mode verify needs a CA file or a certificate fingerprint"))
		}
	default:
		errs = append(errs, fmt.Errorf("ssl mode %q is not strict, verify or insecure", c.SSLMode))
	}
	if c.Fingerprint != "" {
		if _, err := parseFingerprint(c.Fingerprint); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Timeout < 0 || c.RetryDelay < 0 || c.TaskPollInterval < 0 {
		errs = append(errs, errors.New("timeout, retry delay and task poll interval must not be negative"))
	}
	return c, errors.Join(errs...)
}

// TokenID is "user@realm!tokenname".
func (c Config) TokenID() string { return c.User + "!" + c.TokenName }

func (c Config) baseURL() string {
	return "https://" + net.JoinHostPort(c.Host, strconv.Itoa(c.Port)) + "/api2/json"
}

// endpoints are the APIs the client may call, the first one first: each
// as a Config of its own (its host, port and fingerprint).
func (c Config) endpoints() []Config {
	out := []Config{c}
	for _, e := range c.Endpoints {
		ec := c
		ec.Host, ec.Endpoints = e.Host, nil
		if e.Port != 0 {
			ec.Port = e.Port
		}
		if e.Fingerprint != "" {
			ec.Fingerprint = e.Fingerprint
		}
		out = append(out, ec)
	}
	return out
}

// ConfigFromEnv reads the PROXMOX_* variables. Every error names the
// variable it is about.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Host:        getenv("PROXMOX_HOST"),
		User:        getenv("PROXMOX_USER"),
		TokenName:   getenv("PROXMOX_TOKEN_NAME"),
		TokenValue:  getenv("PROXMOX_TOKEN_VALUE"),
		SSLMode:     SSLMode(strings.ToLower(getenv("PROXMOX_SSL_MODE"))),
		CAFile:      getenv("PROXMOX_CA_FILE"),
		Fingerprint: getenv("PROXMOX_FINGERPRINT"),
	}
	var errs []string
	bad := func(name, rule string) { errs = append(errs, fmt.Sprintf("%s=%q: %s", name, getenv(name), rule)) }
	required := func(name, val string) {
		if val == "" {
			errs = append(errs, name+": must be set")
		}
	}
	required("PROXMOX_HOST", c.Host)
	// PROXMOX_HOST may list several nodes, host[:port] each, and
	// PROXMOX_FINGERPRINT one fingerprint for all or one per node.
	var eps []Endpoint
	for i, h := range strings.Split(c.Host, ",") {
		h = strings.TrimSpace(h)
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			host, port = strings.Trim(h, "[]"), ""
		}
		e := Endpoint{Host: host}
		if port != "" {
			n, err := strconv.Atoi(port)
			if err != nil || n < 1 || n > 65535 {
				bad("PROXMOX_HOST", fmt.Sprintf("%q: the port must be a number from 1 to 65535", h))
			}
			e.Port = n
		}
		if host == "" && c.Host != "" {
			bad("PROXMOX_HOST", fmt.Sprintf("entry %d is empty: list host[:port] separated by commas", i+1))
		}
		eps = append(eps, e)
	}
	if fps := strings.Split(c.Fingerprint, ","); len(fps) > 1 {
		if len(fps) != len(eps) {
			bad("PROXMOX_FINGERPRINT", fmt.Sprintf("lists %d fingerprints for %d hosts: give one for all, or one per host in PROXMOX_HOST's order", len(fps), len(eps)))
		} else {
			for i := range eps {
				eps[i].Fingerprint = strings.TrimSpace(fps[i])
			}
			c.Fingerprint = eps[0].Fingerprint
		}
	}
	if len(eps) > 0 {
		c.Host, c.Endpoints = eps[0].Host, eps[1:]
		if eps[0].Port != 0 {
			c.Port = eps[0].Port
		}
	}
	required("PROXMOX_USER", c.User)
	required("PROXMOX_TOKEN_NAME", c.TokenName)
	required("PROXMOX_TOKEN_VALUE", c.TokenValue)
	if c.User != "" && !userRe().MatchString(c.User) {
		bad("PROXMOX_USER", "must be user@realm, e.g. delegate@pve")
	}
	if c.TokenName != "" && !tokenNameRe().MatchString(c.TokenName) {
		bad("PROXMOX_TOKEN_NAME", "must be the token's id alone (letters, digits, '.', '-', '_'), not user@realm!id")
	}
	if v := getenv("PROXMOX_PORT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 {
			bad("PROXMOX_PORT", "must be a port number from 1 to 65535")
		}
		if c.Port == 0 { // a port in PROXMOX_HOST wins
			c.Port = n
		}
	}
	switch c.SSLMode {
	case "":
	case SSLStrict, SSLInsecure:
	case SSLVerify:
		if c.CAFile == "" && c.Fingerprint == "" {
			bad("PROXMOX_SSL_MODE", "verify needs PROXMOX_CA_FILE or PROXMOX_FINGERPRINT")
		}
	default:
		bad("PROXMOX_SSL_MODE", "must be strict, verify or insecure")
	}
	for _, fp := range append([]string{c.Fingerprint}, func() (out []string) {
		for _, e := range c.Endpoints {
			out = append(out, e.Fingerprint)
		}
		return out
	}()...) {
		if _, err := parseFingerprint(fp); fp != "" && err != nil {
			bad("PROXMOX_FINGERPRINT", "must be a SHA-256 fingerprint: 32 hex bytes, like AA:BB:... (one, or one per host)")
			break
		}
	}
	duration := func(name string, dst *time.Duration) {
		v := getenv(name)
		if v == "" {
			return
		}
		d, err := parseSeconds(v)
		if err != nil || d <= 0 {
			bad(name, "must be a positive duration like 30s, 500ms, or a number of seconds")
			return
		}
		*dst = d
	}
	duration("PROXMOX_TIMEOUT", &c.Timeout)
	duration("PROXMOX_RETRY_DELAY", &c.RetryDelay)
	if v := getenv("PROXMOX_RETRY_ATTEMPTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 100 {
			bad("PROXMOX_RETRY_ATTEMPTS", "must be a whole number from 0 to 100")
		}
		c.RetryAttempts = n
		if n == 0 {
			c.RetryAttempts = -1 // explicit: no retries
		}
	}
	if v := getenv("PROXMOX_RATE_LIMIT"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 10000 || f != f {
			bad("PROXMOX_RATE_LIMIT", "must be requests per second from 0 (no limit) to 10000, like 20 or 0.5")
		}
		c.RateLimit = f
		if f == 0 {
			c.RateLimit = -1 // explicit: no limit
		}
	}
	if v := getenv("PROXMOX_RATE_BURST"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			bad("PROXMOX_RATE_BURST", "must be a whole number of requests from 1 to 10000")
		}
		c.RateBurst = n
	}
	if v := getenv("PROXMOX_NODE_CALLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1000 {
			bad("PROXMOX_NODE_CALLS", "must be a whole number from 1 to 1000 (0: no limit)")
		}
		c.NodeCalls = n
		if n == 0 {
			c.NodeCalls = -1 // explicit: no limit
		}
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("invalid Proxmox configuration:\n  %s", strings.Join(errs, "\n  "))
	}
	return c, nil
}

// parseSeconds reads "30s" or "30" (seconds).
func parseSeconds(v string) (time.Duration, error) {
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(n * float64(time.Second)), nil
	}
	return time.ParseDuration(v)
}
