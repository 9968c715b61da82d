// Package pvesim is a Proxmox VE API simulator, faithful enough to prove
// delegate's Proxmox backend without a Proxmox host: an HTTPS server with
// a self-signed certificate (clients pin its SHA-256 fingerprint) that
// speaks the API's JSON format under /api2/json, for the methods the
// backend uses.
//
// # What it checks, like the real server
//
// Every request goes through pveproxy's order of checks: the /api2/json
// prefix and method (501), the API token (401 "No ticket" or
// "Authentication failed!", delayed 3 s), body rules (501 for a body on
// GET/DELETE or over 512 KiB), the route (501 "Method 'GET /x' not
// implemented"), parameters contradicting the path (400), the method's
// permissions against the token's privileges (403 "Permission check
// failed (/vms/100, VM.Allocate)"), the node (500 for an unknown node,
// 595 for an offline one), and then the parameters against the official
// schema (schema/pve-api-subset.json, PVE 9.x): unknown parameters, missing
// ones, types (booleans are 0/1 or JSON booleans only; "true" is refused),
// enums, minimum/maximum, maxLength, patterns, the named formats that
// matter (pve-vmid, pve-node, dns-name, tags, MAC addresses, storage and
// pool ids, config ids, CIDR, disk sizes...) and property strings (net0,
// agent, memory...), with PVE::JSONSchema's messages in a 400
// {"data":null,"errors":{param:msg},"message":"Parameter verification failed.\n"}.
// Errors carry their message in the HTTP reason phrase, as Proxmox does
// (the connection closes after an error, as pveproxy's does).
//
// # What it simulates
//
// A cluster of nodes with finite memory (starting a VM that does not fit
// fails its task like KVM does) and cores (a VM may not have more vCPUs
// than its node; like PVE, the sum may exceed the node's cores). Templates
// (template: 1) with a base disk; linked clones (the default for a
// template) and full clones; a linked clone of a non-template is refused,
// as are storage/format on a linked clone and a vmid that exists. A clone
// locks the new VM ("VM is locked (clone)") for the length of its task
// and holds the source's config lock, so what needs it exclusively times
// out. Long operations (clone, start, stop, shutdown, destroy, resize,
// config by POST) return a UPID and run as tasks for a configurable time;
// task status has no endtime and an exitstatus only once stopped; task
// logs end with "TASK OK" or "TASK ERROR: ...". GET /cluster/nextid is a
// string, booleans are 0/1, config integers are numbers and memory a
// string, and bytes in JSON strings are one character per byte, like
// Perl writes them.
//
// # Guests
//
// A started VM gets a sandbox of its own from a sandbox.Backend (by
// default the local namespace backend, so tests must call local.Reexec
// first in TestMain), sized by its vCPUs, memory and disk; after
// Options.BootDelay its guest agent answers. The agent is a POSIX shell
// loop, the sandbox's one command, which really runs what agent/exec
// asks: argv without a shell, stdin from input-data, stdout and stderr
// captured apart (16 MiB each, then out-truncated), exit code or signal.
// It reads and writes files for agent/file-read and agent/file-write as
// the guest's user, so paths mean what they mean to the guest's
// commands: /workspace and /tmp are writable, the rest of the root is
// the host's /usr, /etc... read-only ("Read-only file system"), missing
// files fail with the agent's "failed to open file '...' (mode: 'r'): No
// such file or directory". Stopping or destroying the VM destroys its
// sandbox and kills everything in it.
//
// # Known differences from a real guest
//
//   - The agent keeps its spool in /workspace/.qga (requests, stdout and
//     stderr of running commands): the guest's commands can see it.
//   - Commands run as the sandbox's user (uid 1000), not root, in "/", with
//     the agent's environment (PATH, LANG=C.UTF-8).
//   - The agent's shell reports death by signal N as exit status 128+N;
//     the simulator reports codes 129..192 as signal N, so a command that
//     exits with such a code on purpose is reported killed.
//   - The guest has no network (the local backend has none):
//     network-get-interfaces reports loopback and an eth0 with the VM's
//     MAC and an address derived from its vmid.
//   - A stop loses the guest's disk: the next start boots a fresh sandbox.
//   - Config changes apply at once, also to a running VM (no pending
//     section); memory and vCPUs of a running VM count as started.
//   - Only API tokens authenticate (no tickets); a token's privileges
//     hold on every path (no ACL tree, no privilege separation).
//   - Methods outside the subset answer 501 although real PVE has them
//     (the simulator logs a warning naming them).
//
// # Faults
//
// Options.Faults and SetFaults inject failures: a share of requests
// answered 500 before they act (ErrorRate), tasks of a type that fail
// with a given exit status and leave no trace (TaskFailures), guest
// agents that never come up (AgentDown), and offline nodes (also
// SetNodeOnline). Options.TaskDelays makes tasks of a type slow.
//
// # Introspection
//
// VMs, Tasks and Requests show the state and every request received
// (method, path, parameters, status, reason), so a test can check each
// request a client sent against the schema with Schema.Validate.
package pvesim
