package proxmox

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
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

// templateList is the cluster's templates as last read.
type templateList struct {
	mu        sync.Mutex
	read      time.Time
	resources []pve.Resource
	reading   bool // a background read is under way
}

// CheckTemplate implements sandbox.TemplateChecker.
func (b *Backend) CheckTemplate(ctx context.Context, name string) error {
	resources, age, ok := b.tplList.get()
	if !ok {
		var err error
		if resources, err = b.readTemplates(ctx); err != nil {
			b.log.Warn("cannot list the cluster's templates: vmTemplate is checked when the job is provisioned", "err", err)
			return nil
		}
	} else if age > templateListTTL {
		b.tplList.refresh(b)
	}
	tpls, err := findTemplates(resources, name)
	if err != nil && ok && age > templateRecheck {
		// Not in the list: perhaps made since.
		if fresh, err := b.readTemplates(ctx); err == nil {
			resources = fresh
		}
	}
	if err != nil {
		// VMs listed without a name may be new templates: their configs say.
		if tpls, err = b.findTemplates(ctx, slices.Clone(resources), name); err != nil {
			return &sandbox.TemplateError{Name: name, Reason: fmt.Sprintf("no template %q on the Proxmox cluster", name), Available: templateNames(resources)}
		}
	}
	// A template no job can run on (no guest agent, or one that refuses
	// exec and files) is refused now rather than after a clone and a boot.
	var why string
	for _, t := range tpls {
		info, err := b.template(ctx, t)
		if err != nil {
			return nil // provisioning will say
		}
		if why = b.refusal(info); why == "" {
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

// CheckResources implements sandbox.ResourceChecker: a job asking more
// cores than any node has is refused (Proxmox would refuse to start its
// VM: "MAX n vcpus allowed per VM on this node"). The nodes' cores are
// read at most every templateListTTL; without Sys.Audit Proxmox shows
// none, and nothing is refused.
func (b *Backend) CheckResources(ctx context.Context, spec sandbox.Spec) error {
	cores := shapeOf(spec.CPU, spec.MemoryBytes).cores
	most, err := b.mostCores(ctx)
	if err != nil || most == 0 || cores <= most {
		return err
	}
	return &delegate.FieldError{Field: "manifest.resources.cpu",
		Rule: fmt.Sprintf("%d cores is more than any node of the Proxmox cluster has (at most %d)", cores, most)}
}

// mostCores is the most cores an online node has (0: unknown).
func (b *Backend) mostCores(ctx context.Context) (int, error) {
	b.tplMu.Lock()
	most, read := b.cores, b.coresRead
	b.tplMu.Unlock()
	if !read.IsZero() && time.Since(read) < templateListTTL {
		return most, nil
	}
	nodes, err := b.c.ClusterResources(ctx, pve.ResourceNode)
	if err != nil {
		return 0, fmt.Errorf("proxmox: list nodes: %w", err)
	}
	most = 0
	for _, n := range nodes {
		if n.Type == "node" && n.Status == "online" {
			most = max(most, int(n.MaxCPU))
		}
	}
	b.tplMu.Lock()
	b.cores, b.coresRead = most, time.Now()
	b.tplMu.Unlock()
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
func (l *templateList) refresh(b *Backend) {
	l.mu.Lock()
	if l.reading {
		l.mu.Unlock()
		return
	}
	l.reading = true
	l.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := b.readTemplates(ctx); err != nil {
			b.log.Debug("refresh the template list", "err", err)
		}
		l.mu.Lock()
		l.reading = false
		l.mu.Unlock()
	}()
}

// readTemplates reads the cluster's VMs, keeps them as the template list
// and returns them.
func (b *Backend) readTemplates(ctx context.Context) ([]pve.Resource, error) {
	resources, err := b.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return nil, err
	}
	b.tplList.mu.Lock()
	b.tplList.resources, b.tplList.read = resources, time.Now()
	b.tplList.mu.Unlock()
	return resources, nil
}
