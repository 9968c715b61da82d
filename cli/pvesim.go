package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/pvesim"
	"github.com/spf13/cobra"
	flag "github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// pveSimCmd runs cmdPveSim, which parses its own flags, so that
// `delegate help pve-sim` and `delegate pve-sim --help` print the same.
func (p *Program) pveSimCmd(cfg *Config) *cobra.Command {
	cmd := &cobra.Command{
		Use:                "pve-sim [flags]",
		Short:              "Run a Proxmox VE API simulator (prints the env to use it)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmdPveSim(cmd.Context(), *cfg, args, p.Stdout, p.Stderr)
		},
	}
	cmd.SetHelpFunc(func(cmd *cobra.Command, _ []string) {
		cmdPveSim(context.Background(), *cfg, []string{"--help"}, p.Stdout, p.Stdout)
	})
	return cmd
}

const pveSimUsage = `Usage: delegate pve-sim [flags]

delegate pve-sim runs a simulated Proxmox VE cluster (for demos and tests of
the Proxmox backend) and prints, on stdout, the environment that points
"delegate serve" at it (DELEGATE_BACKEND=proxmox included), then lets go
of stdout:

  eval "$(delegate pve-sim --nodes 2 &)"    # or copy the export lines

Guests really run commands, each in a local sandbox: run it as root.
`

// kvList is a repeatable KEY=VALUE flag.
type kvList map[string]string

// String is what the help shows as the default: "" (none) when empty, as
// pflag omits an empty default, where fmt would print "map[]".
func (l kvList) String() string {
	pairs := make([]string, 0, len(l))
	for _, k := range slices.Sorted(maps.Keys(l)) {
		pairs = append(pairs, k+"="+l[k])
	}
	return strings.Join(pairs, ",")
}
func (l kvList) Type() string { return "KEY=VALUE" }

func (l kvList) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" || v == "" {
		return fmt.Errorf("must be KEY=VALUE (got %q)", s)
	}
	l[k] = v
	return nil
}

// strList is a repeatable flag.
type strList []string

func (l *strList) String() string     { return strings.Join(*l, ",") }
func (l *strList) Type() string       { return "string" }
func (l *strList) Set(s string) error { *l = append(*l, s); return nil }

func cmdPveSim(ctx context.Context, cfg Config, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("pve-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, pveSimUsage, "\nFlags:\n")
		fs.PrintDefaults()
	}
	listen := fs.String("listen", "127.0.0.1:8006", "address of the simulated API (HTTPS)")
	nodes := fs.Int("nodes", 1, "cluster nodes, named pve1..pveN")
	nodeCPUs := fs.Int("node-cpus", 8, "cores per node (a VM may not have more vCPUs)")
	nodeMemory := fs.String("node-memory", "32G", "memory per node, its maxmem (like PVE, starts are not refused for overcommit; a VM larger than the node does not start)")
	bootDelay := fs.Duration("boot-delay", 5*time.Second, "from a started VM to an answering guest agent")
	taskDelay := fs.Duration("task-delay", time.Second, "how long a task (clone, start, stop...) runs")
	latency := fs.String("latency", "", "timings: fast, or real (a real cluster's: requests 10-50 ms, clone ~2 s, boot ~10 s, agent ~3 s later, 10 s stats cycle); overrides --boot-delay and --task-delay")
	pveVersion := fs.String("pve-version", "9.1", "Proxmox VE release to behave like: "+strings.Join(pvesim.Releases(), ", ")+" (schema, privileges, body size cap)")
	sharedStorage := fs.String("shared-storage", "", "ID: add a shared (Ceph RBD) storage and put the templates on it, so every node can clone them (one template is then enough: --template-every-node=false)")
	leastPrivilege := fs.Bool("least-privilege", false, "print the env of a least-privilege token (role "+pvesim.JobRoleName+", user delegate@pve, token jobs) made through the simulator's access API, instead of the admin token")
	slowTasks := kvList{}
	fs.Var(slowTasks, "slow-task", "TYPE=DURATION: tasks of a type (qmclone, qmstart, ...) take this long (repeatable)")
	errorRate := fs.Float64("error-rate", 0, "share (0..1) of API requests answered with a random 500")
	failTasks := kvList{}
	fs.Var(failTasks, "fail-task", "TYPE=MESSAGE: every task of a type fails with this exit status (repeatable)")
	agentDown := fs.Bool("agent-down", false, "guest agents never come up")
	var offline strList
	fs.Var(&offline, "offline-node", "NODE: start with this node offline (repeatable)")
	templateID := fs.Int("template-id", 9000, "vmid of the template on the first node (the next nodes get the next ids)")
	templateName := fs.String("template-name", "delegate-template", "name of the template VMs")
	everyNode := fs.Bool("template-every-node", true, "put a template on every node (linked clones stay on their template's node)")
	containers := fs.Int("containers", 0, "running LXC containers to add on the first node, ids 200.. (for the proxmox toolset's container tools)")
	tokenID := fs.String("token-id", "root@pam!delegate", "API token id, user@realm!name")
	tokenSecret := fs.String("token-secret", "", "API token secret (default: random)")
	hostname := fs.String("hostname", "", "extra host name or address for the certificate (how clients reach the simulator)")
	sandboxDir := fs.String("sandbox-dir", "", "directory of the guests' sandboxes (default: a temporary one)")
	seed := fs.Int64("seed", 0, "seed of the random fault injection (0: random)")
	callbackPort := fs.Int("callback-port", cfg.CallbackPort, "port of delegate's callback server (CALLBACK_PORT), which guests with a NIC reach at "+
		simServerAddr+" (printed as CALLBACK_PUBLIC_URL: workspaces over HTTP, the jobs' callbacks); 0: none")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *nodes < 1 || *nodes > 64 {
		return usagef("--nodes: must be from 1 to 64 (got %d)", *nodes)
	}
	if *nodeCPUs < 1 {
		return usagef("--node-cpus: must be at least 1 (got %d)", *nodeCPUs)
	}
	mem, err := delegate.ParseSize(*nodeMemory)
	if err != nil || mem < 1<<30 {
		return usagef("--node-memory: must be a size of at least 1G, like 32G (got %q)", *nodeMemory)
	}
	if *errorRate < 0 || *errorRate > 1 {
		return usagef("--error-rate: must be from 0 to 1 (got %v)", *errorRate)
	}
	if *bootDelay < 0 || *taskDelay <= 0 {
		return usagef("--boot-delay must not be negative and --task-delay must be positive")
	}
	if *callbackPort < 0 || *callbackPort > 65535 {
		return usagef("--callback-port: must be from 0 to 65535 (got %d)", *callbackPort)
	}
	if *latency != "" && *latency != "fast" && *latency != "real" {
		return usagef("--latency: must be fast or real (got %q)", *latency)
	}
	if !slices.Contains(pvesim.Releases(), *pveVersion) {
		return usagef("--pve-version: must be one of %s (got %q)", strings.Join(pvesim.Releases(), ", "), *pveVersion)
	}
	delays := map[string]time.Duration{}
	for typ, v := range slowTasks {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return usagef("--slow-task %s=%s: the duration must be positive, like 10s", typ, v)
		}
		delays[typ] = d
	}
	user, tokenName, ok := strings.Cut(*tokenID, "!")
	if !ok || !strings.Contains(user, "@") || tokenName == "" {
		return usagef("--token-id: must be user@realm!name (got %q)", *tokenID)
	}
	secret := *tokenSecret
	if secret == "" {
		b := make([]byte, 16)
		rand.Read(b)
		secret = hex.EncodeToString(b)
	}
	host, port, err := net.SplitHostPort(*listen)
	if err != nil {
		return usagef("--listen: %v", err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	specs := pvesim.DefaultNodes(*nodes)
	for i := range specs {
		specs[i].CPUs, specs[i].MemoryBytes = *nodeCPUs, mem
	}
	for _, n := range offline {
		found := false
		for _, s := range specs {
			found = found || s.Name == n
		}
		if !found {
			return usagef("--offline-node %q: the nodes are pve1..pve%d", n, *nodes)
		}
	}
	log := newLogger(stderr, cfg.LogLevel)
	// --boot-delay 0 means no delay; pvesim reads 0 as "its default".
	boot := *bootDelay
	if boot == 0 {
		boot = time.Nanosecond
	}
	hostnames := []string{host}
	if *hostname != "" {
		hostnames = append(hostnames, *hostname)
	}
	storages := pvesim.DefaultStorages()
	templateStorage := ""
	if *sharedStorage != "" {
		storages = append(storages, pvesim.SharedStorage(*sharedStorage))
		templateStorage = *sharedStorage
	}
	opts := pvesim.Options{
		Listen:     *listen,
		Hostnames:  hostnames,
		Nodes:      specs,
		PVEVersion: *pveVersion,
		Storages:   storages,
		TaskDelay:  *taskDelay,
		TaskDelays: delays,
		BootDelay:  boot,
		Faults: pvesim.Faults{
			ErrorRate: *errorRate, TaskFailures: failTasks, AgentDown: *agentDown, OfflineNodes: offline,
		},
		Seed:       *seed,
		SandboxDir: *sandboxDir,
		Logger:     log,
	}
	callbackURL := ""
	if *callbackPort != 0 {
		// The guests' connections to the server's address on the
		// simulated network are carried to the callback server here.
		at := net.JoinHostPort(simServerAddr, strconv.Itoa(*callbackPort))
		opts.CallbackPort = *callbackPort
		opts.Hosts = map[string]string{at: net.JoinHostPort(localCallbackHost(cfg.CallbackHost), strconv.Itoa(*callbackPort))}
		callbackURL = "http://" + at
	}
	if *latency == "real" {
		// The real profile's timings, except the tasks given explicitly.
		opts.Latency, opts.TaskDelay, opts.BootDelay = "real", 0, 0
	}
	sim, err := pvesim.New(opts)
	if err != nil {
		return err
	}
	defer sim.Close()
	if err := sim.AddToken(pvesim.Token{ID: *tokenID, Secret: secret, Privileges: pvesim.RoleAdministrator}); err != nil {
		return usageError{fmt.Errorf("--token-id: %w", err)}
	}
	var templates []string
	for i, n := range specs {
		if i > 0 && !*everyNode {
			break
		}
		id := *templateID + i
		if err := sim.AddTemplate(n.Name, id, *templateName, pvesim.TemplateSpec{Tags: "delegate", Storage: templateStorage}); err != nil {
			return usageError{fmt.Errorf("--template-id/--template-name: %w", err)}
		}
		templates = append(templates, fmt.Sprintf("%d on %s", id, n.Name))
	}
	if *containers < 0 || *containers > 100 {
		return usagef("--containers: must be from 0 to 100 (got %d)", *containers)
	}
	for i := range *containers {
		if err := sim.AddContainer(specs[0].Name, 200+i, fmt.Sprintf("ct-%d", i+1), pvesim.ContainerSpec{Running: true}); err != nil {
			return fmt.Errorf("--containers: %w", err)
		}
	}
	if err := sim.Start(ctx); err != nil {
		return err
	}
	u, _ := url.Parse(sim.URL())
	if _, p, err := net.SplitHostPort(u.Host); err == nil {
		port = p
	}
	fmt.Fprintf(stdout, "# pvesim: PVE %s, %d node(s), templates %s (named %s)\n", *pveVersion, len(specs), strings.Join(templates, ", "), *templateName)
	if *leastPrivilege {
		jt, err := sim.CreateJobToken(ctx, pvesim.Token{ID: *tokenID, Secret: secret})
		if err != nil {
			return fmt.Errorf("--least-privilege: %w", err)
		}
		fmt.Fprintf(stdout, "# least-privilege token: role %s (%s) on %s\n", jt.Role, strings.Join(jt.Privileges, ","), strings.Join(jt.Paths, " "))
		user, tokenName, secret = jt.User, jt.TokenName, jt.Secret
	}
	for _, kv := range [][2]string{
		// For the proxmox backend: `serve` or `run` after it just works.
		{"DELEGATE_BACKEND", "proxmox"},
		{"PROXMOX_HOST", host},
		{"PROXMOX_PORT", port},
		{"PROXMOX_USER", user},
		{"PROXMOX_TOKEN_NAME", tokenName},
		{"PROXMOX_TOKEN_VALUE", secret},
		{"PROXMOX_SSL_MODE", "verify"},
		{"PROXMOX_FINGERPRINT", sim.Fingerprint()},
		// By name: every node's template has it (the backend also takes a vmid).
		{"DEFAULT_VM_TEMPLATE", *templateName},
		// Where guests reach the callback server (last: the env's end).
		{"CALLBACK_PUBLIC_URL", callbackURL},
	} {
		if kv[1] != "" {
			fmt.Fprintf(stdout, "export %s=%s\n", kv[0], shellQuote(kv[1]))
		}
	}
	fmt.Fprintf(stdout, "# pvesim runs as pid %d: kill it to stop the simulator and its guests\n", os.Getpid())
	if f, ok := stdout.(*os.File); ok {
		// Nothing more is written there: let go of it, so that a reader
		// waiting for its end (eval "$(delegate pve-sim &)") gets it.
		f.Sync()
		detach(f)
	}
	log.Info("pve-sim ready", "url", sim.URL(), "nodes", len(specs))
	<-ctx.Done()
	return nil
}

// simServerAddr is the delegate server's address on the simulated
// network, as a real job network has one for it (docs/PROXMOX.md).
const simServerAddr = "10.0.0.5"

// localCallbackHost is where on this host the callback server listens
// (CALLBACK_HOST): a wildcard is reached at the loopback.
func localCallbackHost(host string) string {
	if host == "" || host == "0.0.0.0" || host == "::" || host == "localhost" {
		return "127.0.0.1"
	}
	return host
}

// shellQuote quotes a value for the export lines when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%+=:,./-_", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// detach points f's descriptor at /dev/null: the pipe or file it was is
// closed for this process, and writes to it go nowhere.
func detach(f *os.File) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return
	}
	defer null.Close()
	unix.Dup2(int(null.Fd()), int(f.Fd()))
}
