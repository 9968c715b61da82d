package proxmox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/pve"
)

// Fleet hygiene. A delegate server that is gone for good (its data dir
// lost, its host rebuilt) leaves its VMs behind, its warm pool among
// them, and no other server touches them: they are another instance's.
// So each server stamps its VMs with the time it last saw them, a tag
// "delegate-seen-<unix seconds>" written with every write of their tags
// and again every StampInterval, and "delegate proxmox gc" (GC) removes
// the VMs of any instance whose stamp is older than it is told
// (--older-than, a day by default): judged by what Proxmox shows alone,
// never by a store, so that another live server's VMs are safe whatever
// this one knows.

// SeenTagPrefix starts the tag that says when a VM's server last saw it.
const SeenTagPrefix = Tag + "-seen-"

// DefaultStampInterval is how often a server stamps its VMs.
const DefaultStampInterval = 5 * time.Minute

func seenTag(t time.Time) string { return SeenTagPrefix + strconv.FormatInt(t.Unix(), 10) }

// lastSeen reads a VM's stamp; ok is false when it has none.
func lastSeen(tags []string) (time.Time, bool) {
	for _, t := range tags {
		if s, ok := strings.CutPrefix(t, SeenTagPrefix); ok {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				return time.Unix(n, 0), true
			}
		}
	}
	return time.Time{}, false
}

// restamp is a VM's tags with its stamp made t (the others kept).
func restamp(tags []string, t time.Time) []string {
	out := slices.DeleteFunc(slices.Clone(tags), func(s string) bool { return strings.HasPrefix(s, SeenTagPrefix) })
	return append(out, seenTag(t))
}

// stamper stamps this server's VMs every interval until stopped.
type stamper struct {
	c        *pve.Client
	instance string
	every    time.Duration
	log      *slog.Logger
	// stamped hears of a VM stamped (its config's digest changed): the
	// warm pool keeps its ready VMs' digests.
	stamped func(vmid int, digest string)

	stop context.CancelFunc
	done chan struct{}
	once sync.Once
}

// start runs the stamper in the background (the first round at once).
func (st *stamper) start() {
	ctx, cancel := context.WithCancel(context.Background())
	st.stop, st.done = cancel, make(chan struct{})
	go func() {
		defer close(st.done)
		t := time.NewTicker(st.every)
		defer t.Stop()
		for {
			st.round(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// close stops the stamper and waits for it.
func (st *stamper) close() {
	st.once.Do(func() {
		if st.stop != nil {
			st.stop()
			<-st.done
		}
	})
}

// round stamps every VM of the instance the listing shows, but those
// locked (an operation is at work on them) and those stamped less than
// half an interval ago (a write of their tags did it).
func (st *stamper) round(ctx context.Context) {
	resources, err := st.c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		if ctx.Err() == nil {
			st.log.Warn("stamp this server's VMs: list VMs", "err", err)
		}
		return
	}
	now := time.Now()
	for _, r := range resources {
		tags := r.TagList()
		if r.Type != "qemu" || bool(r.Template) || r.Lock != "" || !slices.Contains(tags, instanceTag(st.instance)) {
			continue
		}
		if seen, ok := lastSeen(tags); ok && now.Sub(seen) < st.every/2 {
			continue
		}
		if err := st.c.SetVMConfig(ctx, r.Node, int(r.VMID), pve.VMConfigUpdate{Tags: restamp(tags, now)}); err != nil {
			if ctx.Err() != nil {
				return
			}
			st.log.Info("could not stamp a VM of this server", "vmid", r.VMID, "err", err)
			continue
		}
		if st.stamped != nil && slices.Contains(tags, PoolTag) {
			if cfg, err := st.c.VMConfig(ctx, r.Node, int(r.VMID)); err == nil {
				st.stamped(int(r.VMID), cfg.Digest)
			}
		}
	}
}

// GCOptions tune a collection.
type GCOptions struct {
	// OlderThan: a VM whose stamp is older is its server's no longer.
	// Default 24 h; at least twice DefaultStampInterval.
	OlderThan time.Duration
	// Unstamped also takes delegate's VMs with no stamp at all (made by
	// a delegate before stamps, whose servers are all gone).
	Unstamped bool
	// Act removes them; without it GC only says what it would remove.
	Act bool
	// PollInterval between a stop's or delete's task polls; default 1 s.
	PollInterval time.Duration
	Logger       *slog.Logger
}

// GCItem is one VM GC found, and what became of it.
type GCItem struct {
	VMID     int
	Node     string
	Name     string
	Instance string // the delegate instance it belongs to
	Why      string // why it is taken
	Removed  bool
	Err      error // removing it failed
}

func (it GCItem) String() string {
	verb := "would remove"
	switch {
	case it.Err != nil:
		verb = "could not remove"
	case it.Removed:
		verb = "removed"
	}
	s := fmt.Sprintf("%s VM %d (%s) on %s: %s", verb, it.VMID, it.Name, it.Node, it.Why)
	if it.Err != nil {
		s += ": " + it.Err.Error()
	}
	return s
}

// GC finds the VMs of delegate instances that no longer stamp them (see
// above) and, with Act, removes them: stopped and destroyed, each after
// its config is read again and still names a delegate VM of that
// instance. Templates, locked VMs and VMs that are not delegate's
// (named delegate-<instance>-… and tagged delegate-<instance>) are never
// taken.
func GC(ctx context.Context, c *pve.Client, opt GCOptions) ([]GCItem, error) {
	if opt.OlderThan == 0 {
		opt.OlderThan = 24 * time.Hour
	}
	if opt.OlderThan < 2*DefaultStampInterval {
		return nil, fmt.Errorf("--older-than %s: must be at least %s (twice the servers' stamp interval)", opt.OlderThan, 2*DefaultStampInterval)
	}
	if opt.PollInterval <= 0 {
		opt.PollInterval = time.Second
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	resources, err := c.ClusterResources(ctx, pve.ResourceVM)
	if err != nil {
		return nil, fmt.Errorf("proxmox: list VMs: %w", privilegeHint(err))
	}
	now := time.Now()
	var out []GCItem
	for _, r := range resources {
		inst, ok := delegateInstance(r)
		if !ok || r.Lock != "" {
			continue
		}
		seen, stamped := lastSeen(r.TagList())
		it := GCItem{VMID: int(r.VMID), Node: r.Node, Name: r.Name, Instance: inst}
		switch {
		case stamped && now.Sub(seen) >= opt.OlderThan:
			it.Why = fmt.Sprintf("instance %s last saw it %s ago (%s)", inst, now.Sub(seen).Round(time.Minute), seen.UTC().Format(time.RFC3339))
		case !stamped && opt.Unstamped:
			it.Why = fmt.Sprintf("instance %s never stamped it (a delegate before stamps made it)", inst)
		default:
			continue
		}
		out = append(out, it)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VMID < out[j].VMID })
	if !opt.Act {
		return out, nil
	}
	cfg := &Config{PollInterval: opt.PollInterval}
	var errs []error
	for i := range out {
		it := &out[i]
		t := newVMTable(c, cfg, log, noRoom{}, noClones{})
		// Its owner as its config names it now: the instance and a job,
		// kept sandbox or pool id (and remove reads it again before each
		// try: a vmid may be reused).
		vc, err := c.VMConfig(ctx, it.Node, it.VMID)
		switch {
		case pve.IsNotFound(err):
			it.Err = errors.New("gone meanwhile")
		case err != nil:
			it.Err = privilegeHint(err)
		default:
			job, ok := strings.CutPrefix(vc.Name, namePrefix(it.Instance))
			if !ok || bool(vc.Template) || !(isOwnerID(job) || strings.HasPrefix(job, "pool-")) {
				it.Err = fmt.Errorf("its config names it %q now: not a VM of instance %s", vc.Name, it.Instance)
				break
			}
			it.Err = t.remove(ctx, it.Node, it.VMID, owner{it.Instance, job})
		}
		if it.Err == nil {
			it.Removed = true
		} else {
			errs = append(errs, fmt.Errorf("VM %d: %w", it.VMID, it.Err))
		}
	}
	return out, errors.Join(errs...)
}

// delegateInstance says whose delegate VM a listing is: its tags hold
// delegate and delegate-<instance>, and its name (once listed) is that
// instance's. Not a template.
func delegateInstance(r pve.Resource) (string, bool) {
	if r.Type != "qemu" || bool(r.Template) {
		return "", false
	}
	tags := r.TagList()
	if !slices.Contains(tags, Tag) {
		return "", false
	}
	for _, t := range tags {
		inst, ok := strings.CutPrefix(t, Tag+"-")
		if !ok || strings.HasPrefix(t, SeenTagPrefix) || t == PoolTag || t == ReadyTag || strings.HasPrefix(t, TemplateTagPrefix) || checkInstance(inst) != nil {
			continue
		}
		if r.Name == "" || strings.HasPrefix(r.Name, namePrefix(inst)) {
			return inst, true
		}
	}
	return "", false
}

// noRoom and noClones stand for placement and the vmid hand-out where
// there are none (a collection outside any server).
type (
	noRoom   struct{}
	noClones struct{}
)

func (noRoom) freed(int)           {}
func (noClones) inFlight(int) bool { return false }
