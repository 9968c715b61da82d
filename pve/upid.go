package pve

import (
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// UPID is a decoded Proxmox task id:
// UPID:<node>:<pid %08X>:<pstart %08X>:<starttime %08X>:<type>:<id>:<user>:
type UPID struct {
	Node      string
	PID       int
	PStart    int64 // process start, in clock ticks since boot
	StartTime time.Time
	Type      string // qmclone, qmstart, ...
	ID        string // what it is about, e.g. the vmid ("" for some types)
	User      string // user@realm, or user@realm!token
	raw       string
}

// pstart may have 9 hex digits on long-running hosts.
var upidRe = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):([^:\s]+):([^:\s]*):([^:\s]+):$`)
})

// ParseUPID decodes a task id.
func ParseUPID(s string) (UPID, error) {
	m := upidRe().FindStringSubmatch(s)
	if m == nil {
		return UPID{}, fmt.Errorf("pve: %q is not a UPID", s)
	}
	pid, _ := strconv.ParseInt(m[3], 16, 64)
	pstart, _ := strconv.ParseInt(m[4], 16, 64)
	start, _ := strconv.ParseInt(m[5], 16, 64)
	return UPID{Node: m[1], PID: int(pid), PStart: pstart, StartTime: time.Unix(start, 0),
		Type: m[6], ID: m[7], User: m[8], raw: s}, nil
}

// String returns the task id as Proxmox writes it.
func (u UPID) String() string {
	if u.raw != "" {
		return u.raw
	}
	return fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%s:%s:", u.Node, u.PID, u.PStart, u.StartTime.Unix(), u.Type, u.ID, u.User)
}
