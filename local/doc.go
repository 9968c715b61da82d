// Package local is delegate's embedded default backend: a Linux namespace
// sandbox on the machine the server runs on, with no external dependencies.
//
// Each sandbox is a directory under Config.Dir. Its process tree is
//
//	server → shim (SelfExe __sandbox-shim <dir>, its own session)
//	       → init (pid 1 of new user, mount, pid, net, ipc, uts and
//	               cgroup namespaces)
//	       → job  (the command, inside uid/gid 1000, no capabilities,
//	               no_new_privs, a seccomp filter: a deny-list of syscalls,
//	               io_uring refused, sockets of unix, inet, inet6 and
//	               netlink families only)
//
// The shim, not the server, owns the job: it collects the job's stdout and
// stderr (two pipes) into one file, in the order it reads them, with a
// record of which bytes are from which (streams.go), and records how the
// job ended in exit.json, so the server can be
// restarted (or killed) while jobs run and re-attach to them afterwards.
//
// The server computes everything the shim and init need, a plan (plan.go:
// the command, its environment, the limits, and the steps that build the
// root filesystem), and writes it into the shim's descriptor 3; the
// environment never touches the disk. The helpers that carry a plan out
// exist twice, from the same plan:
//
//   - in C (one *_linux.c file per role beside its Go twin: the shim,
//     init, the keeper, a command's shim; helper_linux.h lists them and
//     holds what they share), compiled into binaries built with cgo (the
//     default where a C compiler is installed: `go build`, `go run`): a
//     constructor catches the shim's start before the Go runtime does,
//     and init is a fork of the shim, not a second program. A sandbox
//     then starts in a few milliseconds and its two supervisors take
//     well under a MiB (docs/BENCHMARKS.md).
//   - in Go (shim_linux.go, init_linux.go), for binaries built without
//     cgo and for sandboxes with network, whose helper only the Go shim
//     starts: two start-ups of this binary per sandbox, slower, larger.
//
// Isolation: the job sees a read-only root built from the host's /usr,
// /bin, /sbin, /lib*, /etc (or a template: a root filesystem named in
// Config.RootfsDir, never a path a job chooses), a writable /workspace,
// a private /tmp, its own /proc, a minimal /dev, its command's inputs
// (inputs.go: a read-only tmpfs of the command's own at InputsDir, which
// keeps the task and the script out of every argument list on the host),
// an empty network namespace
// with only loopback, and inside uids 0..65535 mapped to host ids of its
// own, so host files owned by root appear as nobody's.
//
// Host uids (uids.go): each sandbox has a slot of 65536 host uids and
// gids of its own, BASE..BASE+65535, from the operator's range
// (Config.UIDs, DELEGATE_SANDBOX_UIDS; by default 1879048192-2147352575,
// 4094 slots), which New checks that no entry of /etc/subuid,
// /etc/subgid, /etc/passwd or /etc/group overlaps. Inside, uid 0 (init)
// is host BASE and the job's uid 1000 host BASE+1000, which owns the
// workspace and every file the server writes there. BASE also owns the
// sandbox's user namespace (the shim clones init with that effective
// uid), so the kernel charges what the sandbox holds of per-user budgets
// (inotify, fanotify, message queues, signals) to BASE, not to root or
// to another sandbox; init also lowers the namespace's own
// /proc/sys/user limits. A slot is claimed in a registry shared by every
// delegate on the host (/run/delegate/uids/BASE, naming the sandbox
// directory) when the sandbox is made, recorded in its state.json
// ("hostUid"), where a restarted server (or any later command in that
// sandbox) finds it again, and released when the sandbox is destroyed; a
// claim whose sandbox directory is gone is free again. A sandbox recorded
// without "hostUid" (made by a server before slots) has BASE 100000.
//
// Network: none but the sandbox's own loopback, unless Spec.Network asks
// for egress. Then a user-mode network helper on the host, pasta (package
// passt, preferred) or slirp4netns, found on the server's PATH at Create,
// serves a tap device in the sandbox's network namespace (10.0.2.100/24,
// gateway 10.0.2.2, DNS forwarder 10.0.2.3, which a generated
// /etc/resolv.conf names). The job reaches what the host reaches, except
// the host's loopback: the helpers' mappings of the gateway (and pasta's
// mirroring of host ports) onto the host's 127.0.0.1 are switched off. A
// service listening on the host's other addresses is reachable. The shim
// starts the helper before it lets the job run, puts it in the sandbox's
// cgroups once it is ready, records it (net.json) and ends it with the
// job; Kill and Destroy end it too. The helper runs as root, in a mount
// namespace of its own whose mounts are all private: what it mounts and
// unmounts to confine itself never propagates to the host's (shared, on
// a systemd host) mounts. It runs in the sandbox's pid namespace, so it
// ends with the sandbox's init whatever ends that (the job, a kill, the
// death of the shim); the job sees it there and can do nothing to it.
//
// Many commands (Spec.MultiExec, a kept sandbox; keeper_linux.go): one
// init for them all, made when the sandbox is, and a supervisor of its
// own, the keeper:
//
//	server → keeper (SelfExe __sandbox-shim <dir>, its own session)
//	       → init (pid 1 of the sandbox's namespaces, its root built
//	               once, for the sandbox's lifetime)
//	         → each command, forked by init
//	server → command shim (SelfExe __sandbox-shim <dir>/execs/<id>)
//
// A command's shim works in a directory of its own (execs/<id>: its
// exec.json, output, exit.json). init gets, through the keeper, the
// descriptors of the command's plan, stdout, stderr and a socket of the
// shim's: the C keeper, asked by the server on its root-only socket
// ("control"), makes them itself, sends them to init and then forks the
// command's shim, which finds them made; with the Go keeper the server
// starts the shim, which makes them and sends them through that socket.
// init forks the command, which
// takes a cgroup of its own below the sandbox's, a mount namespace and
// a /run of its own (its status channel, its inputs), drops the
// capability bounding set, applies the seccomp filter and becomes the
// job's user, from inside: no host process enters the sandbox. The
// commands share the sandbox's pid namespace (ps and kill reach what
// another command left running), its files, /tmp, network and limits:
// they trust each other. A command's deadline and Kill end its own
// cgroup (and process group), not the sandbox; what it leaves in the
// background runs on under init. The keeper ends init, and with it every
// process of the sandbox, at Spec.Expires, with no server; a restarted
// server finds the keeper through the sandbox directory (Recover). With
// the C helpers in cgroup v1 init holds a spare fork ready, placed in the
// next command's group ahead of its request (the fork and the move off
// the command's way), on a socket whose other end the keeper holds: the
// keeper hands the spare the request itself and tells init only which
// command it became, for its end. A
// sandbox whose network is a network helper's runs one command (the
// helper serves one); on the egress proxy's network its commands share
// it.
//
// Pause (sandbox.Pauser): the cgroup freezer stops every process of the
// sandbox where it is, memory kept: cgroup v2 freezes the sandbox's
// group; v1 has the sandbox's own group in the freezer hierarchy, into
// which Pause moves the sandbox's processes, frozen as they arrive.
//
// Limits: memory, cpu and pids through cgroups (v2 when the unified
// hierarchy has those controllers, else v1). The workspace is a tmpfs of
// Spec.DiskBytes; tmpfs pages are memory, so what a job writes to
// /workspace or /tmp also counts against its memory limit.
//
// What the job can read: everything world-readable in the host's /usr,
// /bin, /sbin, /lib* and /etc. Keep secrets (delegate's own configuration
// included) out of world-readable files there.
//
// Deployment: the server must run as root. Shims are detached (own
// session) so that jobs survive a server restart; a service manager must
// not kill the whole control group when it stops the server (systemd:
// KillMode=process), or running jobs die with it and are reported lost.
// A kernel.core_pattern that pipes to a helper (systemd-coredump, apport)
// is handed the crashes of jobs too, as root on the host, whatever the
// sandbox's RLIMIT_CORE: keep it a plain file name on such a host.
//
// The shared kernel makes this weaker than a virtual machine; keep the
// Proxmox backend for hostile code.
//
// The server's side, by part (each with one job, made by New, calling
// another only through a small interface of its own): Backend makes,
// recovers, lists and destroys sandboxes (backend_linux.go); sbox is one
// sandbox (sandbox_linux.go, files_linux.go, archive_linux.go); the host
// uid slots are uidRegistry (uids.go), the roots a template or a tool
// directory may give roots (template_linux.go, tools_linux.go), the
// plans planner (plan_linux.go), the supervisors' start shims
// (shims_linux.go), the network helpers and the namespaces readied ahead
// networks and netnsPool (net_linux.go, netns_linux.go), the caches
// caches (cache_linux.go), the egress proxy's listeners proxies
// (egress_linux.go), and what the server holds of its sandboxes in
// memory liveSet (live_linux.go).
//
// The helpers run before main of any program that links this package
// (see Reexec), so such a program is its own SelfExe.
package local
