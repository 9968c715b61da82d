package proxmox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delegate-dev/delegate/pve"
	"github.com/delegate-dev/delegate/sandbox"
)

// Starting the job's command. Nothing of the job travels in an argument
// list the guest agent sees: qemu-ga logs every exec's argument list to
// the guest's journal, PVE 8.0-8.3 refuse a request body over 64 KiB and
// Linux an argument over 128 KiB. Instead the whole runner, the
// command's environment (secrets included) and its inputs (the task, a
// script) go into one file, its "bundle", written with agent/file-write
// in parts of at most pve.MaxFileWrite bytes into guestDir (which only
// root, the agent's user, may enter); one agent/exec then runs
// bootstrapScript, a constant, with the bundle's path: it joins the parts
// and runs the bundle with /bin/sh.
//
// The bundle is a shell script followed by its data. The script (only
// delegate's constants, numbers and quoted paths: its header and
// runnerBody) copies each input out of the data into a directory of the
// command's own (<bundle>.d/in, mode 0700; the files 0400), the
// environment into <bundle>.d/env, removes the bundle, and becomes the
// runner: the status channel's reader, the deadline's watchdog, the
// streams' supervisor and the command, which starts with exactly the
// environment of the env file (env -i, then the file sourced) and
// $DELEGATE_INPUTS.
//
// The runner is one unit of its own, so that a restart of the guest agent
// (an upgrade, say) does not kill the job: qemu-ga's children live in
// qemu-guest-agent.service's cgroup, which systemd kills when the service
// stops, whatever session they are in. Where systemd runs (/run/systemd/
// system exists) the bootstrap becomes the runner with systemd-run
// --scope, which moves it to a scope unit of its own (same pid); where it
// does not, setsid puts it in a session of its own, which is all that
// another init's stop of the agent spares (it signals the agent's process
// group), and plain sh where the guest has no setsid.

// guestRun is the prefix of a command's bundle in guestDir ("run-" was
// an older delegate's, in legacyGuestDir).
const guestRun = guestDir + "/cmd-"

// bootstrapScript joins a bundle's parts ($0.p0000, $0.p0001...) into
// $0 (a bundle of one part is written as $0 itself) and runs it in a unit of its own: a systemd scope when $1 (the
// directory that exists where systemd is the init, /run/systemd/system)
// does, else a session of its own.
const bootstrapScript = `b=$0; umask 077; [ -e "$b" ] || { cat -- "$b".p[0-9][0-9][0-9][0-9] >"$b" && rm -f -- "$b".p[0-9][0-9][0-9][0-9]; } || exit 125
if [ -d "$1" ] && command -v systemd-run >/dev/null 2>&1; then exec systemd-run --scope --quiet --collect --unit="delegate-${b##*/}" /bin/sh "$b"; fi
if command -v setsid >/dev/null 2>&1; then exec setsid /bin/sh "$b"; fi
exec /bin/sh "$b"`

// systemdDir exists where systemd is the init (sd_booted).
const systemdDir = "/run/systemd/system"

// runnerBody is the runner, after the header (bundle) has set b (the
// bundle), d (the command's directory), o, e and s (its output and events
// files and its status FIFO, all in d: each command of a VM has its own),
// wd (the working directory), t (seconds to the deadline, 0: none), pl
// (perl), sup (the streams' supervisor), in (the standard input's file)
// and the command as "$@", and copied the inputs.
//
// The status FIFO's reader copies lines into the events file until the
// runner, once the command ended, writes the line "$b" (the bundle's
// path, which the command does not know) into it: then every line the
// command wrote is in the events file before its exit status is, and the
// reader is gone.
//
// The deadline is a backstop that holds when no server watches: a
// watchdog started with the job kills it, and everything it started, when
// the time is up, and marks the exit status ("137:deadline"). The command
// runs in a session of its own (setsid) so that the watchdog can kill its
// whole process group without touching the runner's; it runs in the
// foreground, so that it keeps the signal dispositions a background job
// would lose (SIGINT and SIGQUIT ignored). Its output is redirected by
// launchScript, or given by the supervisor, which exits with its status:
// dash reports a foreground command killed by a signal ("Killed") on the
// stderr the command was given.
const runnerBody = `rm -f -- "$s" "$b" && : >"$e" && : >"$o" && mkfifo -m 0666 -- "$s" || {
  echo "delegate: could not prepare $s, $e and $o" >&2; exit 125; }
( while IFS= read -r l || [ -n "$l" ]; do [ "$l" = "$b" ] && exit 0; printf '%s\n' "$l" >>"$e"; done ) <>"$s" 2>/dev/null &
r=$!
cd -- "$wd" 2>/dev/null || { echo "delegate: cannot enter the working directory $wd" >>"$o"; echo 125 >"$o.exit"; exit 125; }
w=
if [ "$t" -gt 0 ]; then
  ( sleep "$t"; : >"$o.deadline"; p=$(cat -- "$o.pid" 2>/dev/null) && kill -s KILL -- "-$p" "$p" ) >/dev/null 2>&1 </dev/null &
  w=$!
fi
if [ -x "$pl" ]; then
  "$pl" -e "$sup" -- "$o" /usr/bin/env -i /bin/sh -c "$L" "$o" "$d/env" "$in" "$d/in" "$@"
else
  /usr/bin/env -i /bin/sh -c 'exec >>"$0" 2>&1; '"$L" "$o" "$d/env" "$in" "$d/in" "$@"
fi
rc=$?
[ -n "$w" ] && kill "$w" 2>/dev/null
printf '%s\n' "$b" >"$s"; wait "$r"
if [ -e "$o.deadline" ]; then echo "$rc:deadline" >"$o.exit"; else echo "$rc" >"$o.exit"; fi
exit $rc
`

// launchScript starts the command, with an empty environment (env -i)
// to begin with: it records its pid, takes its standard input, sources
// the env file (only positional parameters are used after it: the job's
// variables may have any names) and removes it, sets DELEGATE_INPUTS last,
// and becomes the command in a session of its own. $0 output, $1 env
// file, $2 standard input, $3 inputs directory, then the command.
var launchScript = `echo "$$" >"$0.pid"; exec <"$2"; set -a; . "$1"; set +a; rm -f -- "$1"; DELEGATE_INPUTS=$3; export DELEGATE_INPUTS; shift 3
[ "${DELEGATE_STATUS_FILE-}" = ` + shQuote(StatusFile) + ` ] && DELEGATE_STATUS_FILE=${0%/*}/status
` + pathScript + `
command -v setsid >/dev/null 2>&1 && exec setsid "$@"; exec "$@"`

// pathScript adds to the standard PATH the toolchains the guest has
// (sandbox.ToolchainBins), as the local backend does with its root's: a
// job finds the same tools on both. A PATH the job chose is its own.
var pathScript = func() string {
	s := `if [ "$PATH" = ` + shQuote(sandbox.DefaultPath) + ` ]; then for delegate_tc in`
	for _, d := range sandbox.ToolchainBins {
		s += " " + shQuote(d)
	}
	return s + `; do [ -d "$delegate_tc" ] && PATH=$PATH:$delegate_tc; done; unset delegate_tc; fi`
}()

// inputNameRe is what an input may be called (a file name of its own).
var inputNameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`) })

// envNameRe: the environment is sourced by a shell, so names are shell
// names (as manifests and the engine's own variables are).
var envNameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`) })

// shQuote quotes s for a POSIX shell: exact for any bytes but NUL.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// checkCommand refuses what the guest could not take, naming the field.
func checkCommand(cmd sandbox.Command) error {
	if len(cmd.Args) == 0 || cmd.Args[0] == "" {
		return errors.New("exec: the command has no program (Args[0] is empty)")
	}
	for i, a := range cmd.Args {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("exec: Args[%d] contains a NUL byte", i)
		}
	}
	for i, kv := range cmd.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || !envNameRe().MatchString(k) || strings.ContainsRune(kv, 0) {
			return fmt.Errorf("exec: Env[%d] (%q) must be NAME=VALUE with NAME a shell name ([A-Za-z_][A-Za-z0-9_]*) and no NUL byte", i, k)
		}
	}
	for name := range cmd.Inputs {
		if !inputNameRe().MatchString(name) {
			return fmt.Errorf("exec: input %q: a name is 1 to 64 letters, digits, '.', '_' or '-', not starting with '.', '_' or '-'", name)
		}
	}
	if _, ok := cmd.Inputs[cmd.Stdin]; cmd.Stdin != "" && !ok {
		return fmt.Errorf("exec: Stdin %q names no input", cmd.Stdin)
	}
	if cmd.Dir != "" && (!path.IsAbs(cmd.Dir) || strings.ContainsRune(cmd.Dir, 0)) {
		return fmt.Errorf("exec: working directory %q must be an absolute path", cmd.Dir)
	}
	return nil
}

// bundle builds a command's bundle: the runner's script, then the env
// file and the inputs. The script names each piece by its offset and
// length, as numbers of a fixed width, so that the script's length is
// known before the offsets are.
func (s *vmSandbox) bundle(cmd sandbox.Command, run string, now time.Time) []byte {
	dir := cmd.Dir
	if dir == "" {
		dir = workspace
	}
	var env bytes.Buffer
	for _, kv := range cmd.Env {
		k, v, _ := strings.Cut(kv, "=")
		env.WriteString(k + "=" + shQuote(v) + "\n")
	}
	type piece struct {
		dst  string // inside the command's directory
		data []byte
	}
	pieces := []piece{{"env", env.Bytes()}}
	names := make([]string, 0, len(cmd.Inputs))
	for name := range cmd.Inputs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		pieces = append(pieces, piece{"in/" + name, cmd.Inputs[name]})
	}
	stdin := "/dev/null"
	if cmd.Stdin != "" {
		stdin = run + ".d/in/" + cmd.Stdin
	}
	var args []string
	for _, a := range cmd.Args {
		args = append(args, shQuote(a))
	}
	num := func(n int) string { return fmt.Sprintf("%012d", n) }
	header := func(offsets []int) string {
		var h strings.Builder
		h.WriteString("b=$0 d=$0.d\n")
		h.WriteString("o=\"$d\"/output e=\"$d\"/events s=\"$d\"/status\n")
		fmt.Fprintf(&h, "wd=%s t=%d pl=%s in=%s\n", shQuote(path.Clean(dir)), deadlineSeconds(cmd.Deadline, now), shQuote(s.b.cfg.GuestPerl), shQuote(stdin))
		fmt.Fprintf(&h, "sup=%s\nL=%s\n", shQuote(supervisorScript), shQuote(launchScript))
		h.WriteString(`x() { tail -c "+$1" -- "$b" | head -c "$2" >"$d/$3"; }` + "\n")
		h.WriteString(`if ! { umask 077 && mkdir -p -- /workspace "$d/in"`)
		files := ""
		for i, p := range pieces {
			fmt.Fprintf(&h, " && x %s %s %s", num(offsets[i]), num(len(p.data)), p.dst)
			files += ` "$d/` + p.dst + `"`
		}
		h.WriteString(" && chmod 0400 --" + files)
		h.WriteString("; }; then echo \"delegate: could not write the command's inputs in $d\" >&2; exit 125; fi\n")
		h.WriteString("umask 022\n")
		h.WriteString("set -- " + strings.Join(args, " ") + "\n")
		h.WriteString(runnerBody)
		return h.String()
	}
	offsets := make([]int, len(pieces))
	n := len(header(offsets)) + 1 // tail -c +N counts from 1
	for i, p := range pieces {
		offsets[i] = n
		n += len(p.data)
	}
	out := []byte(header(offsets))
	for _, p := range pieces {
		out = append(out, p.data...)
	}
	return out
}

// Exec implements sandbox.Instance, honouring every field of the command:
// Args, Env and Inputs in the bundle, Stdin, Dir (default /workspace),
// Deadline (a watchdog in the guest) and OutputLimit (no more is read out
// of the guest, and Exit says what was cut).
func (s *vmSandbox) Exec(ctx context.Context, cmd sandbox.Command) (sandbox.Process, error) {
	if err := checkCommand(cmd); err != nil {
		return nil, err
	}
	var nonce [8]byte
	rand.Read(nonce[:])
	run := guestRun + hex.EncodeToString(nonce[:])
	data := s.bundle(cmd, run, time.Now())
	name := func(i int) string { return fmt.Sprintf("%s.p%04d", run, i) }
	if len(data) <= pve.MaxFileWrite {
		name = func(int) string { return run } // one part: the bundle itself, nothing to join
	}
	if err := s.writeParts(ctx, data, name); err != nil {
		return nil, fmt.Errorf("exec %s in VM %d: write the command: %w", cmd.Args[0], s.vmid, err)
	}
	var pid int
	err := s.onNode(ctx, func(node string) (err error) {
		pid, err = s.b.c.AgentExec(ctx, node, s.vmid, []string{"/bin/sh", "-c", bootstrapScript, run, systemdDir}, nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("exec %s in VM %d: %w", cmd.Args[0], s.vmid, agentHint(err))
	}
	p := newProcess(s, pid, max(0, cmd.OutputLimit), run)
	p.started = time.Now()
	return p, nil
}

// writeParts writes data with file-write in parts of at most
// pve.MaxFileWrite bytes, part i as name(i), in guestDir. A guest without
// guestDir (a VM made by an older delegate) gets it made, once.
func (s *vmSandbox) writeParts(ctx context.Context, data []byte, name func(i int) string) error {
	for i := 0; i == 0 || i*pve.MaxFileWrite < len(data); i++ {
		part := name(i)
		chunk := data[i*pve.MaxFileWrite : min(len(data), (i+1)*pve.MaxFileWrite)]
		write := func(node string) error { return s.b.c.AgentFileWrite(ctx, node, s.vmid, part, chunk) }
		err := s.onNode(ctx, write)
		if err != nil && i == 0 && missingDir(err) {
			if err = s.prepare(ctx); err == nil {
				err = s.onNode(ctx, write)
			}
		}
		if err != nil {
			return fmt.Errorf("part %d: %w", i, agentHint(err))
		}
	}
	return nil
}

// missingDir: the agent could not create a file for lack of its directory.
func missingDir(err error) bool {
	return pve.IsAgentError(err) && strings.Contains(err.Error(), "No such file or directory")
}

// prepareScript makes guestDir, which only the agent's user (root) may
// enter: files the agent creates are mode 0666 (qemu-ga's
// safe_open_or_create), so the parts of a bundle must be where no one
// else can reach them.
// A guestDir someone else made (its parent, /var/tmp, is anyone's to
// write in) or a link is refused.
const prepareScript = `[ -d /var/tmp ] || mkdir -p -m 1777 /var/tmp
umask 077; mkdir -p -m 0700 -- "$0" && [ ! -L "$0" ] && [ -O "$0" ] && chmod 0700 -- "$0" && mkdir -p -m 0755 -- ` + workspace + ` ||
{ echo "delegate: $0 must be a directory of the agent's user" >&2; exit 1; }`

// prepare readies a new guest for commands: guestDir, and the workspace
// (where a workspace's archive arrives, archive.go).
func (s *vmSandbox) prepare(ctx context.Context) error {
	if _, err := s.runOK(ctx, []string{"/bin/sh", "-c", prepareScript, guestDir}); err != nil {
		return fmt.Errorf("prepare VM %d: %w", s.vmid, err)
	}
	return nil
}

// agentHint explains an agent that refuses what delegate needs.
func agentHint(err error) error {
	if cmd := pve.AgentDisabled(err); cmd != "" {
		return fmt.Errorf("the guest agent does not allow %s (%s): %w", cmd, agentAllowFix, err)
	}
	if pve.IsAgentError(err) && strings.Contains(err.Error(), "Failed to execute child process") && strings.Contains(err.Error(), "(Permission denied)") {
		// SELinux confines qemu-ga on RHEL, Rocky, Alma and Fedora.
		return fmt.Errorf("the guest agent may not run programs: on a RHEL-family guest SELinux confines it; "+
			"allow it in the template: setsebool -P virt_qemu_ga_run_unconfined on: %w", err)
	}
	return err
}
