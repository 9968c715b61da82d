package pve

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// APIError is an error answer of the Proxmox API, in Proxmox's words.
type APIError struct {
	Method     string
	Path       string // below /api2/json
	StatusCode int
	// Reason is the HTTP reason phrase, where Proxmox puts its message
	// (first line only), e.g. "VM is locked (clone)".
	Reason string
	// Errors are the per-parameter messages of a 400.
	Errors map[string]string
	// Message is the body's "message" (PVE 8.4 and later), often the
	// reason with a trailing newline; empty from older servers.
	Message string
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "proxmox: %s %s: %d %s", e.Method, e.Path, e.StatusCode, e.Reason)
	keys := make([]string, 0, len(e.Errors))
	for k := range e.Errors {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%s: %s", sep, k, strings.TrimSpace(e.Errors[k]))
	}
	return b.String()
}

// TaskError is a task that ended with an exit status other than OK.
type TaskError struct {
	UPID       string
	Type       string // qmclone, qmstart...
	ID         string // the VM id the task is about
	ExitStatus string // Proxmox's error text, e.g. "VM is locked (clone)"
	// Log is the tail of the task's log (its last line is "TASK ERROR: ...").
	Log []string
}

func (e *TaskError) Error() string {
	return fmt.Sprintf("proxmox: task %s (%s) failed: %s", e.Type, e.ID, e.ExitStatus)
}

// message is the Proxmox text of an API or task error, "" for others.
func message(err error) (string, int) {
	var api *APIError
	if errors.As(err, &api) {
		return api.Reason, api.StatusCode
	}
	var task *TaskError
	if errors.As(err, &task) {
		return task.ExitStatus, 0
	}
	return "", -1
}

var (
	notFoundRe = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^Configuration file '[^']*' does not exist$|^no such task$`)
	})
	lockedRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(?:VM|CT) is locked \(([^)]+)\)`) })
)

// IsNotFound: the VM (or task) does not exist where it was asked for
// ("Configuration file 'nodes/pve/qemu-server/117.conf' does not exist",
// or a task status "no such task").
func IsNotFound(err error) bool {
	msg, code := message(err)
	if code == http.StatusNotFound {
		return true
	}
	var api *APIError
	if errors.As(err, &api) && api.Errors["upid"] == "no such task" {
		return true
	}
	return code >= 0 && notFoundRe().MatchString(msg)
}

// IsAgentNotRunning: the VM runs but its guest agent does not answer
// (yet): "QEMU guest agent is not running". Poll agent/ping until it does.
func IsAgentNotRunning(err error) bool {
	msg, _ := message(err)
	return msg == "QEMU guest agent is not running"
}

// IsAgentNotConfigured: the VM's config does not enable the agent.
func IsAgentNotConfigured(err error) bool {
	msg, _ := message(err)
	return msg == "No QEMU guest agent configured"
}

// IsVMNotRunning: "VM 100 is not running" (agent calls) or "VM 100 not
// running".
func IsVMNotRunning(err error) bool {
	msg, _ := message(err)
	return regexp.MustCompile(`^VM \d+ (?:is )?not running$`).MatchString(msg)
}

// IsAgentError: the guest agent answered with an error of its own
// ("Agent error: ...", e.g. a file it could not open).
func IsAgentError(err error) bool {
	msg, _ := message(err)
	return strings.HasPrefix(msg, "Agent error: ")
}

// LockReason returns the lock of "VM is locked (clone)" ("clone"), or "".
func LockReason(err error) string {
	msg, _ := message(err)
	if m := lockedRe().FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	return ""
}

// IsLocked: the VM is locked (by a clone, a backup, a migration...).
func IsLocked(err error) bool { return LockReason(err) != "" }

// IsAlreadyExists: the vmid is taken ("unable to create VM 101: config
// file already exists", or nextid's "VM 101 already exists").
func IsAlreadyExists(err error) bool {
	msg, _ := message(err)
	if strings.HasSuffix(msg, "config file already exists") {
		return true
	}
	var api *APIError
	if errors.As(err, &api) {
		for _, m := range api.Errors {
			if strings.HasSuffix(m, "already exists") {
				return true
			}
		}
	}
	return false
}

// IsParamError: 400, the request's parameters were refused (see
// APIError.Errors).
func IsParamError(err error) bool { _, code := message(err); return code == http.StatusBadRequest }

// IsUnauthorized: 401, the token is missing or wrong.
func IsUnauthorized(err error) bool { _, code := message(err); return code == http.StatusUnauthorized }

// IsForbidden: 403, the token lacks a privilege ("Permission check
// failed (/vms/100, VM.Allocate)").
func IsForbidden(err error) bool { _, code := message(err); return code == http.StatusForbidden }

// permanent500 are 500 answers that repeating the same GET cannot change.
var permanent500 = []func(error) bool{IsNotFound, IsAgentNotRunning, IsAgentNotConfigured, IsVMNotRunning, IsAgentError, IsLocked}

// retryableStatus: a GET answered so may succeed if sent again. Proxmox
// answers 500 for nearly everything a handler dies of; most of those are
// lasting (no such VM, agent not running), so they are not retried.
func retryableStatus(err *APIError) bool {
	switch {
	case err.StatusCode == http.StatusNotImplemented:
		return false
	case err.StatusCode == http.StatusInternalServerError:
		for _, p := range permanent500 {
			if p(err) {
				return false
			}
		}
		return true
	case err.StatusCode >= 500: // 502, 503, 504, and pveproxy's 595/596 (node unreachable)
		return true
	case err.StatusCode == http.StatusTooManyRequests:
		return true
	}
	return false
}

var lockTimeoutRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`can't lock file '([^']+)' - got timeout`) })

// LockTimeout returns the file of "can't lock file '/var/lock/...' - got
// timeout" (another operation held the lock too long), or "".
func LockTimeout(err error) string {
	msg, _ := message(err)
	if m := lockTimeoutRe().FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	return ""
}

// VMLockFile is the file Proxmox locks to change a VM's config: a lock
// time-out on it means another operation holds that vmid.
func VMLockFile(vmid int) string {
	return fmt.Sprintf("/var/lock/qemu-server/lock-%d.conf", vmid)
}

// IsLinkedCloneUnsupported: the storage of a disk cannot make linked
// clones ("Linked clone feature is not supported for 'local:...' (scsi0)"):
// clone it full instead.
func IsLinkedCloneUnsupported(err error) bool {
	msg, _ := message(err)
	return strings.Contains(msg, "Linked clone feature is not supported")
}

var permRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^Permission check failed \(([^,]+), ([^)]+)\)`) })

// MissingPrivilege returns the path and privilege of a 403 "Permission
// check failed (/storage/local-lvm, Datastore.AllocateSpace)", or "", "".
func MissingPrivilege(err error) (path, privilege string) {
	msg, _ := message(err)
	if m := permRe().FindStringSubmatch(msg); m != nil {
		return m[1], m[2]
	}
	return "", ""
}

var agentDisabledRe = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^Agent error: Command (guest-[a-z-]+) has been disabled`)
})

// AgentDisabled returns the agent command of "Agent error: Command
// guest-exec has been disabled" (qemu-ga leaves it out: --block-rpcs, or
// RHEL's --allow-rpcs list), or "".
func AgentDisabled(err error) string {
	msg, _ := message(err)
	if m := agentDisabledRe().FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	return ""
}

var protectedRe = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^can't remove (?:VM|CT) \d+ - protection mode enabled`)
})

// IsProtected: the VM cannot be destroyed while its protection option is
// set ("can't remove VM 101 - protection mode enabled").
func IsProtected(err error) bool {
	msg, _ := message(err)
	return protectedRe().MatchString(msg)
}

var cfsLockRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`cfs-lock '[^']+' error: got lock request timeout`) })

// IsClusterLockTimeout: a cluster-wide lock of pmxcfs was held too long
// ("cfs-lock 'storage-ceph' error: got lock request timeout"), e.g. a
// shared storage's, by another node's clone.
func IsClusterLockTimeout(err error) bool {
	msg, _ := message(err)
	return cfsLockRe().MatchString(msg)
}

var renameExistsRe = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`close \(rename\) atomic file '[^']*/qemu-server/\d+\.conf' failed: File exists`)
})

// IsVMIDTakenElsewhere: pmxcfs refused the new VM's config because
// another node has a VM of that vmid ("close (rename) atomic file
// '/etc/pve/nodes/pve2/qemu-server/101.conf' failed: File exists"): two
// clones on different nodes took the same id from nextid.
func IsVMIDTakenElsewhere(err error) bool {
	msg, _ := message(err)
	return renameExistsRe().MatchString(msg)
}
