package proxmox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// Ownership. A VM belongs to a delegate instance and a job by what
// delegate itself sets, never by what a clone inherits from its template:
//
//   - its name, given in the clone call itself: "delegate-<instance>-<job>".
//     Proxmox writes it with the new VM's first config, so no moment exists
//     when the VM carries another owner's name.
//   - its tags, written right after the clone: "delegate",
//     "delegate-<instance>" and the job's id. Tags are what
//     /cluster/resources shows at once (the name appears there only once
//     the VM has RRD data, ~10 s later), so listings go by the tags; a clone
//     inherits its template's tags until then, so nothing destructive goes
//     by them: stop and delete first read the VM's config and compare its
//     name.
//
// The instance id keeps delegate servers that share a cluster apart, and
// stays the same across restarts of one server (StableInstanceID), so
// that a restarted server recovers its VMs.

// Tag marks every VM delegate makes (for people browsing the cluster).
const Tag = "delegate"

var instanceRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]{4,16}$`) })

// checkInstance validates an instance id: it goes into names and tags.
func checkInstance(id string) error {
	if !instanceRe().MatchString(id) {
		return fmt.Errorf("proxmox: instance id %q must be 4 to 16 lower-case letters and digits", id)
	}
	return nil
}

// NewInstanceID makes a random instance id.
func NewInstanceID() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// instanceFile holds a data dir's instance id.
const instanceFile = "proxmox-instance"

// StableInstanceID returns the instance id kept in dir, creating it the
// first time: every server run on the same data dir is the same instance
// (it finds its VMs again after a restart), and servers with their own
// data dirs never touch each other's VMs.
func StableInstanceID(dir string) (string, error) {
	path := filepath.Join(dir, instanceFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		// Written aside, then linked into place: a link never replaces a
		// file, so two servers starting together on one data dir agree,
		// and no reader ever sees the file half-written.
		tmp, terr := os.CreateTemp(dir, instanceFile+".*")
		if terr != nil {
			return "", terr
		}
		defer os.Remove(tmp.Name())
		_, werr := tmp.WriteString(NewInstanceID() + "\n")
		if cerr := tmp.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return "", werr
		}
		if lerr := os.Link(tmp.Name(), path); lerr != nil && !errors.Is(lerr, fs.ErrExist) {
			return "", lerr
		}
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(b))
	if err := checkInstance(id); err != nil {
		return "", fmt.Errorf("%s: %w (delete the file to make a new one, which forgets the VMs of the old one)", path, err)
	}
	return id, nil
}

// owner names what a VM belongs to: an instance and a job.
type owner struct {
	instance string
	job      string
}

// vmName is the name a VM of this owner gets in its clone call.
func (o owner) vmName() string { return namePrefix(o.instance) + tagOf(o.job) }

// instanceTag marks the VMs of one instance.
func instanceTag(instance string) string { return Tag + "-" + instance }

// tags are the tags written right after the clone: a job's VM has its
// job's id, a pool VM the pool's tag (its readiness is another tag); and
// every write of them stamps the VM seen now (gc.go).
func (o owner) tags() []string {
	if o.pool() {
		return []string{Tag, instanceTag(o.instance), PoolTag, seenTag(time.Now())}
	}
	return []string{Tag, instanceTag(o.instance), tagOf(o.job), seenTag(time.Now())}
}

// pool reports whether the owner is the warm pool: then job is
// "pool-<id>", not a job's id.
func (o owner) pool() bool { return strings.HasPrefix(o.job, "pool-") }

// namePrefix starts the name of every VM of an instance.
func namePrefix(instance string) string { return Tag + "-" + instance + "-" }

// owns reports whether a VM's config says it is this owner's. An owner
// without a job (a sandbox id of an older server) owns every VM of its
// instance.
func (o owner) owns(cfg pve.VMConfig) bool {
	if bool(cfg.Template) {
		return false
	}
	if o.job == "" {
		rest, ok := strings.CutPrefix(cfg.Name, namePrefix(o.instance))
		return ok && isOwnerID(rest)
	}
	return cfg.Name == o.vmName()
}

// tagOf makes a job id a valid Proxmox tag (lower case, [a-z0-9_+.-]).
func tagOf(jobID string) string {
	var sb strings.Builder
	for _, r := range strings.ToLower(jobID) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("_+.-", r) {
			sb.WriteRune(r)
		}
	}
	return sb.String()
}

// listedJob reads a /cluster/resources entry: the job of a VM of this
// instance, or "". The name, set in the clone call, decides when the
// entry has it; until then (a VM seconds old has no name in the listing)
// the tags written after the clone do.
func listedJob(r pve.Resource, instance string) string {
	if r.Type != "qemu" || bool(r.Template) {
		return ""
	}
	if r.Name != "" {
		if job, ok := strings.CutPrefix(r.Name, namePrefix(instance)); ok && isOwnerID(job) {
			return job
		}
		return ""
	}
	tags := r.TagList()
	if !slices.Contains(tags, instanceTag(instance)) {
		return ""
	}
	for _, t := range tags {
		if isOwnerID(t) {
			return t
		}
	}
	return ""
}

// isOwnerID: s is the id of what a VM is made for, a job ("job-…") or a
// kept sandbox opened without one ("sbx-…"); tags keep either as it is
// (both are lower case already).
func isOwnerID(s string) bool {
	return strings.HasPrefix(s, "job-") || strings.HasPrefix(s, "sbx-")
}

// A sandbox id names the VM and the job (or kept sandbox) it was made
// for: "vm-105-job-x", "vm-106-sbx-y".
// The vmid alone is not enough, since Proxmox reuses the vmid of a
// destroyed VM. (Ids of older servers, "vm-105", still parse.)
func sandboxID(vmid int, job string) string {
	id := "vm-" + strconv.Itoa(vmid)
	if job != "" {
		id += "-" + job
	}
	return id
}

// parseID reads a sandbox id.
func parseID(id string) (vmid int, job string, err error) {
	rest, ok := strings.CutPrefix(id, "vm-")
	num, job, hasJob := strings.Cut(rest, "-")
	n, aerr := strconv.Atoi(num)
	if !ok || aerr != nil || n < 100 || n > 999999999 || (hasJob && !isOwnerID(job)) {
		return 0, "", fmt.Errorf("proxmox: %q is not a sandbox id: %w", id, sandbox.ErrGone)
	}
	return n, job, nil
}
