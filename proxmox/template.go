package proxmox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// Checking vmTemplate at submit time, from a list of the cluster's
// templates read now and then rather than once per submission: the list
// is used for templateListTTL, then read again in the background while
// the old one still answers. A name the list does not have is checked
// against a new list (at most every templateRecheck), since a template
// may have just been made; Proxmox lists a VM's name only once it has
// statistics, so VMs listed without one have their config read. When the
// cluster cannot be read, the name is let through: provisioning will
// say what is wrong.

const (
	templateListTTL = 30 * time.Second
	templateRecheck = 5 * time.Second
)

var _ sandbox.TemplateChecker = (*Backend)(nil)

// templates is what this server knows of the cluster's templates: each
// one's config as last read (what placement and the checks need), the
// list of them for the checks at submission, and the nodes' most cores.
// Its background reads of the list are its own: close waits for them.
type templates struct {
	c   *pve.Client
	cfg *Config
	log *slog.Logger

	mu   sync.Mutex
	tpls map[int]*templateInfo
	// cores is the most cores of an online node (checkCores), as read
	// at coresRead.
	cores     int
	coresRead time.Time

	list templateList
	ctx  context.Context // ends at close: the background reads stop
	stop context.CancelFunc
	bg   sync.WaitGroup
}

func newTemplates(c *pve.Client, cfg *Config, log *slog.Logger) *templates {
	ctx, stop := context.WithCancel(context.Background())
	return &templates{c: c, cfg: cfg, log: log, tpls: map[int]*templateInfo{}, ctx: ctx, stop: stop}
}

// close ends the background reads and waits for them.
func (ts *templates) close() {
	ts.list.mu.Lock()
	ts.list.closed = true
	ts.list.mu.Unlock()
	ts.stop()
	ts.bg.Wait()
}

// templateList is the cluster's templates as last read.
type templateList struct {
	mu        sync.Mutex
	read      time.Time
	resources []pve.Resource
	reading   bool // a background read is under way
	closed    bool // no more of them
}

// check is CheckTemplate (sandbox.TemplateChecker).
func (ts *templates) check(ctx context.Context, name string) error {
	resources, age, ok := ts.list.get()
	if !ok {
		var err error
		if resources, err = ts.read(ctx); err != nil {
			ts.log.Warn("cannot list the cluster's templates: vmTemplate is checked when the job is provisioned", "err", err)
			return nil
		}
	} else if age > templateListTTL {
		ts.refresh()
	}
	tpls, err := findTemplates(resources, name)
	if err != nil && ok && age > templateRecheck {
		// Not in the list: perhaps made since.
		if fresh, err := ts.read(ctx); err == nil {
			resources = fresh
		}
	}
	if err != nil {
		// VMs listed without a name may be new templates: their configs say.
		if tpls, err = ts.find(ctx, slices.Clone(resources), name); err != nil {
			return &sandbox.TemplateError{Name: name, Reason: fmt.Sprintf("no template %q on the Proxmox cluster", name), Available: templateNames(resources)}
		}
	}
	// A template no job can run on (no guest agent, or one that refuses
	// exec and files) is refused now rather than after a clone and a boot.
	var why string
	for _, t := range tpls {
		info, err := ts.info(ctx, t)
		if err != nil {
			return nil // provisioning will say
		}
		if why = ts.refusal(info); why == "" {
			return nil
		}
	}
	// The templates refused are not offered instead.
	var others []pve.Resource
	for _, r := range resources {
		if !slices.ContainsFunc(tpls, func(t pve.Resource) bool { return t.VMID == r.VMID }) {
			others = append(others, r)
		}
	}
	return &sandbox.TemplateError{Name: name, Reason: why, Available: templateNames(others)}
}

var _ sandbox.ResourceChecker = (*Backend)(nil)

// checkCores is CheckResources (sandbox.ResourceChecker): a job asking more
// cores than any node has is refused (Proxmox would refuse to start its
// VM: "MAX n vcpus allowed per VM on this node"). The nodes' cores are
// read at most every templateListTTL; without Sys.Audit Proxmox shows
// none, and nothing is refused.
func (ts *templates) checkCores(ctx context.Context, spec sandbox.Spec) error {
	cores := shapeOf(spec.CPU, spec.MemoryBytes).cores
	most, err := ts.mostCores(ctx)
	if err != nil || most == 0 || cores <= most {
		return err
	}
	return &delegate.FieldError{Field: "manifest.resources.cpu",
		Rule: fmt.Sprintf("%d cores is more than any node of the Proxmox cluster has (at most %d)", cores, most)}
}

// mostCores is the most cores an online node has (0: unknown).
func (ts *templates) mostCores(ctx context.Context) (int, error) {
	ts.mu.Lock()
	most, read := ts.cores, ts.coresRead
	ts.mu.Unlock()
	if !read.IsZero() && time.Since(read) < templateListTTL {
		return most, nil
	}
	nodes, err := ts.c.ClusterResources(ctx, pve.ResourceNode)
	if err != nil {
		return 0, fmt.Errorf("proxmox: list nodes: %w", err)
	}
	most = 0
	for _, n := range nodes {
		if n.Type == "node" && n.Status == "online" {
			most = max(most, int(n.MaxCPU))
		}
	}
	ts.mu.Lock()
	ts.cores, ts.coresRead = most, time.Now()
	ts.mu.Unlock()
	return most, nil
}

// templateNames lists the templates a job may name: "name (vmid)".
func templateNames(resources []pve.Resource) []string {
	var out []string
	for _, r := range resources {
		if r.Type == "qemu" && bool(r.Template) {
			if r.Name != "" {
				out = append(out, r.Name+" ("+strconv.Itoa(int(r.VMID))+")")
			} else {
				out = append(out, strconv.Itoa(int(r.VMID)))
			}
		}
	}
	sort.Strings(out)
	return out
}

func (l *templateList) get() ([]pve.Resource, time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.read.IsZero() {
		return nil, 0, false
	}
	return l.resources, time.Since(l.read), true
}

// refresh reads the list again in the background (once at a time).
func (ts *templates) refresh() {
	l := &ts.list
	l.mu.Lock()
	if l.reading || l.closed {
		l.mu.Unlock()
		return
	}
	l.reading = true
	ts.bg.Add(1)
	l.mu.Unlock()
	go func() {
		defer ts.bg.Done()
		ctx, cancel := context.WithTimeout(ts.ctx, time.Minute)
		defer cancel()
		if _, err := ts.read(ctx); err != nil {
			ts.log.Debug("refresh the template list", "err", err)
		}
		l.mu.Lock()
		l.reading = false
		l.mu.Unlock()
	}()
}

// read reads the cluster's VMs, keeps them as the template list
// and returns them.
func (ts *templates) read(ctx context.Context) ([]pve.Resource, error) {
	resources, err := ts.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return nil, err
	}
	ts.list.mu.Lock()
	ts.list.resources, ts.list.read = resources, time.Now()
	ts.list.mu.Unlock()
	return resources, nil
}

// find finds the templates a job names. Proxmox lists a VM's
// name and template flag from its statistics, which a VM made in the last
// ~10 s does not have yet: if none matches, those VMs' configs are read.
func (ts *templates) find(ctx context.Context, resources []pve.Resource, name string) ([]pve.Resource, error) {
	tpls, err := findTemplates(resources, name)
	if err == nil {
		return tpls, nil
	}
	found, lookups := false, 0
	for i, r := range resources {
		if r.Type != "qemu" || r.Name != "" || lookups >= 2*maxMemoryLookups || slices.Contains(r.TagList(), instanceTag(ts.cfg.Instance)) {
			continue // this instance's VMs are clones, never templates
		}
		lookups++
		cfg, cerr := ts.c.VMConfig(ctx, r.Node, int(r.VMID))
		if cerr == nil && bool(cfg.Template) {
			resources[i].Name, resources[i].Template, found = cfg.Name, true, true
		}
	}
	if !found {
		return nil, err
	}
	return findTemplates(resources, name)
}

// templateInfo is what delegate needs of a template's config: it does
// not change while it is a template, so it is read once in a while.
type templateInfo struct {
	read   time.Time
	label  string // "name (vmid)"
	digest string // of its config: a pool VM remembers it
	// storages are those of its disks and of its CD-ROM and cloud-init
	// drives: Proxmox refuses to clone it to another node unless every
	// one is shared (qemu-server clone_vm, $check_storage_access_clone).
	storages []string
	nets     []string // netN keys
	bootDisk string
	bootSize int64
	// agent: its agent option is on; without it no job can run.
	agent bool
	// protection is set: its clones copy it, and must lose it.
	protection bool

	// Guarded by templates.mu.
	full bool // its storage cannot make linked clones
	// agentOK: a clone's guest agent was seen to allow what delegate
	// needs; agentRefused says what it refused (then no job can run).
	agentOK      bool
	agentRefused string
}

// refusal says why no job can run on a template ("" if one can).
func (ts *templates) refusal(info *templateInfo) string {
	if !info.agent {
		return fmt.Sprintf("template %s has no QEMU guest agent enabled (agent: 1), and delegate reaches its VMs only through the agent: "+
			"install qemu-guest-agent in it and enable the option (qm set <vmid> --agent enabled=1)", info.label)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return info.agentRefused
}

// templateTTL: a template is read again after this long (it may have
// been replaced under the same vmid).
const templateTTL = 10 * time.Minute

func (ts *templates) info(ctx context.Context, t pve.Resource) (*templateInfo, error) {
	ts.mu.Lock()
	info := ts.tpls[int(t.VMID)]
	ts.mu.Unlock()
	if info != nil && time.Since(info.read) < templateTTL {
		return info, nil
	}
	cfg, err := ts.c.VMConfig(ctx, t.Node, int(t.VMID))
	if err != nil {
		return nil, fmt.Errorf("proxmox: read template %d: %w", t.VMID, privilegeHint(err))
	}
	info = &templateInfo{read: time.Now(), label: templateLabel(t) + " (" + strconv.Itoa(int(t.VMID)) + ")", digest: cfg.Digest,
		nets: netKeys(cfg), storages: diskStorages(cfg), agent: agentEnabled(cfg), protection: cfg.Option("protection") == "1"}
	if t.Name == "" {
		info.label = cfg.Name + " (" + strconv.Itoa(int(t.VMID)) + ")"
	}
	info.bootDisk, info.bootSize = bootDisk(cfg)
	ts.mu.Lock()
	old := ts.tpls[int(t.VMID)]
	if old != nil {
		info.full = old.full
		if old.digest == info.digest {
			info.agentOK, info.agentRefused = old.agentOK, old.agentRefused
		}
	}
	ts.tpls[int(t.VMID)] = info
	ts.mu.Unlock()
	if old == nil || old.digest != info.digest {
		ts.warn(info, cfg)
	}
	return info, nil
}

// warnTemplate logs what a template's config shows that costs jobs
// dearly but does not stop them.
func (ts *templates) warn(info *templateInfo, cfg pve.VMConfig) {
	if hasCloudInit(cfg) && cfg.Option("ciupgrade") != "0" {
		ts.log.Warn("the template's cloud-init upgrades packages at every first boot of a VM with network (ciupgrade defaults to 1): "+
			"minutes per job, and it may restart the guest agent; set ciupgrade 0 on the template", "template", info.label)
	}
	if !info.agent {
		ts.log.Warn("the template has no QEMU guest agent enabled: its jobs fail", "template", info.label)
	}
}

// agentEnabled reads the agent option ("1", "enabled=1,fstrim_cloned_disks=1"...).
func agentEnabled(cfg pve.VMConfig) bool {
	for _, part := range strings.Split(string(cfg.Agent), ",") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			v = k
		} else if k != "enabled" {
			continue
		}
		return v == "1" || v == "on" || v == "yes" || v == "true"
	}
	return false
}

// hasCloudInit: a drive of the config is a cloud-init drive.
func hasCloudInit(cfg pve.VMConfig) bool {
	for k := range cfg.Raw {
		if v := cfg.Option(k); isDiskKey(k) && strings.Contains(v, "media=cdrom") && strings.Contains(volumeOf(v), "cloudinit") {
			return true
		}
	}
	return false
}

func volumeOf(drive string) string {
	vol, _, _ := strings.Cut(drive, ",")
	return vol
}

// cloneFull remembers that a template's storage cannot link.
func (ts *templates) cloneFull(info *templateInfo) {
	ts.mu.Lock()
	info.full = true
	ts.mu.Unlock()
}

func (ts *templates) isFull(info *templateInfo) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return info.full
}
