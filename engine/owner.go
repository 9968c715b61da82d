package engine

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// An owner names the engine driving a job: host, pid, the process's start
// time (so a recycled pid is not mistaken for it) and a nonce.
func newOwner() string {
	host, _ := os.Hostname()
	var nonce [4]byte
	rand.Read(nonce[:])
	pid := os.Getpid()
	return fmt.Sprintf("%s/%d/%s/%s", host, pid, procStart(pid), hex.EncodeToString(nonce[:]))
}

// procStart is the start time of a process in clock ticks since boot
// (field 22 of /proc/PID/stat), or "" if unknown.
func procStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command name may contain spaces and parentheses: skip past the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return ""
	}
	return fields[19]
}

// ownerAlive says whether the engine named by owner may still be running.
// An engine on another host is assumed alive: we cannot see it.
func ownerAlive(owner string) bool {
	parts := strings.Split(owner, "/")
	if len(parts) != 4 {
		return false
	}
	host, _ := os.Hostname()
	if parts[0] != host {
		return true
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid <= 0 {
		return false
	}
	if pid == os.Getpid() {
		// One engine per process (the caller skips its own jobs), so an
		// owner with our pid is a previous process that had the same pid.
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && err != syscall.EPERM {
		return false
	}
	// A server killed and not reaped yet (a zombie: its parent has not
	// waited for it) runs nothing any more.
	if state := procState(pid); state == "Z" || state == "X" {
		return false
	}
	return procStart(pid) == parts[2]
}

// procState is a process's state letter (field 3 of /proc/PID/stat: R,
// S, D, Z…), or "" if unknown.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 1 {
		return ""
	}
	return fields[0]
}
