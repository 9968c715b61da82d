//go:build linux && cgo

/*
 * The sandbox's helpers in C: the shim (supervisor) and init (pid 1), for
 * binaries built with cgo. They do what shim_linux.go and init_linux.go
 * do, from the same plan (plan.go), so that a sandbox costs two small C
 * processes instead of two start-ups of the Go runtime and of every
 * package of this large binary (see docs/BENCHMARKS.md, "Sandbox start").
 *
 * The server starts SelfExe __sandbox-shim <dir> with
 * DELEGATE_SANDBOX_HELPER=c in its environment. A constructor
 * (helper_linux.c) runs at load time, before the Go runtime, and never
 * returns in that case: the process is the shim, and init is a fork of
 * it (no second exec). In every other process of this binary it returns
 * at once.
 *
 * What a sandbox is (its root filesystem, its restrictions, its seccomp
 * filter) is decided in Go: init carries out the plan's steps as they
 * come. The Go helpers remain for builds without cgo and for sandboxes
 * with network (only the Go shim starts a network helper).
 *
 * One file per role, each beside its Go twin, with the same names
 * (run_keeper is runKeeper, and so on):
 *
 *   helper_linux.c   the dispatch at load time (reexec.go), small tools,
 *                    the Go tests' hooks (helper_cgo_linux.go)
 *   plan_linux.c     the plan read, its steps taken (plan.go, plan_linux.go)
 *   shim_linux.c     a sandbox's shim, its output, its record (shim_linux.go)
 *   init_linux.c     init, pid 1 of a sandbox (init_linux.go)
 *   keeper_linux.c   a kept sandbox's keeper, and its init serving
 *                    commands (keeper_linux.go)
 *   command_linux.c  a kept sandbox's command: its shim and its process
 *                    (command_linux.go)
 *   status_linux.c   the status channel's bridge (status_linux.go)
 *   cgroup_linux.c   the sandbox's cgroups (cgroup_linux.go)
 *   owner_linux.c    the user namespace's owner and id maps (owner_linux.go)
 *
 * This header holds what they share: the constants (the Go side's twins,
 * which TestCHelperConstants compares), the plan, the few structures two
 * roles pass between them, and the functions one file calls in another.
 * Those are hidden: they stay inside this binary, as the single file's
 * static functions did.
 *
 * Only async-signal-safe, single-threaded C: no Go, no threads.
 */

#ifndef DELEGATE_HELPER_LINUX_H
#define DELEGATE_HELPER_LINUX_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Shared with Go (TestCHelperConstants compares them). */
#define PLAN_MAGIC 0x44535031u
#define PLAN_VERSION 6u
#define MAX_PLAN_BYTES (64u << 20)
#define SHIM_COMMAND "__sandbox-shim"
#define INIT_COMMAND "__sandbox-init"
#define INIT_ARGV0 "delegate-sandbox-init"
#define PROBE_ARG "--probe"
#define SELECT_ENV "DELEGATE_SANDBOX_HELPER"
#define SELECT_C "c"
#define SETUP_PREFIX "delegate-sandbox: "
#define CODE_SETUP_FAILED 125
#define CODE_CANNOT_EXEC 126
#define CODE_NOT_FOUND 127
#define DEFAULT_OUTPUT_LIMIT (16LL << 20)
#define DEFAULT_JOB_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define FILE_OUTPUT "output"
#define FILE_STREAMS "output.streams"
#define FILE_EVENTS "events"
#define FILE_EVENTS_LATEST "events.latest"
#define FILE_STATUS_FIFO "channel/status"
#define FILE_KILLED "killed"
#define FILE_INIT_PID "init.pid"
#define FILE_EXIT "exit.json"
#define FILE_SHIM_LOG "shim.log"
#define FILE_CONTROL "control"
#define FILE_JOB_PID "job.pid"
#define PLAN_FD 3
#define NETNS_FD 4
#define SERVER_FD 5
#define REQUEST_MAGIC 0x44535231u
#define REQUEST_CGROUP 1u
#define REQUEST_ID 2u
#define REQUEST_SPARE 4u
/* REQUEST_KILLED (keeper to the C init, with REQUEST_SPARE): the command
 * was killed before its request came; the spare ends unstarted. */
#define REQUEST_KILLED 8u
/* REQUEST_TAKEN (keeper to the C init, with one descriptor: the
 * command's ctl): the keeper gave the spare its request itself; init
 * reports the spare's end on ctl, as a command's. */
#define REQUEST_TAKEN 16u
#define REQUEST_FDS 4
#define EXEC_ID_LEN 11 /* "ex-" and 8 hex digits (newID in state.go) */
#define SPARE_MAGIC 0x44535331u
/* SPAWN_MAGIC ("DSX1") starts the server's request that a C keeper
 * start a command's shim itself, a fork of its own (spawn_shim). */
#define SPAWN_MAGIC 0x44535831u
#define SPAWN_FDS 2 /* the plan, the server's pipe (SERVER_FD) */
/* IDLE_MAGIC ("DSI1") starts a command's shim's word to its keeper,
 * once its command is recorded and its output closed, that it can
 * supervise the sandbox's next command (shim_idle), with one
 * descriptor: the keeper's end of a socket pair on which the keeper
 * hands it that command (HANDOFF_MAGIC, "DSH1": start_shim). A shim
 * supervises SHIM_SERVES commands at most (what each leaks stays
 * bounded), waits SHIM_IDLE_MS at most, and the keeper keeps IDLE_SHIMS
 * waiting at most: the next commands' shims are not forks of the keeper,
 * which cost each command about 0.3 ms of CPU (the fork, the copies of the
 * pages the new process writes, its exit). */
#define IDLE_MAGIC 0x44534931u
#define HANDOFF_MAGIC 0x44534831u
#define SHIM_SERVES 256
#define SHIM_IDLE_MS 30000
/* LEAN_AFTER_MS: how long a helper waits before it gives back what it
 * holds and does not need while it waits (lean_poll). */
#define LEAN_AFTER_MS 1000
#define IDLE_SHIMS 2
#define FILE_SHIM_PID "shim.pid"
#define DIR_EXECS "execs"
#define DIR_CHANNEL "channel" /* the commands' status channels, by id */
#define CTL_PLACED 'p'
#define CTL_GO 'g'
#define CTL_KILLED 'k'
/* CTL_PLACED_AHEAD: a spare's word that it is the command, placed ahead
 * of its request, and goes on without waiting for the shim (the keeper
 * checked the kill marker after it gave the spare's group the command's
 * name: a kill after that finds the command in that group). */
#define CTL_PLACED_AHEAD 'P'

/* What a shim is (planMode in plan.go). */
enum { MODE_SANDBOX = 0, MODE_KEEPER, MODE_COMMAND };

enum {
	OP_MOUNT = 1,
	OP_MKDIR,
	OP_TOUCH,
	OP_SYMLINK,
	OP_READ_ONLY,
	OP_PIVOT,
	OP_UNSHARE_CGROUP,
	OP_HOSTNAME,
	OP_LOOPBACK,
	OP_NO_CORE_DUMPS,
	OP_DROP_BOUNDING,
	OP_SECCOMP,
	OP_RESOLV_CONF,
	OP_INPUT,
	OP_SYSCTL,
	OP_NOFILE,
	OP_UNSHARE,
	OP_KEEP_PATH,
	OP_BIND_KEPT,
};

/* Newer than some C libraries' headers. */
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#define DSH_MOUNT_ATTR_RDONLY 0x1ULL
#define DSH_MOUNT_ATTR_NOSUID 0x2ULL
#define DSH_MOUNT_ATTR_NODEV 0x4ULL
struct dsh_mount_attr {
	uint64_t attr_set, attr_clr, propagation, userns_fd;
};
/* statfs f_flags (the ST_ values of statvfs). */
#define DSH_ST_NOEXEC 8
#define DSH_ST_NOATIME 1024
#define DSH_ST_NODIRATIME 2048
#define DSH_ST_RELATIME 4096

struct op {
	uint32_t code;
	uint64_t n;
	char *label;
	char *s[4];
	uint32_t len[4]; /* of s, which may hold NUL bytes (an input's content) */
};

struct plan {
	int64_t output_limit, max_events, max_status_line, latest_every_ns, flood_pause_ns, deadline_ns;
	uint32_t cg_version;
	char *cg_memory, *cg_cpu, *cg_pids;
	uint32_t host_id_base, id_range, job_id;
	char **args, **env;
	char *dir;
	unsigned char *seccomp;
	uint32_t seccomp_len;
	uint32_t nops;
	struct op *ops;
	char *net_name, *net_path;
	uint32_t netns; /* join the network namespace on NETNS_FD */
	char *stdin_path; /* the job's standard input, an input; "": /dev/null */
	uint32_t mode; /* MODE_* */
	int64_t until_ns; /* MODE_KEEPER: when the sandbox ends (Unix ns); 0: never */
	char *cg_freezer;
	char *exec_id, *channel; /* MODE_COMMAND: its name, its status channel */
	uint32_t ahead;		 /* MODE_COMMAND: how many of ops, from the first, a spare takes ahead */
	uint32_t nspare_ops;	 /* MODE_KEEPER: those steps (commandAheadOps in Go) */
	struct op *spare_ops;
	uint32_t spare_idle_ms; /* MODE_KEEPER: how long a spare waits for its command (0: for ever) */
};

/* kept_fd (plan_linux.c) are what OP_KEEP_PATH opened, by slot (an op's
 * n), for OP_BIND_KEPT. */
#define KEPT_SLOTS 2

/* ws_code and ws_signo are how a wait status is reported: the shell's
 * exit code (128 + the signal for a signal), and the signal or 0. */
static inline int ws_code(int ws) { return WIFSIGNALED(ws) ? 128 + WTERMSIG(ws) : WEXITSTATUS(ws); }
static inline int ws_signo(int ws) { return WIFSIGNALED(ws) ? WTERMSIG(ws) : 0; }

/* output_writer keeps the first limit bytes of the job's stdout and stderr, in
 * the order it is given them, with a record of which stream they are
 * from (streams.go), and counts all of them (outputWriter in
 * shim_linux.go). */
enum { STREAM_COMBINED = 0, STREAM_STDOUT = 1, STREAM_STDERR = 2 };
struct output_writer {
	int fd, sfd; /* made with the first byte to keep: a quiet job leaves none */
	int64_t limit, n;
	int cur; /* the stream of the last byte kept */
	int err;
	int64_t recs; /* stream records written */
};

/* outs are the job's stdout and stderr, read through an epoll set: epoll
 * lists ready descriptors in the order they became ready, so when both
 * streams have something the one written to first is read first (poll
 * over two pipes cannot tell; the kernel keeps no order between them).
 * Each ready stream is read once per round, up to a buffer. */
struct outs {
	int ep, fd[2];
};

/* bridge splits the status channel (a FIFO) into lines and keeps them,
 * as the Go shim's statusBridge (status_linux.go) does: the events file
 * keeps the first max_events bytes of whole lines; past that, only the
 * latest line is kept, with how many lines came after the cap, in
 * events.latest (rewritten at most every latest_every, and at the end),
 * and the channel is read at a bounded pace (a flooding writer waits on
 * the full pipe). A line longer than max_status_line is cut. The events
 * file is made with the first line: most jobs never write one. */
struct bridge {
	int fifo, events;
	int64_t limit, written;
	char *partial, *latest; /* max_status_line (+1 for the newline) */
	size_t plen, llen, maxline;
	int cut, full, dirty;
	int64_t count;
	int64_t every_ns, pause_ns, last_latest, paused_until; /* CLOCK_MONOTONIC */
};

struct rec {
	int code, signo, oom, truncated, killed, deadline;
	int64_t output_bytes;
	int64_t ended_ns; /* when the command ended (wall clock, ns), for a server that adopts it later */
	char reason[4096];
};

/* A command whose request its keeper sent to init itself (keeper_start):
 * what the shim the keeper forks next finds made (run_command_shim). */
struct started_cmd {
	int on;
	int out, err, ctl, fifo; /* the read ends of its output, its ctl end, its status channel (or -1) */
	long ooms_before;	 /* the sandbox's OOM kills before it */
	char cgdir[4200];	 /* its cgroup, "" for none */
	char failed[4096];	 /* why it could not be asked for, "" when it was */
};
extern struct started_cmd started; /* keeper_linux.c */

/* The handoff of a command to an idle shim (start_shim to shim_idle):
 * this head, then the command's cgroup directory and why it could not
 * be asked for (started's cgdir and failed), each ended by a NUL; with
 * the plan, the server's pipe, then those of started's out, err, ctl and
 * fifo that it has (HANDOFF_* bits). */
struct handoff {
	uint32_t magic, have;
	int64_t ooms_before;
	char id[EXEC_ID_LEN];
};
#define HANDOFF_OUT 1u
#define HANDOFF_ERR 2u
#define HANDOFF_CTL 4u
#define HANDOFF_FIFO 8u

#pragma GCC visibility push(hidden)

/* helper_linux.c: small tools. */
int lean_poll(struct pollfd *fds, nfds_t n, int timeout);
void give_back_stack(void);
int write_all(int fd, const void *buf, size_t n);
char *read_all(int fd, size_t max, size_t *len);
const char *errtext(int e);
void quote(char *out, size_t cap, const char *s);
extern int logfd, log_to_file;
void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int write_file_atomic(const char *name, const char *data, size_t n);
int write_pid_file(const char *name, const char *data, size_t n);
int64_t mono_ns(void);
int64_t now_ns(void);
int exists(const char *name);
void mark_killed(const char *path);
void close_except(unsigned lo, const int *keep, int n);

/* plan_linux.c: the plan and its steps. */
int unmarshal_plan(const char *data, size_t len, struct plan *p, char *err, size_t errcap);
void plan_free(struct plan *p);
char *read_plan_fd(int fd, size_t *len);
char *command_plan(int fd, struct plan *cp, char *msg, size_t msgcap);
int same_ops(const struct op *a, uint32_t na, const struct op *b, uint32_t nb);
extern int kept_fd[KEPT_SLOTS];
int take_ops(const struct plan *p, const struct op *ops, uint32_t first, uint32_t n, char *msg, size_t cap);

/* shim_linux.c: a sandbox's shim. */
int run_shim(size_t cmdline_len);
int shim_probe(uint32_t base);
void out_write(struct output_writer *w, int stream, const char *p, size_t len);
void out_printf(struct output_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int outs_init(struct outs *o, int out, int err);
int outs_read(struct outs *o, struct output_writer *w, char *buf, size_t cap);
int outs_open(const struct outs *o);
int write_exit(const struct rec *r, int *tell);
int finish_failed(struct output_writer *w, const char *msg);
int shim_record(const struct plan *p, struct output_writer *w, const char *sdata, size_t slen, int have_ws, int ws, const char *relerr,
		int deadline_hit, long ooms_before, int *tell);

/* init_linux.c: init. */
extern int report_fd;
void send_status(int fd, int code, int signo, const char *reason);
void init_fail(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
const char *job_path(const char *name, char *const *env, const char *dir, char *buf, size_t cap, const char **pathenv);
const char *command_path(const struct plan *p, char *buf, size_t cap);
void run_ops(const struct plan *p, uint32_t first);
void run_init(const struct plan *p, int sync_r, int status_w, int out_w, int err_w, const int *tasks, int ntasks, size_t cmdline_len)
	__attribute__((noreturn));

/* keeper_linux.c: a kept sandbox's keeper, and its init's service. */
int run_keeper(const struct plan *p, size_t cmdline_len);
void serve_commands(const struct plan *p) __attribute__((noreturn));
int valid_exec_id(const char *id, size_t len);
int parse_control(struct msghdr *mh, int *fds, int max, int *root);
ssize_t send_fds(int sock, const void *buf, size_t n, const int *fds, int nfds);

/* command_linux.c: a kept sandbox's command. */
int run_command_shim(const struct plan *p, struct output_writer *w);
int place_shim_fds(const char *id, int plan, int server);
int shim_idle(void);
void kill_command(const struct plan *p, const char *cgdir, pid_t jobpid);
void run_exec(const struct plan *p, int out, int err, int ctl, int cg, int ahead, uint32_t taken, const char *failed) __attribute__((noreturn));
void spare_child(const struct plan *p, int sock, int cg) __attribute__((noreturn));
void command_failed(int errw, int ctl, const char *msg);

/* status_linux.c: the status channel. */
void br_open(struct bridge *br, const struct plan *p, const char *path, int fd);
void br_read(struct bridge *b, int drain);
int br_due(struct bridge *br, int64_t *wait_ns, int *fd);
void br_close(struct bridge *br);

/* cgroup_linux.c: the sandbox's cgroups. */
const char *cg_dirs(const struct plan *p, int i);
int cg_write(const char *dir, const char *file, const char *value, char *err, size_t errcap);
void cg_kill(const struct plan *p);
long cg_oom_kills(const struct plan *p);
int open_v1_tasks(const struct plan *p, int *tasks, int *ntasks, char *err, size_t errcap);
void cg_thaw(const struct plan *p);
int cg_frozen(const struct plan *p);
void cg_refreeze(const struct plan *p);
int group_has_procs(const char *dir);

/* owner_linux.c: the user namespace. */
int write_id_maps(pid_t pid, const struct plan *p);
pid_t start_as_owner(unsigned long flags, uint32_t owner, int *pidfd, char *err, size_t errcap);

#pragma GCC visibility pop

/* helper_linux.c: for the Go tests (helper_cgo_linux.go). */
const char *dsh_constants(void);
const char *dsh_job_path(const char *name, const char *envblock, int envlen, const char *dir, const char **pathenv);
const char *dsh_quote(const char *s);
const char *dsh_cgroups(int version, const char *memory, const char *cpu, const char *pids, long *ooms);

#endif
