//go:build linux && cgo

/*
 * The sandbox's helpers in C: the shim (supervisor) and init (pid 1), for
 * binaries built with cgo. They do what shim_linux.go and init_linux.go
 * do, from the same plan (plan.go), so that a sandbox costs two small C
 * processes instead of two start-ups of the Go runtime and of every
 * package of this large binary (see docs/BENCHMARKS.md, "Sandbox start").
 *
 * The server starts SelfExe __sandbox-shim <dir> with
 * DELEGATE_SANDBOX_HELPER=c in its environment. The constructor below
 * runs at load time, before the Go runtime, and never returns in that
 * case: the process is the shim, and init is a fork of it (no second
 * exec). In every other process of this binary it returns at once.
 *
 * What a sandbox is (its root filesystem, its restrictions, its seccomp
 * filter) is decided in Go: init carries out the plan's steps as they
 * come. The Go helpers remain for builds without cgo and for sandboxes
 * with network (only the Go shim starts a network helper).
 *
 * Only async-signal-safe, single-threaded C: no Go, no threads.
 */

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
#define PLAN_VERSION 5u
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

/* ---------- small tools ---------- */

static int write_all(int fd, const void *buf, size_t n) {
	const char *p = buf;
	while (n > 0) {
		ssize_t k = write(fd, p, n);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* read_all reads fd to its end, at most max bytes (more is an error,
 * EFBIG). The buffer has a NUL after the data. */
static char *read_all(int fd, size_t max, size_t *len) {
	size_t cap = 4096, n = 0;
	char *b = malloc(cap + 1);
	if (b == NULL)
		return NULL;
	for (;;) {
		if (n == cap) {
			if (cap >= max) {
				free(b);
				errno = EFBIG;
				return NULL;
			}
			cap = cap * 2 > max ? max : cap * 2;
			char *nb = realloc(b, cap + 1);
			if (nb == NULL) {
				free(b);
				return NULL;
			}
			b = nb;
		}
		ssize_t k = read(fd, b + n, cap - n);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			free(b);
			return NULL;
		}
		if (k == 0)
			break;
		n += (size_t)k;
	}
	b[n] = 0;
	*len = n;
	return b;
}

/* errtext is strerror as Go spells errno values: lower-case first. */
static const char *errtext(int e) {
	static char buf[128];
	snprintf(buf, sizeof buf, "%s", strerror(e));
	if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z'))
		buf[0] = (char)(buf[0] - 'A' + 'a');
	return buf;
}

/* quote writes s as Go's %q does for printable text. */
static void quote(char *out, size_t cap, const char *s) {
	size_t o = 0;
#define PUT(c) do { if (o + 1 < cap) out[o++] = (c); } while (0)
	PUT('"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		unsigned char c = *p;
		if (c == '"' || c == '\\') {
			PUT('\\');
			PUT((char)c);
		} else if (c == '\n') {
			PUT('\\');
			PUT('n');
		} else if (c == '\t') {
			PUT('\\');
			PUT('t');
		} else if (c < 0x20 || c == 0x7f) {
			static const char hex[] = "0123456789abcdef";
			PUT('\\');
			PUT('x');
			PUT(hex[c >> 4]);
			PUT(hex[c & 15]);
		} else {
			PUT((char)c);
		}
	}
	PUT('"');
#undef PUT
	out[o < cap ? o : cap - 1] = 0;
}

/* A shim logs to shim.log, made with the first message (a C shim that
 * has nothing to say leaves none: the server gives it no stderr); the
 * probe logs to its stderr. */
static int logfd = -1, log_to_file = 0;

static void logmsg(const char *fmt, ...) {
	char buf[4096];
	int n = snprintf(buf, sizeof buf, "delegate-sandbox-shim: ");
	va_list ap;
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof buf - 2)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	if (logfd < 0 && log_to_file)
		logfd = open(FILE_SHIM_LOG, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
	write_all(logfd >= 0 ? logfd : 2, buf, (size_t)n);
}

/* write_file_atomic replaces name (in the working directory) with data,
 * mode 0600, through a rename: readers see all or nothing. */
static int write_file_atomic(const char *name, const char *data, size_t n) {
	char tmp[256];
	snprintf(tmp, sizeof tmp, ".%s.tmp-c", name);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -1;
	if (write_all(fd, data, n) < 0 || fchmod(fd, 0600) < 0) {
		int e = errno;
		close(fd);
		unlink(tmp);
		errno = e;
		return -1;
	}
	if (close(fd) < 0 || rename(tmp, name) < 0) {
		int e = errno;
		unlink(tmp);
		errno = e;
		return -1;
	}
	return 0;
}

/* write_pid_file writes a pid record in one write: a reader sees it
 * empty (no pid yet), or whole. The file may have been made ahead,
 * empty: it is truncated only if it is not (on ext4 a truncation to
 * nothing makes the file's close start its writeback: auto_da_alloc). */
static int write_pid_file(const char *name, const char *data, size_t n) {
	int fd = open(name, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -1;
	struct stat st;
	int rc = fstat(fd, &st);
	if (rc == 0 && st.st_size != 0)
		rc = ftruncate(fd, 0);
	if (rc == 0)
		rc = write_all(fd, data, n);
	int e = errno;
	close(fd);
	errno = e;
	return rc;
}

/* ---------- the plan ---------- */

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
};

struct rd {
	const unsigned char *p, *end;
	int err;
};

static const unsigned char *rd_take(struct rd *r, uint64_t n) {
	if (r->err || n > (uint64_t)(r->end - r->p)) {
		r->err = 1;
		return NULL;
	}
	const unsigned char *p = r->p;
	r->p += n;
	return p;
}

static uint32_t rd_u32(struct rd *r) {
	uint32_t v = 0;
	const unsigned char *p = rd_take(r, 4);
	if (p)
		memcpy(&v, p, 4);
	return v;
}

static uint64_t rd_u64(struct rd *r) {
	uint64_t v = 0;
	const unsigned char *p = rd_take(r, 8);
	if (p)
		memcpy(&v, p, 8);
	return v;
}

/* rd_str returns a NUL-terminated copy ("" after an error). */
static char *rd_str(struct rd *r, uint32_t *lenp) {
	uint32_t n = rd_u32(r);
	const unsigned char *p = rd_take(r, n);
	char *s = malloc((size_t)n + 1);
	if (s == NULL) {
		r->err = 1;
		return NULL;
	}
	if (p)
		memcpy(s, p, n);
	else
		n = 0;
	s[n] = 0;
	if (lenp)
		*lenp = n;
	return s;
}

static uint32_t rd_count(struct rd *r, uint64_t min) {
	uint64_t n = rd_u32(r);
	if (!r->err && n * min > (uint64_t)(r->end - r->p))
		r->err = 1;
	return r->err ? 0 : (uint32_t)n;
}

static char **rd_strs(struct rd *r) {
	uint32_t n = rd_count(r, 4);
	char **v = calloc((size_t)n + 1, sizeof *v);
	if (v == NULL) {
		r->err = 1;
		return NULL;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t len;
		v[i] = rd_str(r, &len);
		if (v[i] != NULL && strlen(v[i]) != len)
			r->err = 1; /* a NUL inside: execve could not take it */
	}
	return v;
}

/* rd_ops reads a list of steps (*n of them; never NULL unless r->err). */
static struct op *rd_ops(struct rd *r, uint32_t *n) {
	*n = rd_count(r, 4 + 8 + 5 * 4);
	struct op *ops = calloc((size_t)*n + 1, sizeof *ops);
	if (ops == NULL)
		r->err = 1;
	for (uint32_t i = 0; i < *n && !r->err; i++) {
		struct op *o = &ops[i];
		o->code = rd_u32(r);
		o->n = rd_u64(r);
		o->label = rd_str(r, NULL);
		for (int j = 0; j < 4; j++)
			o->s[j] = rd_str(r, &o->len[j]);
	}
	return ops;
}

static int parse_plan(const char *data, size_t len, struct plan *p, char *err, size_t errcap) {
	struct rd r = {(const unsigned char *)data, (const unsigned char *)data + len, 0};
	uint32_t magic = rd_u32(&r), version = rd_u32(&r);
	if (!r.err && (magic != PLAN_MAGIC || version != PLAN_VERSION)) {
		snprintf(err, errcap, "sandbox plan: version %#x/%u, this helper knows %#x/%u (the server binary was replaced while it ran: restart it)",
			 magic, version, PLAN_MAGIC, PLAN_VERSION);
		return -1;
	}
	memset(p, 0, sizeof *p);
	p->output_limit = (int64_t)rd_u64(&r);
	p->max_events = (int64_t)rd_u64(&r);
	p->max_status_line = (int64_t)rd_u64(&r);
	p->latest_every_ns = (int64_t)rd_u64(&r);
	p->flood_pause_ns = (int64_t)rd_u64(&r);
	p->deadline_ns = (int64_t)rd_u64(&r);
	p->cg_version = rd_u32(&r);
	p->cg_memory = rd_str(&r, NULL);
	p->cg_cpu = rd_str(&r, NULL);
	p->cg_pids = rd_str(&r, NULL);
	p->host_id_base = rd_u32(&r);
	p->id_range = rd_u32(&r);
	p->job_id = rd_u32(&r);
	p->args = rd_strs(&r);
	p->env = rd_strs(&r);
	p->dir = rd_str(&r, NULL);
	p->seccomp = (unsigned char *)rd_str(&r, &p->seccomp_len);
	p->ops = rd_ops(&r, &p->nops);
	p->net_name = rd_str(&r, NULL);
	p->net_path = rd_str(&r, NULL);
	p->netns = rd_u32(&r);
	p->stdin_path = rd_str(&r, NULL);
	p->mode = rd_u32(&r);
	p->until_ns = (int64_t)rd_u64(&r);
	p->cg_freezer = rd_str(&r, NULL);
	p->exec_id = rd_str(&r, NULL);
	p->channel = rd_str(&r, NULL);
	p->ahead = rd_u32(&r);
	p->spare_ops = rd_ops(&r, &p->nspare_ops);
	if (!r.err && (r.p != r.end || p->ahead > p->nops))
		r.err = 1;
	if (r.err || p->mode > MODE_COMMAND) {
		snprintf(err, errcap, "sandbox plan: truncated or malformed");
		return -1;
	}
	if (p->mode != MODE_KEEPER && (p->args == NULL || p->args[0] == NULL || p->args[0][0] == 0)) {
		snprintf(err, errcap, "sandbox plan: no command");
		return -1;
	}
	if (p->max_status_line <= 0 || p->max_status_line > (16 << 20) || p->max_events < 0) {
		snprintf(err, errcap, "sandbox plan: status channel limits %lld/%lld", (long long)p->max_events, (long long)p->max_status_line);
		return -1;
	}
	return 0;
}

/* plan_free frees what parse_plan allocated (a kept sandbox's init
 * parses a plan for every command). */
static void plan_free(struct plan *p) {
	char **lists[2] = {p->args, p->env};
	for (int i = 0; i < 2; i++) {
		for (char **v = lists[i]; v && *v; v++)
			free(*v);
		free(lists[i]);
	}
	struct op *lists_ops[2] = {p->ops, p->spare_ops};
	uint32_t nops[2] = {p->nops, p->nspare_ops};
	for (int k = 0; k < 2; k++) {
		for (uint32_t i = 0; lists_ops[k] && i < nops[k]; i++) {
			free(lists_ops[k][i].label);
			for (int j = 0; j < 4; j++)
				free(lists_ops[k][i].s[j]);
		}
		free(lists_ops[k]);
	}
	char *strs[] = {p->cg_memory, p->cg_cpu, p->cg_pids, p->dir, (char *)p->seccomp, p->net_name, p->net_path, p->stdin_path,
			p->cg_freezer, p->exec_id, p->channel};
	for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
		free(strs[i]);
	memset(p, 0, sizeof *p);
}

/* ---------- init: pid 1 of the sandbox ---------- */

/* detail names the part of a step that failed, if not the whole. */
static const char *detail;

static int read_only_recursive(const char *path) {
	struct dsh_mount_attr attr = {DSH_MOUNT_ATTR_RDONLY | DSH_MOUNT_ATTR_NOSUID | DSH_MOUNT_ATTR_NODEV, 0, 0, 0};
	if (syscall(SYS_mount_setattr, AT_FDCWD, path, AT_RECURSIVE | AT_SYMLINK_NOFOLLOW, &attr, sizeof attr) == 0)
		return 0;
	if (errno != ENOSYS)
		return -1;
	/* Before mount_setattr (5.12): a remount of the top mount, keeping
	 * the flags the kernel locks in a user namespace. */
	struct statfs st;
	if (statfs(path, &st) < 0)
		return -1;
	unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV;
	if (st.f_flags & DSH_ST_NOEXEC)
		flags |= MS_NOEXEC;
	if (st.f_flags & DSH_ST_NOATIME)
		flags |= MS_NOATIME;
	if (st.f_flags & DSH_ST_NODIRATIME)
		flags |= MS_NODIRATIME;
	if (st.f_flags & DSH_ST_RELATIME)
		flags |= MS_RELATIME;
	return mount("", path, "", flags, NULL);
}

static int pivot(const char *root) {
	if (chdir(root) < 0)
		return -1;
	/* pivot_root(".", ".") stacks the old root on the new one; the detach
	 * removes it without needing a directory for it. */
	if (syscall(SYS_pivot_root, ".", ".") < 0)
		return -1;
	if (umount2(".", MNT_DETACH) < 0) {
		detail = "detach the old root";
		return -1;
	}
	return chdir("/");
}

static int loopback_up(void) {
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
	int rc = ioctl(fd, SIOCGIFFLAGS, &ifr);
	if (rc < 0) {
		detail = "get flags";
	} else {
		ifr.ifr_flags |= IFF_UP;
		rc = ioctl(fd, SIOCSIFFLAGS, &ifr);
		if (rc < 0)
			detail = "set flags";
	}
	int e = errno;
	close(fd);
	errno = e;
	return rc;
}

static char capdetail[32];

static int drop_bounding_set(void) {
	for (int c = 0; c < 64; c++) {
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) == 0)
			continue;
		if (errno == EINVAL)
			return 0; /* past the last capability this kernel knows */
		snprintf(capdetail, sizeof capdetail, "capability %d", c);
		detail = capdetail;
		return -1;
	}
	return 0;
}

static int install_seccomp(const struct plan *p) {
	if (p->seccomp_len == 0 || p->seccomp_len % sizeof(struct sock_filter) != 0 ||
	    p->seccomp_len / sizeof(struct sock_filter) > 0xffff) {
		errno = EINVAL;
		detail = "the plan's filter";
		return -1;
	}
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		detail = "set no_new_privs";
		return -1;
	}
	struct sock_fprog prog = {(unsigned short)(p->seccomp_len / sizeof(struct sock_filter)), (struct sock_filter *)p->seccomp};
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0) {
		detail = "load the filter";
		return -1;
	}
	return 0;
}

/* write_input creates the input file path, which must not exist yet,
 * with data, readable by its owner uid alone (writeInput in
 * plan_linux.go). */
static int write_input(const char *path, const char *data, size_t len, uid_t uid) {
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0400);
	if (fd < 0)
		return -1;
	if (write_all(fd, data, len) < 0 || fchown(fd, uid, uid) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return close(fd);
}

/* kept_fd are what OP_KEEP_PATH opened, by slot (an op's n), for
 * OP_BIND_KEPT. */
#define KEPT_SLOTS 2
static int kept_fd[KEPT_SLOTS] = {-1, -1};

static int run_op(const struct plan *p, const struct op *o) {
	detail = NULL;
	switch (o->code) {
	case OP_UNSHARE:
		return unshare((int)o->n);
	case OP_KEEP_PATH:
	case OP_BIND_KEPT: {
		if (o->n >= KEPT_SLOTS) {
			detail = "no such slot";
			errno = EINVAL;
			return -1;
		}
		int *slot = &kept_fd[o->n];
		if (o->code == OP_KEEP_PATH) {
			if (*slot >= 0)
				close(*slot);
			*slot = open(o->s[0], O_PATH | O_CLOEXEC);
			return *slot < 0 ? -1 : 0;
		}
		if (*slot < 0) {
			detail = "nothing kept to bind";
			errno = EBADF;
			return -1;
		}
		/* s1: an entry of the kept directory (a command's channel in
		 * init's channels). */
		int from = o->s[1][0] ? openat(*slot, o->s[1], O_PATH | O_NOFOLLOW | O_CLOEXEC) : *slot;
		int rc = -1;
		if (from >= 0) {
			char src[64];
			snprintf(src, sizeof src, "/proc/self/fd/%d", from);
			rc = mount(src, o->s[0], NULL, MS_BIND, NULL);
		}
		int e = errno;
		if (from >= 0 && from != *slot)
			close(from);
		close(*slot);
		*slot = -1;
		errno = e;
		return rc;
	}
	case OP_MOUNT:
		return mount(o->s[0], o->s[1], o->s[2], (unsigned long)o->n, o->s[3][0] ? o->s[3] : NULL);
	case OP_MKDIR:
		if (mkdir(o->s[0], (mode_t)o->n) < 0 && errno != EEXIST)
			return -1;
		return 0;
	case OP_TOUCH: {
		int fd = open(o->s[0], O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		return fd < 0 ? -1 : close(fd);
	}
	case OP_SYMLINK:
		return symlink(o->s[0], o->s[1]);
	case OP_READ_ONLY:
		return read_only_recursive(o->s[0]);
	case OP_PIVOT:
		return pivot(o->s[0]);
	case OP_UNSHARE_CGROUP:
		unshare(CLONE_NEWCGROUP); /* cosmetic: not a reason to fail */
		return 0;
	case OP_HOSTNAME:
		return sethostname(o->s[0], strlen(o->s[0]));
	case OP_LOOPBACK:
		return loopback_up();
	case OP_NO_CORE_DUMPS: {
		struct rlimit rl = {0, 0};
		return setrlimit(RLIMIT_CORE, &rl);
	}
	case OP_NOFILE: {
		struct rlimit rl = {(rlim_t)o->n, (rlim_t)o->n};
		return setrlimit(RLIMIT_NOFILE, &rl);
	}
	case OP_DROP_BOUNDING:
		return drop_bounding_set();
	case OP_SECCOMP:
		return install_seccomp(p);
	case OP_INPUT:
		return write_input(o->s[0], o->s[1], o->len[1], (uid_t)o->n);
	case OP_SYSCTL: {
		int fd = open(o->s[0], O_WRONLY | O_CLOEXEC);
		if (fd < 0)
			return errno == ENOENT ? 0 : -1; /* an older kernel: one budget fewer */
		if (write_all(fd, o->s[1], o->len[1]) < 0) {
			int e = errno;
			close(fd);
			errno = e;
			return -1;
		}
		return close(fd);
	}
	}
	detail = "a step the C helpers do not have";
	errno = ENOSYS;
	return -1;
}

/* report_fd is where init reports (initStatus in state.go): descriptor
 * 4, a pipe to the shim; a kept sandbox's init reports on its requests'
 * socket once, then on each command's socket, and so does a command
 * that cannot start. */
static int report_fd = 4;

/* send_status sends how a command ended (code, signal number, a reason)
 * on fd in one write: one message on a socket. */
static void send_status(int fd, int code, int signo, const char *reason) {
	char buf[12 + 4096];
	uint32_t len = reason ? (uint32_t)strnlen(reason, sizeof buf - 12) : 0;
	int32_t c = code, s = signo;
	memcpy(buf, &c, 4);
	memcpy(buf + 4, &s, 4);
	memcpy(buf + 8, &len, 4);
	if (len > 0)
		memcpy(buf + 12, reason, len);
	ssize_t k;
	do
		k = send(fd, buf, 12 + len, MSG_NOSIGNAL);
	while (k < 0 && errno == EINTR);
	if (k < 0 && errno == ENOTSOCK)
		write_all(fd, buf, 12 + len);
}

/* ws_code and ws_signo are how a wait status is reported: the shell's
 * exit code (128 + the signal for a signal), and the signal or 0. */
static int ws_code(int ws) { return WIFSIGNALED(ws) ? 128 + WTERMSIG(ws) : WEXITSTATUS(ws); }
static int ws_signo(int ws) { return WIFSIGNALED(ws) ? WTERMSIG(ws) : 0; }

/* init_report sends the shim how the job ended, then exits with code. */
static void init_send(int code, int signo, const char *reason) {
	send_status(report_fd, code, signo, reason);
	close(report_fd);
}

static void init_report(int code, int signo, const char *reason) __attribute__((noreturn));
static void init_report(int code, int signo, const char *reason) {
	init_send(code, signo, reason);
	_exit(code);
}

/* init_fail writes a set-up failure into the job's stderr and reports it. */
static void init_fail(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void init_fail(int code, const char *fmt, ...) {
	char msg[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	char line[4200];
	int n = snprintf(line, sizeof line, "%s%s\n", SETUP_PREFIX, msg);
	if (n > (int)sizeof line - 1)
		n = (int)sizeof line - 1;
	write_all(2, line, (size_t)n);
	init_report(code, 0, msg);
}

static void path_join(char *out, size_t cap, const char *a, const char *b) {
	size_t la = strlen(a);
	snprintf(out, cap, "%s%s%s", a, (la > 0 && a[la - 1] == '/') ? "" : "/", b);
}

/* job_path resolves the command like execvp would in the job: on the
 * PATH of the job's environment (not init's), relative entries against
 * the job's working directory (jobPath in init_linux.go). It returns
 * NULL when not found, with pathenv the PATH searched. */
static const char *job_path(const char *name, char *const *env, const char *dir, char *buf, size_t cap, const char **pathenv) {
	if (strchr(name, '/'))
		return name;
	const char *pe = DEFAULT_JOB_PATH;
	for (char *const *e = env; e && *e; e++) {
		if (strncmp(*e, "PATH=", 5) == 0) {
			pe = *e + 5; /* the first one, as getenv(3) sees it */
			break;
		}
	}
	*pathenv = pe;
	if (*pe == 0)
		return NULL; /* an empty PATH has no entries */
	for (const char *seg = pe;;) {
		const char *end = strchrnul(seg, ':');
		char d[4096], p[4096];
		size_t n = (size_t)(end - seg);
		if (n == 0)
			snprintf(d, sizeof d, ".");
		else
			snprintf(d, sizeof d, "%.*s", (int)n, seg);
		if (d[0] != '/') {
			char rel[4096];
			path_join(rel, sizeof rel, dir, d);
			snprintf(d, sizeof d, "%s", rel);
		}
		path_join(p, sizeof p, d, name);
		struct stat st;
		if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111)) {
			snprintf(buf, cap, "%s", p);
			return buf;
		}
		if (*end == 0)
			return NULL;
		seg = end + 1;
	}
}

/* command_path finds the job's command on its PATH (job_path) and checks
 * its working directory, for init and for a kept sandbox's command
 * alike; init_fail says why not. */
static const char *command_path(const struct plan *p, char *buf, size_t cap) {
	char q1[4200], q2[4200];
	const char *pathenv = DEFAULT_JOB_PATH;
	const char *path = job_path(p->args[0], p->env, p->dir, buf, cap, &pathenv);
	if (path == NULL) {
		quote(q1, sizeof q1, p->args[0]);
		quote(q2, sizeof q2, pathenv);
		init_fail(CODE_NOT_FOUND, "%s: command not found in PATH %s", q1, q2);
	}
	struct stat st;
	if (stat(p->dir, &st) < 0 || !S_ISDIR(st.st_mode))
		init_fail(CODE_CANNOT_EXEC, "working directory %s does not exist in the sandbox", p->dir);
	return path;
}

/* hide_argv makes /proc/1/cmdline read as the Go init's does, instead of
 * the shim's (which names the sandbox directory on the host). */
static void hide_argv(size_t cmdline_len) {
	extern char *program_invocation_name;
	char *a = program_invocation_name;
	static const char want[] = INIT_ARGV0 "\0" INIT_COMMAND;
	if (a == NULL || cmdline_len < sizeof want)
		return;
	memset(a, 0, cmdline_len);
	memcpy(a, want, sizeof want);
}

/* take_ops takes steps ops[first:n], and returns 0, or -1 with why the
 * first that failed did in msg. */
static int take_ops(const struct plan *p, const struct op *ops, uint32_t first, uint32_t n, char *msg, size_t cap) {
	for (uint32_t i = first; i < n; i++) {
		const struct op *o = &ops[i];
		if (run_op(p, o) < 0) {
			int e = errno;
			if (detail)
				snprintf(msg, cap, "%s: %s: %s", o->label, detail, errtext(e));
			else
				snprintf(msg, cap, "%s: %s", o->label, errtext(e));
			return -1;
		}
	}
	return 0;
}

/* run_ops takes the plan's steps from the first-th on, or reports the
 * first that fails. */
static void run_ops(const struct plan *p, uint32_t first) {
	char msg[4200];
	if (take_ops(p, p->ops, first, p->nops, msg, sizeof msg) < 0)
		init_fail(CODE_SETUP_FAILED, "%s", msg);
}

/* close_except closes every descriptor from lo on but the n (at most
 * 8, in any order) of keep; those below lo, and -1, are left out. */
static void close_except(unsigned lo, const int *keep, int n) {
	int k[8], nk = 0;
	for (int i = 0; i < n && i < 8; i++)
		if (keep[i] >= (int)lo) {
			int j = nk++;
			for (; j > 0 && k[j - 1] > keep[i]; j--)
				k[j] = k[j - 1];
			k[j] = keep[i];
		}
	for (int i = 0; i <= nk; i++) {
		unsigned hi = i < nk ? (unsigned)k[i] : ~0U;
		if (hi > lo && syscall(SYS_close_range, lo, hi == ~0U ? hi : hi - 1, 0) < 0)
			for (unsigned fd = lo; fd < hi && fd < 1024; fd++)
				close((int)fd);
		if (i < nk)
			lo = (unsigned)k[i] + 1;
	}
}

/* command_child is a kept sandbox's command between init's fork and the
 * job (runExec in keeper_linux.go): in a session of its own, it places
 * itself in its cgroup (cg, -1 for none), says so on ctl, waits for its
 * shim's go-ahead (not when ahead: a spare, placed before its request,
 * whose kill the keeper checked), takes its plan's steps (a mount
 * namespace and a /run of its own, its inputs, the bounding set, the
 * seccomp filter; a spare took the first taken of them before its
 * request came, and failed, if failed is set), drops to the job's user
 * and executes the job. What fails is written to the job's stderr and
 * reported on ctl. */
static void command_child(const struct plan *p, int out, int err, int ctl, int cg, int ahead, uint32_t taken, const char *failed)
	__attribute__((noreturn));
static void command_child(const struct plan *p, int out, int err, int ctl, int cg, int ahead, uint32_t taken, const char *failed) {
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	setsid();
	/* Descriptors: 0 stays (/dev/null), 1 and 2 the job's stdout and
	 * stderr, 3 ctl, 4 the cgroup's; nothing else (not init's requests'
	 * socket, nor other commands' sockets). */
	int a = fcntl(out, F_DUPFD_CLOEXEC, 10), b = fcntl(err, F_DUPFD_CLOEXEC, 10), c = fcntl(ctl, F_DUPFD_CLOEXEC, 10);
	int d = cg >= 0 ? fcntl(cg, F_DUPFD_CLOEXEC, 10) : -1;
	if (a < 0 || b < 0 || c < 0 || (cg >= 0 && d < 0) || dup2(a, 1) < 0 || dup2(b, 2) < 0 || dup3(c, 3, O_CLOEXEC) < 0 ||
	    (d >= 0 && dup3(d, 4, O_CLOEXEC) < 0))
		_exit(CODE_SETUP_FAILED);
	close_except(d >= 0 ? 5 : 4, kept_fd, KEPT_SLOTS); /* but what steps still to come use */
	report_fd = 3;
	if (d >= 0) {
		if (write_all(4, "0", 1) < 0)
			init_fail(CODE_SETUP_FAILED, "place the command in its cgroup: %s", errtext(errno));
		close(4);
	}
	char word = ahead ? CTL_PLACED_AHEAD : CTL_PLACED;
	if (send(3, &word, 1, MSG_NOSIGNAL) != 1)
		_exit(CODE_SETUP_FAILED); /* its shim is gone */
	if (!ahead) {
		ssize_t n;
		do
			n = read(3, &word, 1);
		while (n < 0 && errno == EINTR);
		if (n != 1 || word != CTL_GO)
			kill(getpid(), SIGKILL); /* killed before it started, or its shim is gone */
	}
	if (failed != NULL && failed[0])
		init_fail(CODE_SETUP_FAILED, "%s", failed);
	run_ops(p, taken);

	char pathbuf[4096], q1[4200];
	const char *path = command_path(p, pathbuf, sizeof pathbuf);
	if (p->stdin_path[0]) {
		int in = open(p->stdin_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (in < 0 || dup2(in, 0) < 0)
			init_fail(CODE_SETUP_FAILED, "standard input %s: %s", p->stdin_path, errtext(errno));
		close(in);
	}
	/* Leaving uid 0 for a non-zero uid clears every capability. */
	uid_t id = p->job_id;
	if (setgroups(0, NULL) < 0 || setresgid(id, id, id) < 0 || setresuid(id, id, id) < 0)
		init_fail(CODE_SETUP_FAILED, "become the job's user: %s", errtext(errno));
	if (chdir(p->dir) < 0)
		init_fail(CODE_CANNOT_EXEC, "working directory %s: %s", p->dir, errtext(errno));
	execve(path, p->args, p->env);
	int e = errno;
	quote(q1, sizeof q1, p->args[0]);
	init_fail(e == ENOENT ? CODE_NOT_FOUND : CODE_CANNOT_EXEC, "cannot run %s: %s", q1, errtext(e));
}

/* read_plan_fd reads a plan from a memfd the server wrote, whatever its
 * offset. */
static char *read_plan_fd(int fd, size_t *len) {
	struct stat st;
	if (fstat(fd, &st) < 0 || st.st_size <= 0 || (uint64_t)st.st_size > MAX_PLAN_BYTES) {
		errno = EFBIG;
		return NULL;
	}
	char *b = malloc((size_t)st.st_size + 1);
	if (b == NULL)
		return NULL;
	size_t n = 0;
	while (n < (size_t)st.st_size) {
		ssize_t k = pread(fd, b + n, (size_t)st.st_size - n, (off_t)n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			free(b);
			errno = k == 0 ? EIO : errno;
			return NULL;
		}
		n += (size_t)k;
	}
	b[n] = 0;
	*len = n;
	return b;
}

/* command_plan reads and parses a command's plan from the memfd fd into
 * cp (plan_free it), and returns the buffer it parsed (free it); msg is
 * "" or why the plan cannot be run. */
static char *command_plan(int fd, struct plan *cp, char *msg, size_t msgcap) {
	size_t len = 0;
	char *data = read_plan_fd(fd, &len);
	memset(cp, 0, sizeof *cp);
	msg[0] = 0;
	if (data == NULL)
		snprintf(msg, msgcap, "read the plan: %s", errtext(errno));
	else if (parse_plan(data, len, cp, msg, msgcap) < 0)
		; /* msg says why */
	else if (cp->mode != MODE_COMMAND)
		snprintf(msg, msgcap, "not the plan of a command");
	return data;
}

/* command_failed tells a command's shim why its command did not start:
 * on its stderr and on its ctl. */
static void command_failed(int errw, int ctl, const char *msg) {
	char line[4300];
	int k = snprintf(line, sizeof line, "%s%s\n", SETUP_PREFIX, msg);
	write_all(errw, line, (size_t)(k < (int)sizeof line ? k : (int)sizeof line - 1));
	send_status(ctl, CODE_SETUP_FAILED, 0, msg);
}

/* start_command starts the command of one request (see keeper_linux.go):
 * fds are the plan, stdout, stderr, ctl and perhaps the cgroup's. It
 * returns the command's pid, 0 when it did not start (its shim is told
 * why on ctl). */
static pid_t start_command(int *fds, int nfds) {
	int ctl = fds[3], cg = nfds > REQUEST_FDS ? fds[4] : -1;
	char msg[4200];
	struct plan cp;
	char *data = command_plan(fds[0], &cp, msg, sizeof msg);
	pid_t pid = 0;
	if (msg[0] == 0) {
		pid = fork();
		if (pid == 0)
			command_child(&cp, fds[1], fds[2], ctl, cg, 0, 0, NULL);
		if (pid < 0) {
			snprintf(msg, sizeof msg, "start the command: %s", errtext(errno));
			pid = 0;
		}
	}
	if (pid == 0)
		command_failed(fds[2], ctl, msg);
	plan_free(&cp);
	free(data);
	return pid;
}

/* message_fds takes the descriptors a received message brought: at most
 * max into fds (any more are closed), and says in *root, when root is
 * not NULL, whether its sender's credentials (SO_PASSCRED) are uid 0.
 * It returns how many it took. */
static int message_fds(struct msghdr *mh, int *fds, int max, int *root) {
	int nfds = 0;
	if (root)
		*root = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		if (c->cmsg_level != SOL_SOCKET)
			continue;
		if (c->cmsg_type == SCM_CREDENTIALS && root && c->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
			struct ucred cr;
			memcpy(&cr, CMSG_DATA(c), sizeof cr);
			*root = cr.uid == 0;
		} else if (c->cmsg_type == SCM_RIGHTS) {
			int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			for (int i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
				if (nfds < max)
					fds[nfds++] = fd;
				else
					close(fd);
			}
		}
	}
	return nfds;
}

/* same_ops says whether steps a (na of them) are steps b (nb). */
static int same_ops(const struct op *a, uint32_t na, const struct op *b, uint32_t nb) {
	if (na != nb)
		return 0;
	for (uint32_t i = 0; i < na; i++) {
		if (a[i].code != b[i].code || a[i].n != b[i].n || strcmp(a[i].label, b[i].label) != 0)
			return 0;
		for (int j = 0; j < 4; j++)
			if (a[i].len[j] != b[i].len[j] || memcmp(a[i].s[j], b[i].s[j], a[i].len[j]) != 0)
				return 0;
	}
	return 1;
}

/* spare_child is the next command of a kept sandbox (cgroup v1), forked
 * by init ahead of its request: it places itself in the group its keeper
 * made for it (cg: its "tasks" file: a thread that moves itself skips
 * the global lock, whose RCU grace period would hold the cgroup mutex,
 * and with it the keeper's renames, for milliseconds), and takes the
 * steps every command begins with (p's spare_ops), off the command's
 * way; then it waits on sock, whose other end the keeper holds, for the
 * request's descriptors (plan, stdout, stderr, ctl) and becomes the
 * command (command_child, which is then in its group already, and
 * skips those steps of its plan). */
static void spare_child(const struct plan *p, int sock, int cg) __attribute__((noreturn));
static void spare_child(const struct plan *p, int sock, int cg) {
	if (dup3(sock, 3, O_CLOEXEC) < 0 || dup3(cg, 4, O_CLOEXEC) < 0)
		_exit(CODE_SETUP_FAILED);
	syscall(SYS_close_range, 5, ~0U, 0);
	if (write_all(4, "0", 1) < 0)
		_exit(CODE_SETUP_FAILED); /* init sees it end, and forks the command itself */
	close(4);
	/* The steps of every command (commandAheadOps in Go), taken while
	 * it waits; what fails is its command's setup failure. What they
	 * keep open for the command's steps moves out of the way of the
	 * descriptors command_child places. */
	static char failed[4200];
	take_ops(p, p->spare_ops, 0, p->nspare_ops, failed, sizeof failed);
	for (int i = 0; i < KEPT_SLOTS; i++)
		if (kept_fd[i] >= 0) {
			int moved = fcntl(kept_fd[i], F_DUPFD_CLOEXEC, 64);
			if (moved < 0)
				_exit(CODE_SETUP_FAILED);
			close(kept_fd[i]);
			kept_fd[i] = moved;
		}
	int rfds[REQUEST_FDS];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * REQUEST_FDS)];
	} cm;
	char buf[8];
	struct iovec iov = {buf, sizeof buf};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b};
	ssize_t n;
	do
		n = recvmsg(3, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		_exit(0); /* init is gone, or took another way */
	int nfds = message_fds(&mh, rfds, REQUEST_FDS, NULL);
	if (nfds != REQUEST_FDS)
		_exit(CODE_SETUP_FAILED);
	close(3);
	uint32_t flags = 0;
	if (n >= 8)
		memcpy(&flags, buf + 4, 4);
	if (flags & REQUEST_KILLED)
		kill(getpid(), SIGKILL); /* init reports it killed on ctl */
	char msg[4200];
	struct plan cp;
	command_plan(rfds[0], &cp, msg, sizeof msg);
	if (!msg[0] && !same_ops(cp.ops, cp.ahead, p->spare_ops, p->nspare_ops))
		snprintf(msg, sizeof msg, "the sandbox readied its commands with steps other than this command's (a server binary replaced while it ran): release the sandbox");
	if (msg[0]) {
		command_failed(rfds[2], rfds[3], msg);
		_exit(CODE_SETUP_FAILED);
	}
	command_child(&cp, rfds[1], rfds[2], rfds[3], -1, 1, cp.ahead, failed);
}

/* keeper_serve is a kept sandbox's init once its root is made: it says
 * so on its requests' socket (descriptor 4), then starts each command
 * that comes there and reports each one's end on the command's own
 * socket, reaping every orphan of the sandbox meanwhile, until its
 * keeper goes (serveCommands in keeper_linux.go). */
static void keeper_serve(const struct plan *p) __attribute__((noreturn));
static void keeper_serve(const struct plan *p) {
	send_status(4, 0, 0, NULL);
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0)
		_exit(CODE_SETUP_FAILED);
	struct running {
		pid_t pid;
		int ctl;
	} *run = NULL;
	size_t nrun = 0, caprun = 0;
	/* The spare (spare_child): its pid; and its wait status if it ended
	 * before the keeper's word that it had been given a command
	 * (REQUEST_TAKEN), which is then that command's end. */
	pid_t spare = 0;
	int spare_ended = 0, spare_ws = 0;
	for (;;) {
		struct pollfd fds[2] = {{4, POLLIN, 0}, {sfd, POLLIN, 0}};
		if (poll(fds, 2, -1) < 0)
			continue;
		if (fds[1].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof si) > 0)
				;
			int ws;
			pid_t w;
			while ((w = waitpid(-1, &ws, WNOHANG)) > 0) {
				if (w == spare) {
					/* It could not place itself (the next command is
					 * then forked as it comes), or it was given a
					 * command and ended before the keeper's word. */
					spare = 0;
					spare_ended = 1;
					spare_ws = ws;
				}
				for (size_t i = 0; i < nrun; i++) {
					if (run[i].pid != w)
						continue;
					send_status(run[i].ctl, ws_code(ws), ws_signo(ws), NULL);
					close(run[i].ctl);
					run[i] = run[--nrun];
					break;
				}
			}
		}
		if (fds[0].revents == 0)
			continue;
		char buf[64];
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int) * (REQUEST_FDS + 1))];
		} cm;
		struct iovec iov = {buf, sizeof buf};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b};
		ssize_t n = recvmsg(4, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			_exit(0); /* the keeper is gone: so is the sandbox */
		int rfds[REQUEST_FDS + 1];
		int nfds = message_fds(&mh, rfds, REQUEST_FDS + 1, NULL);
		uint32_t magic = 0, flags = 0;
		if (n == 8) {
			memcpy(&magic, buf, 4);
			memcpy(&flags, buf + 4, 4);
		}
		if (magic == SPARE_MAGIC && nfds == 2 && !(mh.msg_flags & MSG_CTRUNC)) {
			/* The keeper made the next command's group (cgroup v1)
			 * and a socket for its request: a spare places itself
			 * there now, ahead of the request. */
			if (spare > 0)
				kill(spare, SIGKILL); /* never given a command */
			spare = 0;
			spare_ended = 0;
			pid_t c = fork();
			if (c == 0)
				spare_child(p, rfds[1], rfds[0]);
			if (c > 0)
				spare = c;
			close(rfds[0]);
			close(rfds[1]);
			continue;
		}
		int want = REQUEST_FDS + ((flags & REQUEST_CGROUP) ? 1 : 0);
		pid_t pid = 0;
		int ctl = -1;
		if (magic == REQUEST_MAGIC && (flags & REQUEST_TAKEN) && nfds == 1 && !(mh.msg_flags & MSG_CTRUNC)) {
			/* The keeper gave the spare a command itself (keeper_ask):
			 * its end is reported on the command's ctl. */
			ctl = rfds[0];
			rfds[0] = -1;
			pid = spare;
			spare = 0;
			if (pid == 0) {
				if (spare_ended)
					send_status(ctl, ws_code(spare_ws), ws_signo(spare_ws), NULL);
				else
					send_status(ctl, CODE_SETUP_FAILED, 0, "the command's process was not there");
				spare_ended = 0;
				close(ctl);
			}
		} else if (magic == REQUEST_MAGIC && nfds == want && !(mh.msg_flags & MSG_CTRUNC)) {
			pid = start_command(rfds, nfds);
			if (pid > 0) {
				ctl = rfds[3];
				rfds[3] = -1;
			}
		} /* else: not from a keeper of ours, nobody to tell */
		if (pid > 0 && nrun == caprun) {
			size_t nc = caprun ? caprun * 2 : 16;
			struct running *nr = realloc(run, nc * sizeof *run);
			if (nr == NULL) {
				kill(pid, SIGKILL); /* its end is reported by nobody: its shim sees its socket close */
				close(ctl);
				pid = 0;
			} else {
				run = nr;
				caprun = nc;
			}
		}
		if (pid > 0) {
			run[nrun].pid = pid;
			run[nrun].ctl = ctl;
			nrun++;
		}
		for (int i = 0; i < nfds; i++)
			if (rfds[i] >= 0)
				close(rfds[i]);
	}
}

/* init_main is init: sync_r brings the go-ahead, status_w takes the
 * report, out_w and err_w are the job's stdout and stderr; tasks are the
 * v1 groups' "tasks" files, opened by the shim (ntasks 0 when the shim
 * places init itself). */
static void init_main(const struct plan *p, int sync_r, int status_w, int out_w, int err_w, const int *tasks, int ntasks,
		      size_t cmdline_len) __attribute__((noreturn));
static void init_main(const struct plan *p, int sync_r, int status_w, int out_w, int err_w, const int *tasks, int ntasks,
		      size_t cmdline_len) {
	/* Nobody would collect the output or the exit status of a sandbox
	 * whose shim is gone; end it rather than orphan it. */
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	/* Descriptors: 0 stays (/dev/null), 1 and 2 the job's stdout and stderr, 3
	 * the go-ahead, 4 the report, 5.. the tasks files; nothing else. */
	int a = fcntl(sync_r, F_DUPFD_CLOEXEC, 10), b = fcntl(status_w, F_DUPFD_CLOEXEC, 10), t[3] = {-1, -1, -1};
	for (int i = 0; i < ntasks && i < 3; i++)
		if ((t[i] = fcntl(tasks[i], F_DUPFD_CLOEXEC, 10)) < 0)
			_exit(CODE_SETUP_FAILED);
	if (a < 0 || b < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0 || dup3(a, 3, O_CLOEXEC) < 0 || dup3(b, 4, O_CLOEXEC) < 0)
		_exit(CODE_SETUP_FAILED);
	for (int i = 0; i < ntasks && i < 3; i++)
		if (dup3(t[i], 5 + i, O_CLOEXEC) < 0)
			_exit(CODE_SETUP_FAILED);
	if (syscall(SYS_close_range, 5 + ntasks, ~0U, 0) < 0) {
		/* Before Linux 5.9: one by one, up to the highest a descriptor
		 * is likely to have (a leaked one may be far above 4096). */
		struct rlimit rl;
		long max = 4096;
		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max > (rlim_t)max)
			max = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (1 << 20) ? 1L << 20 : (long)rl.rlim_max;
		for (long fd = 5 + ntasks; fd < max; fd++)
			close((int)fd);
	}
	/* The job gets default signal dispositions, whatever the shim had. */
	for (int sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			signal(sig, SIG_DFL);

	char go = 0;
	ssize_t n;
	do
		n = read(3, &go, 1);
	while (n < 0 && errno == EINTR);
	close(3);
	if (n != 1 || go != 'g')
		init_fail(CODE_SETUP_FAILED, "the sandbox was never released (its shim went away)");
	/* The shim has written the id maps: become uid 0 of the namespace
	 * (without this the process would be the overflow uid). */
	if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
		init_fail(CODE_SETUP_FAILED, "become root of the user namespace: %s", errtext(errno));
	/* Into the sandbox's cgroups before anything else. A thread that
	 * moves itself through a v1 "tasks" file spares the kernel the
	 * global lock (and its RCU grace period, milliseconds) that moving a
	 * process by pid takes. The shim opened the files: the kernel checks
	 * the opener's credentials. */
	for (int i = 0; i < ntasks; i++) {
		if (write_all(5 + i, "0", 1) < 0)
			init_fail(CODE_SETUP_FAILED, "place the sandbox in its cgroups: cgroup: write \"0\" to tasks: %s", errtext(errno));
		close(5 + i);
	}
	/* Kill writes its marker before it kills what is in the cgroups:
	 * either it sees init there now, or init goes no further. */
	if (ntasks > 0 && access(FILE_KILLED, F_OK) == 0)
		init_report(128 + SIGKILL, SIGKILL, NULL);
	hide_argv(cmdline_len);
	umask(022); /* a known umask for the root we build and for the job */

	run_ops(p, 0);
	if (p->mode == MODE_KEEPER)
		keeper_serve(p);

	char pathbuf[4096], q1[4200];
	const char *path = command_path(p, pathbuf, sizeof pathbuf);

	/* One of the command's inputs as its standard input; 0 is /dev/null
	 * otherwise (the shim's). */
	int in = 0;
	if (p->stdin_path[0] && (in = open(p->stdin_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		init_fail(CODE_SETUP_FAILED, "standard input %s: %s", p->stdin_path, errtext(errno));

	/* vfork: the child shares init's memory until it executes the job,
	 * so it only makes system calls and leaves its errno here. */
	volatile int child_errno = 0;
	uid_t id = p->job_id;
	pid_t pid = vfork();
	if (pid == 0) {
		/* Leaving uid 0 for a non-zero uid clears every capability, so
		 * the job runs with none even inside its user namespace. */
		if ((in != 0 && dup2(in, 0) < 0) || syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setresgid, id, id, id) < 0 ||
		    syscall(SYS_setresuid, id, id, id) < 0 || chdir(p->dir) < 0) {
			child_errno = errno;
			_exit(127);
		}
		execve(path, p->args, p->env);
		child_errno = errno;
		_exit(127);
	}
	int e = pid < 0 ? errno : child_errno;
	if (pid > 0 && e != 0)
		waitpid(pid, NULL, 0);
	if (e != 0) {
		quote(q1, sizeof q1, p->args[0]);
		init_fail(e == ENOENT ? CODE_NOT_FOUND : CODE_CANNOT_EXEC, "cannot run %s: %s", q1, errtext(e));
	}
	close(1);
	close(2);

	/* pid 1 inherits every orphan of the sandbox and must collect them,
	 * until the job itself has exited. */
	for (;;) {
		int ws;
		pid_t w = wait4(-1, &ws, 0, NULL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			char msg[128];
			snprintf(msg, sizeof msg, "wait: %s", errtext(errno));
			init_report(CODE_SETUP_FAILED, 0, msg);
		}
		if (w != pid)
			continue;
		init_report(ws_code(ws), ws_signo(ws), NULL);
	}
}

/* ---------- the shim ---------- */

/* outw keeps the first limit bytes of the job's stdout and stderr, in
 * the order it is given them, with a record of which stream they are
 * from (streams.go), and counts all of them (outputWriter in
 * shim_linux.go). */
enum { STREAM_COMBINED = 0, STREAM_STDOUT = 1, STREAM_STDERR = 2 };
struct outw {
	int fd, sfd; /* made with the first byte to keep: a quiet job leaves none */
	int64_t limit, n;
	int cur; /* the stream of the last byte kept */
	int err;
	int64_t recs; /* stream records written */
};

/* At most this many stream records (maxStreamRecords in streams.go): the
 * last one says the rest of the output is combined, so that a job that
 * switches stream at every byte cannot make its 8-byte records outgrow
 * its output. */
static int64_t max_stream_records(int64_t limit) {
	return limit / 64 > 256 ? limit / 64 : 256;
}

static void out_write(struct outw *w, int stream, const char *p, size_t len) {
	int64_t keep = w->limit - w->n;
	if (keep > 0 && !w->err && w->fd < 0 && len > 0) {
		/* The stream records first: a reader that sees a byte sees its record. */
		w->sfd = open(FILE_STREAMS, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (w->sfd >= 0)
			w->fd = open(FILE_OUTPUT, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (w->sfd < 0 || w->fd < 0) {
			w->err = errno;
			logmsg("open output file: %s", errtext(errno));
		}
	}
	if (keep > 0 && !w->err && w->fd >= 0 && len > 0) {
		if (stream != w->cur && w->recs < max_stream_records(w->limit)) {
			if (++w->recs == max_stream_records(w->limit))
				stream = STREAM_COMBINED;
			uint64_t v = (uint64_t)w->n << 2 | (uint64_t)stream;
			unsigned char rec[8];
			for (int i = 0; i < 8; i++)
				rec[i] = (unsigned char)(v >> (8 * i)); /* little-endian */
			if (write_all(w->sfd, rec, sizeof rec) < 0)
				w->err = errno;
			w->cur = stream;
		}
		size_t k = (int64_t)len < keep ? len : (size_t)keep;
		if (!w->err && write_all(w->fd, p, k) < 0)
			w->err = errno;
	}
	w->n += (int64_t)len;
}

/* outs are the job's stdout and stderr, read through an epoll set: epoll
 * lists ready descriptors in the order they became ready, so when both
 * streams have something the one written to first is read first (poll
 * over two pipes cannot tell; the kernel keeps no order between them).
 * Each ready stream is read once per round, up to a buffer. */
struct outs {
	int ep, fd[2];
};

static int outs_init(struct outs *o, int out, int err) {
	o->fd[0] = out;
	o->fd[1] = err;
	if ((o->ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
		return -1;
	for (uint32_t i = 0; i < 2; i++) {
		struct epoll_event ev = {.events = EPOLLIN, .data = {.u32 = i}};
		if (epoll_ctl(o->ep, EPOLL_CTL_ADD, o->fd[i], &ev) < 0)
			return -1;
	}
	return 0;
}

/* outs_read reads what is ready, in the order it became ready; it
 * returns how many streams it found ready (0: none, -1: interrupted). */
static int outs_read(struct outs *o, struct outw *w, char *buf, size_t cap) {
	static const int streams[2] = {STREAM_STDOUT, STREAM_STDERR};
	struct epoll_event evs[2];
	int n = epoll_wait(o->ep, evs, 2, 0);
	for (int i = 0; i < n; i++) {
		uint32_t k = evs[i].data.u32;
		if (k > 1 || o->fd[k] < 0)
			continue;
		ssize_t r = read(o->fd[k], buf, cap);
		if (r > 0) {
			out_write(w, streams[k], buf, (size_t)r);
		} else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
			/* The job closed it (it may still run). */
			epoll_ctl(o->ep, EPOLL_CTL_DEL, o->fd[k], NULL);
			close(o->fd[k]);
			o->fd[k] = -1;
		}
	}
	return n;
}

static int outs_open(const struct outs *o) { return o->fd[0] >= 0 || o->fd[1] >= 0; }

static void out_printf(struct outw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_printf(struct outw *w, const char *fmt, ...) {
	char buf[4200];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof buf - 1)
		n = (int)sizeof buf - 1;
	out_write(w, STREAM_STDERR, buf, (size_t)n); /* the sandbox's own words */
}

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

static int64_t mono_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int bridge_events(struct bridge *b) {
	if (b->events < 0) {
		b->events = open(FILE_EVENTS, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (b->events < 0) {
			logmsg("status channel: open the events file: %s", errtext(errno));
			b->limit = 0; /* no file: lines go to the latest record */
		}
	}
	return b->events;
}

static void br_add_partial(struct bridge *b, const char *p, size_t n) {
	if (b->cut)
		return;
	size_t room = b->maxline - b->plen;
	if (n > room) {
		n = room;
		b->cut = 1;
	}
	memcpy(b->partial + b->plen, p, n);
	b->plen += n;
}

/* br_line ends the current line. */
static void br_line(struct bridge *b) {
	b->cut = 0;
	if (!b->full && b->written + (int64_t)b->plen + 1 <= b->limit) {
		b->partial[b->plen] = '\n';
		if (bridge_events(b) >= 0 && write_all(b->events, b->partial, b->plen + 1) == 0)
			b->written += (int64_t)b->plen + 1;
	} else {
		b->full = 1;
		memcpy(b->latest, b->partial, b->plen);
		b->llen = b->plen;
		b->count++;
		b->dirty = 1;
	}
	b->plen = 0;
}

static void br_feed(struct bridge *b, const char *p, size_t n) {
	while (n > 0) {
		const char *nl = memchr(p, '\n', n);
		if (nl == NULL) {
			br_add_partial(b, p, n);
			return;
		}
		br_add_partial(b, p, (size_t)(nl - p));
		n -= (size_t)(nl + 1 - p);
		p = nl + 1;
		br_line(b);
		if (b->full && n > 0) {
			/* Past the cap only the last line matters: count the others. */
			const char *j = memrchr(p, '\n', n);
			if (j != NULL) {
				for (const char *q = p; q < j; q++)
					b->count += *q == '\n';
				const char *prev = memrchr(p, '\n', (size_t)(j - p));
				const char *from = prev ? prev + 1 : p;
				br_add_partial(b, from, (size_t)(j - from));
				br_line(b);
				n -= (size_t)(j + 1 - p);
				p = j + 1;
			}
		}
	}
}

/* br_write_latest publishes the latest line past the cap: its count, a
 * newline, the line. */
static void br_write_latest(struct bridge *b) {
	char *data = malloc(b->llen + 32);
	if (data != NULL) {
		int k = snprintf(data, 32, "%lld\n", (long long)b->count);
		memcpy(data + k, b->latest, b->llen);
		if (write_file_atomic(FILE_EVENTS_LATEST, data, (size_t)k + b->llen) == 0)
			b->dirty = 0;
		else
			logmsg("status channel: write %s: %s", FILE_EVENTS_LATEST, errtext(errno));
		free(data);
	}
	b->last_latest = mono_ns();
}

/* br_read takes what the channel holds: all of it (drain: the job is
 * gone), or one read. */
static void br_read(struct bridge *b, int drain) {
	char buf[65536];
	for (;;) {
		ssize_t k = read(b->fifo, buf, sizeof buf);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return; /* EAGAIN: nothing more for now */
		br_feed(b, buf, (size_t)k);
		if (b->dirty && mono_ns() - b->last_latest >= b->every_ns)
			br_write_latest(b);
		if (!drain) {
			if (b->full)
				b->paused_until = mono_ns() + b->pause_ns;
			return;
		}
	}
}

/* br_end keeps what the job wrote last without a newline, and the latest
 * line. */
static void br_end(struct bridge *b) {
	if (b->plen > 0) {
		if (!b->full && b->written + (int64_t)b->plen <= b->limit) {
			if (bridge_events(b) >= 0 && write_all(b->events, b->partial, b->plen) == 0)
				b->written += (int64_t)b->plen; /* as the job left it */
		} else {
			br_line(b);
		}
	}
	if (b->dirty)
		br_write_latest(b);
}

/* br_open opens the status channel at path (a FIFO; none: the job has
 * no channel), read-write so that it never reports end-of-file between
 * two writers; or takes fd, the channel opened so already (path NULL). */
static void br_open(struct bridge *br, const struct plan *p, const char *path, int fd) {
	memset(br, 0, sizeof *br);
	br->events = -1;
	br->limit = p->max_events;
	br->maxline = (size_t)p->max_status_line;
	br->every_ns = p->latest_every_ns;
	br->pause_ns = p->flood_pause_ns;
	br->last_latest = INT64_MIN / 2; /* the first latest line is due at once */
	br->fifo = path ? open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW) : fd;
	if (path && br->fifo < 0 && errno != ENOENT)
		logmsg("status channel: open: %s", errtext(errno));
	if (br->fifo >= 0 && ((br->partial = malloc(br->maxline + 1)) == NULL || (br->latest = malloc(br->maxline)) == NULL)) {
		logmsg("status channel: %s", errtext(errno));
		close(br->fifo);
		br->fifo = -1;
	}
}

/* br_due writes the latest line when it is due (and returns 1: the
 * caller's loop goes round again), and otherwise lowers *wait_ns to when
 * the bridge needs a turn; *fd is the channel to poll, -1 while it is
 * read at a bounded pace (past the cap). */
static int br_due(struct bridge *br, int64_t *wait_ns, int *fd) {
	if (br->fifo < 0)
		return 0;
	int64_t t = mono_ns();
	if (br->dirty) {
		int64_t due = br->last_latest + br->every_ns - t;
		if (due <= 0) {
			br_write_latest(br);
			return 1;
		}
		*wait_ns = *wait_ns < 0 || due < *wait_ns ? due : *wait_ns;
	}
	int paused = br->paused_until > t;
	*fd = paused ? -1 : br->fifo;
	if (paused)
		*wait_ns = *wait_ns < 0 || br->paused_until - t < *wait_ns ? br->paused_until - t : *wait_ns;
	return 0;
}

/* br_close keeps what is left in the channel, and closes it. */
static void br_close(struct bridge *br) {
	if (br->fifo >= 0) {
		br_read(br, 1);
		br_end(br);
		close(br->fifo);
	}
	if (br->events >= 0)
		close(br->events);
	free(br->partial);
	free(br->latest);
}

static const char *cg_dirs(const struct plan *p, int i) {
	const char *d[3] = {p->cg_memory, p->cg_cpu, p->cg_pids};
	/* Each distinct directory once (in cgroup v2 they are one). */
	for (int j = 0; j < i; j++)
		if (strcmp(d[j], d[i]) == 0)
			return NULL;
	return d[i][0] ? d[i] : NULL;
}

static int cg_write(const char *dir, const char *file, const char *value, char *err, size_t errcap) {
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, file);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errcap, "cgroup: open %s: %s", path, errtext(errno));
		return -1;
	}
	if (write_all(fd, value, strlen(value)) < 0) {
		snprintf(err, errcap, "cgroup: write \"%s\" to %s: %s", value, path, errtext(errno));
		close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

/* cg_kill sends SIGKILL to every process in the sandbox's groups. */
static void cg_kill(const struct plan *p) {
	char err[512];
	if (p->cg_version == 2 && cg_write(p->cg_memory, "cgroup.kill", "1", err, sizeof err) == 0)
		return;
	for (int i = 0; i < 3; i++) {
		const char *d = cg_dirs(p, i);
		if (d == NULL)
			continue;
		char path[4096];
		snprintf(path, sizeof path, "%s/cgroup.procs", d);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		size_t len;
		char *data = read_all(fd, 1 << 20, &len);
		close(fd);
		for (char *s = data; s && *s;) {
			char *end;
			long pid = strtol(s, &end, 10);
			if (end == s)
				break;
			if (pid > 0)
				kill((pid_t)pid, SIGKILL);
			s = end;
		}
		free(data);
	}
}

/* cg_oom_kills is how many processes the kernel OOM-killed in the
 * memory group, -1 if that cannot be read. */
static long cg_oom_kills(const struct plan *p) {
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", p->cg_memory, p->cg_version == 2 ? "memory.events" : "memory.oom_control");
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t len;
	char *data = read_all(fd, 1 << 16, &len);
	close(fd);
	long n = -1;
	for (char *line = data; line && *line;) {
		char *next = strchrnul(line, '\n');
		if (strncmp(line, "oom_kill ", 9) == 0)
			n = strtol(line + 9, NULL, 10);
		line = *next ? next + 1 : next;
	}
	free(data);
	return n;
}

struct rec {
	int code, signo, oom, truncated, killed, deadline;
	int64_t output_bytes;
	char reason[4096];
};

static void json_str(char *out, size_t cap, const char *s) {
	size_t o = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p && o + 8 < cap; p++) {
		if (*p == '"' || *p == '\\') {
			out[o++] = '\\';
			out[o++] = (char)*p;
		} else if (*p < 0x20) {
			o += (size_t)snprintf(out + o, cap - o, "\\u%04x", *p);
		} else {
			out[o++] = (char)*p;
		}
	}
	out[o] = 0;
}

/* write_exit records how the command ended (exitRecord in state.go).
 * tell, if not NULL, is the server's pipe of a kept sandbox's command
 * (or -1): it gets the record first and is closed, which wakes the
 * server's Wait with the record in hand: the file's creation and rename
 * on the data directory's filesystem, and the server's reading it back,
 * are off the command's way. The file is for a server that starts
 * later. */
static int write_exit(const struct rec *r, int *tell) {
	char reason[8400], buf[9000];
	json_str(reason, sizeof reason, r->reason);
	int n = snprintf(buf, sizeof buf,
			 "{\"code\":%d,\"signo\":%d,\"oomKilled\":%s,\"outputBytes\":%lld,\"truncated\":%s,\"killed\":%s,\"deadlineExceeded\":%s,\"reason\":\"%s\"}",
			 r->code, r->signo, r->oom ? "true" : "false", (long long)r->output_bytes, r->truncated ? "true" : "false",
			 r->killed ? "true" : "false", r->deadline ? "true" : "false", reason);
	if (n < 0 || n >= (int)sizeof buf) {
		errno = EOVERFLOW;
		return -1;
	}
	if (tell != NULL && *tell >= 0) {
		if (write_all(*tell, buf, (size_t)n) < 0 && errno != EPIPE)
			logmsg("tell the server how the command ended: %s", errtext(errno));
		close(*tell);
		*tell = -1;
	}
	return write_file_atomic(FILE_EXIT, buf, (size_t)n);
}

static int exists(const char *name) {
	struct stat st;
	return lstat(name, &st) == 0;
}

/* mark_killed leaves the kill marker at path (FILE_KILLED, in a job's
 * or a command's directory), as Kill does in Go. */
static void mark_killed(const char *path) {
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd >= 0)
		close(fd);
}

/* finish_failed records a sandbox that could not start its command. */
static int finish_failed(struct outw *w, const char *msg) {
	struct rec r;
	memset(&r, 0, sizeof r);
	out_printf(w, "%s%s\n", SETUP_PREFIX, msg);
	logmsg("sandbox setup failed: %s", msg);
	r.code = CODE_SETUP_FAILED;
	snprintf(r.reason, sizeof r.reason, "%s", msg);
	r.output_bytes = w->n;
	r.truncated = w->n > w->limit;
	if (write_exit(&r, NULL) < 0) {
		logmsg("cannot record the exit status: %s", errtext(errno));
		return 1;
	}
	return 0;
}

static int write_id_maps(pid_t pid, const struct plan *p) {
	char path[64], map[64];
	int n = snprintf(map, sizeof map, "0 %u %u\n", p->host_id_base, p->id_range);
	const char *files[2] = {"uid_map", "gid_map"};
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, files[i]);
		int fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0)
			return -1;
		if (write_all(fd, map, (size_t)n) < 0) {
			int e = errno;
			close(fd);
			errno = e;
			return -1;
		}
		close(fd);
	}
	return 0;
}

/* set_effective_ids sets the effective uid and gid only (the real and
 * saved ones stay root's, so root can come back) and keeps the effective
 * capabilities (setEffectiveIDs in owner_linux.go): the shim clones init
 * so, and the sandbox's user namespace is the host uid id's, not root's,
 * which the kernel charges what the sandbox holds of per-user budgets to
 * (uids.go). */
static int set_effective_ids(uint32_t id) {
	if (id == 0) {
		/* Back at euid 0 the kernel restores the effective capabilities
		 * from the permitted ones. */
		return setresuid((uid_t)-1, 0, (uid_t)-1) < 0 || setresgid((gid_t)-1, 0, (gid_t)-1) < 0 ? -1 : 0;
	}
	/* The gid first, while CAP_SETGID is effective: leaving euid 0
	 * clears the effective capabilities, raised again below. */
	if (setresgid((gid_t)-1, id, (gid_t)-1) < 0 || setresuid((uid_t)-1, id, (uid_t)-1) < 0)
		return -1;
	struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct data[2];
	if (syscall(SYS_capget, &hdr, data) < 0)
		return -1;
	for (int i = 0; i < 2; i++)
		data[i].effective = data[i].permitted;
	return syscall(SYS_capset, &hdr, data) < 0 ? -1 : 0;
}

/* clone_as_owner clones init into flags' namespaces, its user namespace
 * owned by host uid owner (startAsOwner in owner_linux.go). In the child
 * it returns 0, as fork does. */
static pid_t clone_as_owner(unsigned long flags, uint32_t owner, int *pidfd, char *err, size_t errcap) {
	if (set_effective_ids(owner) < 0) {
		snprintf(err, errcap, "own the sandbox's user namespace as host uid %u: %s", owner, errtext(errno));
		set_effective_ids(0);
		return -1;
	}
	/* fork-like: no new stack, the child runs on a copy of this one. */
	pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, pidfd, NULL, NULL);
	if (pid == 0)
		return 0;
	int cerr = errno;
	if (set_effective_ids(0) < 0) {
		/* A shim that is not root again can neither map init's ids nor
		 * place it in its cgroups. */
		snprintf(err, errcap, "become root again after starting the sandbox init: %s", errtext(errno));
		if (pid > 0) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
		}
		return -1;
	}
	if (pid < 0)
		snprintf(err, errcap, "start the sandbox init: %s", errtext(cerr));
	return pid;
}

static int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* shim_record records how the command ended: from init's report
 * (sdata), else from init's wait status (ws, when have_ws). */
static int shim_record(const struct plan *p, struct outw *w, const char *sdata, size_t slen, int have_ws, int ws, const char *relerr,
		       int deadline_hit, long ooms_before, int *tell) {
	struct rec r;
	memset(&r, 0, sizeof r);
	int have_status = sdata != NULL && slen >= 12;
	int32_t scode = 0, ssig = 0;
	if (have_status) {
		uint32_t rl;
		memcpy(&scode, sdata, 4);
		memcpy(&ssig, sdata + 4, 4);
		memcpy(&rl, sdata + 8, 4);
		if (rl > slen - 12)
			rl = (uint32_t)(slen - 12);
		r.code = scode;
		r.signo = ssig;
		snprintf(r.reason, sizeof r.reason, "%.*s", (int)rl, sdata + 12);
	} else if (have_ws) {
		r.code = ws_code(ws);
		r.signo = ws_signo(ws);
	}
	if (relerr[0]) {
		out_printf(w, "%s%s\n", SETUP_PREFIX, relerr);
		logmsg("sandbox setup failed: %s", relerr);
		r.code = CODE_SETUP_FAILED;
		r.signo = 0;
		snprintf(r.reason, sizeof r.reason, "%s", relerr);
	}
	/* A Kill that came after the job had ended on its own changes
	 * nothing: only a job that died of a signal was killed. */
	if (exists(FILE_KILLED))
		r.killed = !have_status || ssig != 0;
	/* Likewise for the deadline: a job that ended on its own just as the
	 * deadline came was not killed by it. */
	r.deadline = deadline_hit && (!have_status || ssig != 0);
	long ooms = cg_oom_kills(p);
	if (ooms < 0)
		logmsg("read oom counter: %s", errtext(errno));
	r.oom = ooms > ooms_before;
	r.output_bytes = w->n;
	r.truncated = w->n > w->limit;
	return write_exit(&r, tell);
}

/* open_v1_tasks opens the "tasks" files of a cgroup v1 set, through
 * which init places itself (init_main); v2: none, the shim places it. */
static int open_v1_tasks(const struct plan *p, int *tasks, int *ntasks, char *err, size_t errcap) {
	*ntasks = 0;
	if (p->cg_version != 1)
		return 0;
	for (int i = 0; i < 3; i++) {
		const char *d = cg_dirs(p, i);
		if (d == NULL)
			continue;
		char path[4096];
		snprintf(path, sizeof path, "%s/tasks", d);
		if ((tasks[*ntasks] = open(path, O_WRONLY | O_CLOEXEC)) < 0) {
			snprintf(err, errcap, "place the sandbox in its cgroups: cgroup: open %s: %s", path, errtext(errno));
			for (int j = 0; j < *ntasks; j++)
				close(tasks[j]);
			return -1;
		}
		(*ntasks)++;
	}
	return 0;
}

/* The freezer of a plan's sandbox (thaw, freezeAgain and frozen in Go). */
static void cg_thaw(const struct plan *p) {
	char err[512];
	if (p->cg_freezer[0])
		cg_write(p->cg_freezer, p->cg_version == 2 ? "cgroup.freeze" : "freezer.state", p->cg_version == 2 ? "0" : "THAWED", err,
			 sizeof err);
}

static int cg_frozen(const struct plan *p) {
	if (!p->cg_freezer[0])
		return 0;
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", p->cg_freezer, p->cg_version == 2 ? "cgroup.freeze" : "freezer.state");
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	char buf[32] = "";
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	return strncmp(buf, p->cg_version == 2 ? "1" : "FROZEN", p->cg_version == 2 ? 1 : 6) == 0;
}

/* cg_refreeze freezes a sandbox that was frozen again, after a thaw: its
 * processes are in its freezer group already. */
static void cg_refreeze(const struct plan *p) {
	char err[512];
	if (p->cg_freezer[0])
		cg_write(p->cg_freezer, p->cg_version == 2 ? "cgroup.freeze" : "freezer.state", p->cg_version == 2 ? "1" : "FROZEN", err,
			 sizeof err);
}

/* A kept sandbox's keeper gives each command (cgroup v1) a group of its
 * own, below the sandbox's pids group: the group of the spare init holds
 * ready (spare_child), renamed after the command, or else a new one. */
struct spares {
	int v1;      /* cgroup v1: spares (v2's groups cannot be renamed; the shim makes them) */
	unsigned n;  /* the last spare's number */
	int have;    /* init has a spare in group spare-<n> */
	int sock;    /* the keeper's end of that spare's socket (-1: none) */
};

static ssize_t send_fds(int sock, const void *buf, size_t n, const int *fds, int nfds);

/* spare_make makes the next spare's group and a socket for its request,
 * and sends init both, which forks the spare there; the keeper keeps the
 * socket's other end and gives the spare its command itself (keeper_ask),
 * which spares init's hop on the command's way. */
static void spare_make(const struct plan *p, struct spares *sp, int init) {
	if (!sp->v1 || sp->have)
		return;
	char dir[4200], path[4300];
	snprintf(dir, sizeof dir, "%s/spare-%u", p->cg_pids, ++sp->n);
	snprintf(path, sizeof path, "%s/tasks", dir);
	int fds[2] = {-1, -1}, pair[2] = {-1, -1};
	if (mkdir(dir, 0755) < 0 || (fds[0] = open(path, O_WRONLY | O_CLOEXEC)) < 0 ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) {
		logmsg("a spare's cgroup: %s: %s", dir, errtext(errno));
		if (fds[0] >= 0)
			close(fds[0]);
		rmdir(dir);
		sp->v1 = 0; /* the commands' groups are made as they come */
		return;
	}
	fds[1] = pair[1];
	char head[8];
	uint32_t magic = SPARE_MAGIC, flags = 0;
	memcpy(head, &magic, 4);
	memcpy(head + 4, &flags, 4);
	ssize_t k = send_fds(init, head, sizeof head, fds, 2);
	close(fds[0]);
	close(fds[1]);
	if (k < 0) {
		logmsg("send a spare to the sandbox init: %s", errtext(errno));
		close(pair[0]);
		rmdir(dir);
		return;
	}
	sp->have = 1;
	sp->sock = pair[0];
}

/* group_has_procs says whether the cgroup dir holds a process. */
static int group_has_procs(const char *dir) {
	char path[4300], buf[16];
	snprintf(path, sizeof path, "%s/cgroup.procs", dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n;
	do
		n = read(fd, buf, sizeof buf);
	while (n < 0 && errno == EINTR);
	close(fd);
	return n > 0;
}

/* command_group gives the command exec_id its group: the spare's,
 * renamed, (REQUEST_SPARE, with REQUEST_KILLED if the command's kill
 * marker is there after the rename) or a new one whose cgroup.procs it
 * adds to fds (REQUEST_CGROUP). It returns the request's flags for init.
 * The keeper's working directory is the sandbox's. */
static uint32_t command_group(const struct plan *p, struct spares *sp, const char *exec_id, int *fds, int *nfds) {
	char dir[4200], path[4300];
	snprintf(dir, sizeof dir, "%s/%s", p->cg_pids, exec_id);
	if (sp->v1 && sp->have) {
		char from[4200];
		snprintf(from, sizeof from, "%s/spare-%u", p->cg_pids, sp->n);
		sp->have = 0; /* used, or left to end with init's (its next spare replaces it) */
		/* The spare places itself in its group once init has forked it,
		 * which may not have happened yet: a command given a group
		 * still empty would miss a Kill that came before the spare's
		 * move (its 'P' asks nobody), so it is forked as it comes. */
		if (!group_has_procs(from))
			logmsg("the spare is not in its cgroup %s yet: the command is forked", from);
		else if (rename(from, dir) == 0) {
			/* After the rename: a kill from now on finds the command in
			 * its group; one before left its marker. The spare's
			 * socket is the caller's now (keeper_ask). */
			char killed[64];
			snprintf(killed, sizeof killed, "%s/%s/%s", DIR_EXECS, exec_id, FILE_KILLED);
			return REQUEST_SPARE | (exists(killed) ? REQUEST_KILLED : 0);
		} else
			logmsg("name the spare's cgroup %s: %s", dir, errtext(errno));
		close(sp->sock); /* unused: it ends, unstarted */
		sp->sock = -1;
	}
	int fd = -1;
	snprintf(path, sizeof path, "%s/%s", dir, p->cg_version == 1 ? "tasks" : "cgroup.procs");
	if ((mkdir(dir, 0755) < 0 && errno != EEXIST) || (fd = open(path, O_WRONLY | O_CLOEXEC)) < 0) {
		logmsg("no cgroup of the command's own: %s: %s", dir, errtext(errno));
		return 0;
	}
	fds[(*nfds)++] = fd;
	return REQUEST_CGROUP;
}

/* valid_exec_id says whether id (len bytes) is a command's id as newID
 * makes them. */
static int valid_exec_id(const char *id, size_t len) {
	if (len != EXEC_ID_LEN || memcmp(id, "ex-", 3) != 0)
		return 0;
	for (size_t i = 3; i < len; i++)
		if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
			return 0;
	return 1;
}

/* A command whose request its keeper sent to init itself (keeper_start):
 * what the shim the keeper forks next finds made (command_main). */
struct started_cmd {
	int on;
	int out, err, ctl, fifo; /* the read ends of its output, its ctl end, its status channel (or -1) */
	long ooms_before;	 /* the sandbox's OOM kills before it */
	char cgdir[4200];	 /* its cgroup, "" for none */
	char failed[4096];	 /* why it could not be asked for, "" when it was */
};
static struct started_cmd started;

/* send_fds sends buf with the descriptors fds on the connected socket
 * sock. */
static ssize_t send_fds(int sock, const void *buf, size_t n, const int *fds, int nfds) {
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 8)];
	} cm;
	if (nfds > 8) {
		errno = EINVAL;
		return -1;
	}
	memset(&cm, 0, sizeof cm);
	struct iovec iov = {(void *)buf, n};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds)};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
	memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	ssize_t k;
	do
		k = sendmsg(sock, &mh, MSG_NOSIGNAL);
	while (k < 0 && errno == EINTR);
	return k;
}

/* keeper_ask sends the request of command exec_id on its way (head: its
 * magic and flags; fds, *nfds of them: its plan, stdout, stderr, ctl and
 * perhaps its group's procs file, which it may add): given the spare's
 * group (REQUEST_SPARE), to the spare, and init hears only that it was
 * taken (REQUEST_TAKEN with ctl, for its end), off the command's way;
 * else to init, which forks the command. A spare gone by then leaves its
 * group, renamed, to the command init forks. It returns < 0 if init
 * takes no request. */
static ssize_t keeper_ask(const struct plan *p, struct spares *sp, const char *exec_id, char *head, int *fds, int *nfds, int init) {
	uint32_t flags;
	memcpy(&flags, head + 4, 4);
	if ((flags & REQUEST_SPARE) && sp->sock >= 0) {
		int sock = sp->sock;
		sp->sock = -1;
		ssize_t k = send_fds(sock, head, 8, fds, REQUEST_FDS);
		close(sock);
		if (k >= 0) {
			char taken[8];
			uint32_t tf = REQUEST_TAKEN;
			memcpy(taken, head, 4);
			memcpy(taken + 4, &tf, 4);
			return send_fds(init, taken, sizeof taken, &fds[3], 1);
		}
		logmsg("the spare is gone (%s): command %s is forked", errtext(errno), exec_id);
		char path[4300];
		snprintf(path, sizeof path, "%s/%s/tasks", p->cg_pids, exec_id);
		int cg = open(path, O_WRONLY | O_CLOEXEC);
		flags &= ~(REQUEST_SPARE | REQUEST_KILLED);
		if (cg >= 0) {
			fds[(*nfds)++] = cg;
			flags |= REQUEST_CGROUP;
		}
		memcpy(head + 4, &flags, 4);
	}
	return send_fds(init, head, 8, fds, *nfds);
}

/* keeper_start starts command id (the server's SPAWN_MAGIC request: its
 * plan on plan, the server's pipe on server). The keeper makes what the
 * command's shim would otherwise make (its output pipes, its ctl pair,
 * its cgroup: the spare's, renamed, in v1), sends init the request
 * itself, and only then starts the command's shim (start_shim: one
 * that supervised an earlier command and waits, or a fork): the command
 * starts while its shim is readied, and its request takes one hop
 * instead of a shim's set-up and two hops. */
static int shim_main(size_t cmdline_len);
static int start_shim(const char *id, int plan, int server);
static void command_kill(const struct plan *p, const char *cgdir, pid_t jobpid);

static void keeper_start(const struct plan *p, struct spares *sp, const char *id, int plan, int server, int init) {
	struct started_cmd *s = &started; /* the keeper's own is unused: its shims take a copy with fork */
	memset(s, 0, sizeof *s);
	s->on = 1;
	s->out = s->err = s->ctl = s->fifo = -1;
	int outp[2] = {-1, -1}, errp[2] = {-1, -1}, ctl[2] = {-1, -1}, one = 1;
	int fds[REQUEST_FDS + 1] = {plan, -1, -1, -1, -1}, nfds = REQUEST_FDS;
	if (pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0 ||
	    setsockopt(ctl[0], SOL_SOCKET, SO_PASSCRED, &one, sizeof one) < 0) {
		snprintf(s->failed, sizeof s->failed, "pipe: %s", errtext(errno));
	} else {
		fds[1] = outp[1];
		fds[2] = errp[1];
		fds[3] = ctl[1];
		s->ooms_before = cg_oom_kills(p); /* the sandbox's so far: only new ones are this command's */
		if (s->ooms_before < 0)
			s->ooms_before = 0;
		/* Open before the command can write to it: a FIFO keeps what is
		 * written only while someone holds it open. */
		char channel[64];
		snprintf(channel, sizeof channel, "%s/%s", DIR_CHANNEL, id);
		s->fifo = open(channel, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
		if (s->fifo < 0 && errno != ENOENT)
			logmsg("status channel of command %s: open: %s", id, errtext(errno));
		uint32_t flags = 0;
		if (p->cg_pids[0]) {
			flags = command_group(p, sp, id, fds, &nfds);
			if (flags)
				snprintf(s->cgdir, sizeof s->cgdir, "%s/%s", p->cg_pids, id);
		}
		char head[8];
		uint32_t magic = REQUEST_MAGIC;
		memcpy(head, &magic, 4);
		memcpy(head + 4, &flags, 4);
		if (keeper_ask(p, sp, id, head, fds, &nfds, init) < 0)
			snprintf(s->failed, sizeof s->failed, "the sandbox is gone: its init takes no command (%s)", errtext(errno));
	}
	/* The write ends are the command's alone: its output ends when it
	 * (and what it left behind) closes them. (From the pairs, not fds:
	 * a pipe made before one that failed is not in fds.) */
	int ends[] = {outp[1], errp[1], ctl[1], nfds > REQUEST_FDS ? fds[REQUEST_FDS] : -1};
	for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
		if (ends[i] >= 0)
			close(ends[i]);
	s->out = outp[0];
	s->err = errp[0];
	s->ctl = ctl[0];
	if (start_shim(id, plan, server) < 0 && !s->failed[0] && s->cgdir[0]) {
		/* Its pipe to the server closes unanswered: Wait sees the shim
		 * gone. The command ends with nobody at its ctl, unless it goes
		 * on regardless (a spare, 'P'): killed here. */
		char killed[64];
		snprintf(killed, sizeof killed, "%s/%s/%s", DIR_EXECS, id, FILE_KILLED);
		mark_killed(killed);
		command_kill(p, s->cgdir, 0);
	}
	int ours[] = {outp[0], errp[0], ctl[0], s->fifo};
	for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++)
		if (ours[i] >= 0)
			close(ours[i]);
	s->on = 0;
}

/* place_shim_fds gives a command's shim its descriptors at fixed places:
 * PLAN_FD, SERVER_FD, then what keeper_start made (started) from 6 on,
 * and records the shim's pid in its directory, the working directory.
 * Nothing else stays open. */
static int place_shim_fds(const char *id, int plan, int server) {
	/* Its descriptors at fixed places: PLAN_FD, SERVER_FD, then what
	 * keeper_start made from 6 on. Nothing else of the keeper's stays
	 * (first of all: the moves need room, also when the keeper is at its
	 * descriptor limit, whose soft part is the shim's to raise); then
	 * all are moved above the targets, so that no move overwrites
	 * another descriptor. */
	int from[] = {plan, server, started.out, started.err, started.ctl, started.fifo};
	int to[] = {PLAN_FD, SERVER_FD, 6, 7, 8, 9};
	int n = 6;
	close_except(3, from, n);
	for (int i = 0; i < n; i++)
		if (from[i] >= 0) {
			int moved = fcntl(from[i], F_DUPFD_CLOEXEC, 10);
			if (moved < 0) {
				logmsg("start the shim of command %s: %s", id, errtext(errno));
				return -1;
			}
			close(from[i]);
			from[i] = moved;
		}
	for (int i = 0; i < n; i++)
		if (from[i] >= 0 && dup3(from[i], to[i], O_CLOEXEC) < 0) {
			logmsg("start the shim of command %s: %s", id, errtext(errno));
			return -1;
		}
	/* The moved copies go: all else of the keeper's went above. */
	if (syscall(SYS_close_range, 10, ~0U, 0) < 0)
		for (int fd = 10; fd < 1024; fd++)
			close(fd);
	started.out = started.out >= 0 ? 6 : -1;
	started.err = started.err >= 0 ? 7 : -1;
	started.ctl = started.ctl >= 0 ? 8 : -1;
	started.fifo = started.fifo >= 0 ? 9 : -1;
	char num[32];
	int nn = snprintf(num, sizeof num, "%d", (int)getpid());
	if (write_pid_file(FILE_SHIM_PID, num, (size_t)nn) < 0)
		logmsg("write %s: %s", FILE_SHIM_PID, errtext(errno));
	return 0;
}

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

/* shim_idle readies a command's shim whose command is recorded, and its
 * output closed, for the sandbox's next command: it closes all it had,
 * tells its keeper (IDLE_MAGIC) and waits for a command (start_shim),
 * which it takes as a shim the keeper forked does (spawn_shim). It
 * returns 0 if none comes: the keeper has enough idle shims, or has
 * ended, or none came for SHIM_IDLE_MS. */
static int shim_idle(void) {
	if (logfd >= 0) {
		close(logfd);
		logfd = -1;
	}
	syscall(SYS_close_range, 3, ~0U, 0);
	int pair[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0)
		return 0;
	/* The keeper's control socket, two directories up (execs/<id>). */
	struct sockaddr_un to = {.sun_family = AF_UNIX};
	snprintf(to.sun_path, sizeof to.sun_path, "../../%s", FILE_CONTROL);
	int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	uint32_t head[2] = {IDLE_MAGIC, 0};
	ssize_t k = -1;
	if (sock >= 0 && connect(sock, (struct sockaddr *)&to, sizeof to) == 0)
		k = send_fds(sock, head, sizeof head, &pair[0], 1);
	if (sock >= 0)
		close(sock);
	close(pair[0]);
	struct pollfd q = {pair[1], POLLIN, 0};
	if (k < 0 || poll(&q, 1, SHIM_IDLE_MS) <= 0) {
		close(pair[1]);
		return 0;
	}
	char buf[sizeof(struct handoff) + sizeof started.cgdir + sizeof started.failed];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 8)];
	} cm;
	struct iovec iov = {buf, sizeof buf};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b};
	do
		k = recvmsg(pair[1], &mh, MSG_CMSG_CLOEXEC);
	while (k < 0 && errno == EINTR);
	close(pair[1]);
	int fds[8], nfds = k > 0 ? message_fds(&mh, fds, 8, NULL) : 0;
	struct handoff h;
	int want = 2;
	if (k >= (ssize_t)sizeof h) {
		memcpy(&h, buf, sizeof h);
		for (uint32_t bit = HANDOFF_OUT; bit <= HANDOFF_FIFO; bit <<= 1)
			want += (h.have & bit) != 0;
	}
	/* The two strings after the head, each ended by a NUL. */
	const char *cgdir = buf + sizeof h, *failed = NULL;
	const char *end = buf + (k > 0 ? k : 0);
	const char *nul = k >= (ssize_t)sizeof h ? memchr(cgdir, 0, (size_t)(end - cgdir)) : NULL;
	if (nul != NULL && (failed = nul + 1) < end && memchr(failed, 0, (size_t)(end - failed)) == NULL)
		failed = NULL;
	if (k < (ssize_t)sizeof h || h.magic != HANDOFF_MAGIC || nfds != want || !valid_exec_id(h.id, EXEC_ID_LEN) || failed == NULL ||
	    (mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC))) {
		if (k > 0)
			logmsg("a malformed command from the keeper, dropped");
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return 0;
	}
	char id[EXEC_ID_LEN + 1], dir[64];
	memcpy(id, h.id, EXEC_ID_LEN);
	id[EXEC_ID_LEN] = 0;
	snprintf(dir, sizeof dir, "../%s", id);
	if (chdir(dir) < 0) {
		logmsg("start the shim of command %s: %s", id, errtext(errno));
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return 0;
	}
	memset(&started, 0, sizeof started);
	started.on = 1;
	started.ooms_before = h.ooms_before;
	snprintf(started.cgdir, sizeof started.cgdir, "%s", cgdir);
	snprintf(started.failed, sizeof started.failed, "%s", failed);
	int at = 2, *slots[] = {&started.out, &started.err, &started.ctl, &started.fifo};
	for (int i = 0; i < 4; i++)
		*slots[i] = h.have & (HANDOFF_OUT << i) ? fds[at++] : -1;
	return place_shim_fds(id, fds[0], fds[1]) == 0;
}

/* The keeper's idle shims: its ends of their socket pairs. */
static int idle_shims[IDLE_SHIMS], nidle;

/* hand_to_shim hands command id (what keeper_start made in started, its
 * plan and the server's pipe) to the idle shim at link. */
static int hand_to_shim(int link, const char *id, int plan, int server) {
	struct handoff h = {.magic = HANDOFF_MAGIC, .ooms_before = started.ooms_before};
	memcpy(h.id, id, EXEC_ID_LEN);
	int fds[6] = {plan, server}, nfds = 2;
	int have[4] = {started.out, started.err, started.ctl, started.fifo};
	for (int i = 0; i < 4; i++)
		if (have[i] >= 0) {
			h.have |= HANDOFF_OUT << i;
			fds[nfds++] = have[i];
		}
	char buf[sizeof h + sizeof started.cgdir + sizeof started.failed];
	memcpy(buf, &h, sizeof h);
	size_t n = sizeof h;
	n += (size_t)snprintf(buf + n, sizeof buf - n, "%s", started.cgdir) + 1;
	n += (size_t)snprintf(buf + n, sizeof buf - n, "%s", started.failed) + 1;
	return send_fds(link, buf, n, fds, nfds) < 0 ? -1 : 0;
}

/* start_shim starts command id's shim: an idle one (shim_idle), else a
 * new fork (spawn_shim). */
static int spawn_shim(const char *id, int plan, int server);
static int start_shim(const char *id, int plan, int server) {
	while (nidle > 0) {
		int link = idle_shims[--nidle];
		int ok = hand_to_shim(link, id, plan, server) == 0;
		close(link); /* the shim sends another when it is idle again */
		if (ok)
			return 0;
	}
	return spawn_shim(id, plan, server);
}

/* spawn_shim starts the shim of command id (its directory execs/<id>,
 * its plan on plan, the server's pipe on server, and what keeper_start
 * made in started): a fork of the keeper, which becomes what the server
 * would otherwise have executed ("SelfExe __sandbox-shim
 * <dir>/execs/<id>", command_main), sparing the server a fork and an
 * exec per command. It is in a session of its own and records its pid;
 * its command line is the keeper's, and its parent the keeper (isShimOf
 * in Go knows it by both). The keeper reaps it (SIGCHLD is ignored
 * there). It returns -1 if there is none. */
static int spawn_shim(const char *id, int plan, int server) {
	pid_t pid = fork();
	if (pid < 0) {
		logmsg("start the shim of command %s: %s", id, errtext(errno));
		return -1;
	}
	if (pid > 0)
		return 0;
	signal(SIGCHLD, SIG_DFL);
	if (logfd >= 0) {
		close(logfd); /* the command's log is its own directory's */
		logfd = -1;
	}
	char dir[64];
	snprintf(dir, sizeof dir, "%s/%s", DIR_EXECS, id);
	if (setsid() < 0 || chdir(dir) < 0) {
		logmsg("start the shim of command %s: %s", id, errtext(errno));
		_exit(1);
	}
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (place_shim_fds(id, plan, server) < 0)
		_exit(1);
	int rc = shim_main(0);
	for (int served = 1; served < SHIM_SERVES && rc == 0 && shim_idle(); served++)
		rc = shim_main(0);
	_exit(rc);
}


/* relay_request passes one request that came on ctl (a datagram with
 * descriptors) to init, if it is from root and well formed; a request
 * that names its command (REQUEST_ID) gets the command's group here. A
 * server's request to start a command's shim (SPAWN_MAGIC) is done here
 * (spawn_shim). */
static void relay_request(const struct plan *p, struct spares *sp, int ctl, int init) {
	char buf[64];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * (REQUEST_FDS + 1)) + CMSG_SPACE(sizeof(struct ucred))];
	} cm;
	struct iovec iov = {buf, sizeof buf};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b};
	ssize_t n = recvmsg(ctl, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0)
		return;
	int fds[REQUEST_FDS + 1], root;
	int nfds = message_fds(&mh, fds, REQUEST_FDS + 1, &root);
	uint32_t magic = 0, flags = 0;
	if (n >= 8) {
		memcpy(&magic, buf, 4);
		memcpy(&flags, buf + 4, 4);
	}
	if (magic == IDLE_MAGIC) {
		if (root && nfds == 1 && n == 8 && !(mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) && nidle < IDLE_SHIMS) {
			idle_shims[nidle++] = fds[0];
			return;
		}
		for (int i = 0; i < nfds; i++)
			close(fds[i]); /* enough wait: that shim ends */
		return;
	}
	if (magic == SPAWN_MAGIC) {
		if (root && nfds == SPAWN_FDS && n == 8 + EXEC_ID_LEN && valid_exec_id(buf + 8, EXEC_ID_LEN) && !(mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC))) {
			char id[EXEC_ID_LEN + 1];
			memcpy(id, buf + 8, EXEC_ID_LEN);
			id[EXEC_ID_LEN] = 0;
			keeper_start(p, sp, id, fds[0], fds[1], init);
		} else
			logmsg("a request to start a shim %s, dropped", root ? "malformed" : "not from root");
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return;
	}
	int named = (flags & REQUEST_ID) && !(flags & REQUEST_CGROUP) && nfds == REQUEST_FDS && valid_exec_id(buf + 8, (size_t)n - 8);
	if (!root || magic != REQUEST_MAGIC || nfds == 0 || (n != 8 && !named) || (mh.msg_flags & (MSG_CTRUNC | MSG_TRUNC))) {
		logmsg("a request %s, dropped", root ? "malformed" : "not from root");
	} else {
		/* A failure is the command's shim's to see: its socket with the
		 * command closes unanswered. */
		ssize_t k;
		if (named) {
			char id[EXEC_ID_LEN + 1];
			memcpy(id, buf + 8, EXEC_ID_LEN);
			id[EXEC_ID_LEN] = 0;
			flags = command_group(p, sp, id, fds, &nfds);
			memcpy(buf + 4, &flags, 4);
			k = keeper_ask(p, sp, id, buf, fds, &nfds, init);
		} else
			k = send_fds(init, buf, (size_t)n, fds, nfds);
		if (k < 0)
			logmsg("relay a request to the sandbox init: %s", errtext(errno));
	}
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
}

/* keeper_fail says on SERVER_FD why the kept sandbox could not be made. */
static int keeper_fail(int *server, const char *msg) {
	logmsg("kept sandbox: %s", msg);
	if (*server >= 0) {
		write_all(*server, msg, strlen(msg));
		close(*server);
		*server = -1;
	}
	return 1;
}

/* keeper_main is a kept sandbox's supervisor (runKeeper in
 * keeper_linux.go): it starts the sandbox's init in the sandbox's
 * namespaces, says on SERVER_FD whether the sandbox could be made, then
 * relays command requests from FILE_CONTROL to init until init ends (a
 * kill, Destroy) or the plan's until, when it kills init, and with it
 * every process of the sandbox. */
static int keeper_main(const struct plan *p, size_t cmdline_len) {
	int server = fcntl(SERVER_FD, F_SETFD, FD_CLOEXEC) == 0 ? SERVER_FD : -1;
	char err[4096];
	if (setgroups(0, NULL) < 0) {
		snprintf(err, sizeof err, "drop supplementary groups: %s", errtext(errno));
		return keeper_fail(&server, err);
	}
	int ctl = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0), one = 1;
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", FILE_CONTROL);
	unlink(FILE_CONTROL);
	mode_t old = umask(077);
	int bound = ctl >= 0 && setsockopt(ctl, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) == 0 && bind(ctl, (struct sockaddr *)&sa, sizeof sa) == 0;
	umask(old);
	if (!bound) {
		snprintf(err, sizeof err, "control socket: %s", errtext(errno));
		return keeper_fail(&server, err);
	}
	int req[2], syncp[2], tasks[3], ntasks = 0;
	int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (devnull < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, req) < 0 || pipe2(syncp, O_CLOEXEC) < 0) {
		snprintf(err, sizeof err, "socket pair: %s", errtext(errno));
		return keeper_fail(&server, err);
	}
	if (open_v1_tasks(p, tasks, &ntasks, err, sizeof err) < 0)
		return keeper_fail(&server, err);
	/* init is born in the sandbox's network namespace, which the keeper
	 * leaves again at once: it stays on the host's side. */
	int own = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	if (own < 0 || setns(NETNS_FD, CLONE_NEWNET) < 0) {
		snprintf(err, sizeof err, "join the sandbox's network namespace: %s", errtext(errno));
		return keeper_fail(&server, err);
	}
	close(NETNS_FD);
	int pidfd = -1;
	pid_t pid = clone_as_owner(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD | SIGCHLD,
				   p->host_id_base, &pidfd, err, sizeof err);
	if (pid == 0)
		init_main(p, syncp[0], req[1], devnull, devnull, tasks, ntasks, cmdline_len);
	int left = setns(own, CLONE_NEWNET);
	close(own);
	for (int i = 0; i < ntasks; i++)
		close(tasks[i]);
	close(syncp[0]);
	close(req[1]);
	close(devnull);
	if (pid < 0)
		return keeper_fail(&server, err);

	/* Release (as shim_main does), then init's first word: its root is
	 * built (code 0), or why not. */
	char relerr[4096] = "", num[32];
	int nn = snprintf(num, sizeof num, "%d", (int)pid);
	if (left < 0)
		snprintf(relerr, sizeof relerr, "leave the sandbox's network namespace: %s", errtext(errno));
	else if (write_id_maps(pid, p) < 0)
		snprintf(relerr, sizeof relerr, "map the sandbox's users: %s", errtext(errno));
	else if (write_pid_file(FILE_INIT_PID, num, (size_t)nn) < 0)
		snprintf(relerr, sizeof relerr, "write %s: %s", FILE_INIT_PID, errtext(errno));
	for (int i = 0; i < 3 && !relerr[0] && ntasks == 0; i++) {
		const char *d = cg_dirs(p, i);
		char e2[3000];
		if (d && cg_write(d, "cgroup.procs", num, e2, sizeof e2) < 0)
			snprintf(relerr, sizeof relerr, "place the sandbox in its cgroups: %s", e2);
	}
	if (!relerr[0] && exists(FILE_KILLED))
		snprintf(relerr, sizeof relerr, "killed before start");
	if (!relerr[0] && write_all(syncp[1], "g", 1) < 0)
		snprintf(relerr, sizeof relerr, "release the sandbox init: %s", errtext(errno));
	close(syncp[1]);
	char buf[4200];
	ssize_t n = -1;
	if (!relerr[0]) {
		do
			n = recv(req[0], buf, sizeof buf, 0);
		while (n < 0 && errno == EINTR);
		int32_t code = -1;
		uint32_t rl = 0;
		if (n >= 12) {
			memcpy(&code, buf, 4);
			memcpy(&rl, buf + 8, 4);
			if (rl > (uint32_t)n - 12)
				rl = (uint32_t)n - 12;
		}
		if (n < 12)
			snprintf(relerr, sizeof relerr, "the sandbox init ended while it was set up");
		else if (code != 0)
			snprintf(relerr, sizeof relerr, "%.*s", (int)rl, buf + 12);
	}
	if (relerr[0]) {
		kill(pid, SIGKILL);
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		return keeper_fail(&server, relerr);
	}
	write_all(server, "ok", 2);
	close(server);
	struct spares sp = {.v1 = p->cg_version == 1 && p->cg_pids[0] != 0, .sock = -1};
	spare_make(p, &sp, req[0]);
	/* The shims it starts (spawn_shim) are reaped as they end; init's
	 * end is seen on its pidfd. */
	signal(SIGCHLD, SIG_IGN);

	int64_t until = p->until_ns;
	for (;;) {
		struct pollfd fds[2] = {{ctl, POLLIN, 0}, {pidfd, POLLIN, 0}};
		int timeout = -1;
		if (until != 0) {
			int64_t left_ns = until - now_ns();
			if (left_ns <= 0) {
				/* The sandbox's lifetime is over, server or not: init's
				 * end takes every process of the sandbox along (a frozen
				 * one once thawed). */
				logmsg("the sandbox's lifetime ended");
				cg_thaw(p);
				kill(pid, SIGKILL);
				until = 0;
				continue;
			}
			timeout = left_ns / 1000000 + 1 > 0x7fffffff ? 0x7fffffff : (int)(left_ns / 1000000 + 1);
		}
		if (poll(fds, 2, timeout) < 0)
			continue;
		if (fds[1].revents)
			break;
		if (fds[0].revents) {
			relay_request(p, &sp, ctl, req[0]);
			spare_make(p, &sp, req[0]); /* the next command's */
		}
	}
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	unlink(FILE_CONTROL);
	return 0;
}

/* command_kill kills one command of a kept sandbox: its process group
 * (of jobpid, 0: none) and every process of its cgroup (cgdir, "" for
 * none) until none is left, or two seconds (killCommand in Go). */
static void command_kill(const struct plan *p, const char *cgdir, pid_t jobpid) {
	char err[512];
	if (jobpid > 0) {
		kill(-jobpid, SIGKILL);
		kill(jobpid, SIGKILL);
	}
	if (!cgdir[0])
		return;
	if (p->cg_version == 2)
		cg_write(cgdir, "cgroup.kill", "1", err, sizeof err);
	char path[4200];
	snprintf(path, sizeof path, "%s/cgroup.procs", cgdir);
	for (int64_t end = mono_ns() + 2000000000LL; mono_ns() < end; usleep(1000)) {
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return;
		size_t len;
		char *data = read_all(fd, 1 << 20, &len);
		close(fd);
		int any = 0;
		for (char *s = data; s && *s;) {
			char *e;
			long pid = strtol(s, &e, 10);
			if (e == s)
				break;
			if (pid > 0) {
				kill((pid_t)pid, SIGKILL);
				any = 1;
			}
			s = e;
		}
		free(data);
		if (!any)
			return;
	}
}

/* command_ask asks the sandbox's init for a command whose shim the
 * server started (command_main; one the keeper started has all this
 * made by keeper_start): the command's output pipes and ctl pair (the
 * read ends and the shim's end stay in outp[0], errp[0], ctl[0]), its
 * cgroup (cgdir, "" for none), its status channel (br), and a request
 * sent to the keeper's socket. It returns the sandbox's OOM kills so
 * far; err says what failed. */
static long command_ask(const struct plan *p, char *err, size_t errcap, char *cgdir, size_t cgcap, int *outp, int *errp, int *ctl,
			struct bridge *br) {
	int cg = -1, one = 1;
	if (pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0 ||
	    setsockopt(ctl[0], SOL_SOCKET, SO_PASSCRED, &one, sizeof one) < 0)
		snprintf(err, errcap, "pipe: %s", errtext(errno));
	/* Its own cgroup, below the sandbox's; where none can be made the
	 * command is told apart by its process group (its session) alone.
	 * In cgroup v1 the keeper gives it one (command_group), the request
	 * names the command for that. */
	int named = p->cg_version == 1 && strlen(p->exec_id) == EXEC_ID_LEN;
	if (named)
		snprintf(cgdir, cgcap, "%s/%s", p->cg_pids, p->exec_id);
	else if (!err[0]) {
		snprintf(cgdir, cgcap, "%s/%s", p->cg_pids, p->exec_id);
		char path[4300];
		snprintf(path, sizeof path, "%s/cgroup.procs", cgdir);
		if ((mkdir(cgdir, 0755) < 0 && errno != EEXIST) || (cg = open(path, O_WRONLY | O_CLOEXEC)) < 0) {
			logmsg("no cgroup of the command's own: %s: %s", cgdir, errtext(errno));
			cgdir[0] = 0;
		}
	}
	long ooms_before = cg_oom_kills(p); /* the sandbox's so far: only new ones are this command's */
	if (ooms_before < 0)
		ooms_before = 0;
	br_open(br, p, p->channel, -1);
	if (!err[0]) {
		char head[8 + EXEC_ID_LEN];
		uint32_t magic = REQUEST_MAGIC, flags = cg >= 0 ? REQUEST_CGROUP : named ? REQUEST_ID : 0;
		memcpy(head, &magic, 4);
		memcpy(head + 4, &flags, 4);
		if (named)
			memcpy(head + 8, p->exec_id, EXEC_ID_LEN);
		int fds[REQUEST_FDS + 1] = {PLAN_FD, outp[1], errp[1], ctl[1], cg};
		int nfds = cg >= 0 ? REQUEST_FDS + 1 : REQUEST_FDS;
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int) * (REQUEST_FDS + 1))];
		} cm;
		memset(&cm, 0, sizeof cm);
		struct sockaddr_un to;
		memset(&to, 0, sizeof to);
		to.sun_family = AF_UNIX;
		snprintf(to.sun_path, sizeof to.sun_path, "../../%s", FILE_CONTROL);
		struct iovec iov = {head, named ? sizeof head : 8};
		struct msghdr mh = {.msg_name = &to, .msg_namelen = sizeof to, .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
				    .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds)};
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
		int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		ssize_t k = -1;
		if (sock >= 0) {
			do
				k = sendmsg(sock, &mh, 0);
			while (k < 0 && errno == EINTR);
		}
		if (k < 0)
			snprintf(err, errcap, "the sandbox is gone: its init takes no command (%s)", errtext(errno));
		if (sock >= 0)
			close(sock);
	}
	int ends[] = {PLAN_FD, outp[1], errp[1], ctl[1], cg};
	for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
		if (ends[i] >= 0)
			close(ends[i]);
	return ooms_before;
}

/* command_main supervises one command of a kept sandbox (runCommandShim
 * in keeper_linux.go): it asks the sandbox's init for the command, lets
 * it go once it is in its cgroup (unless Kill came first), keeps its
 * output and status lines, enforces its deadline (its own processes
 * only), records its end as soon as init reports it (and closes
 * SERVER_FD: the server's Wait wakes up), and stays while what the
 * command left in the background holds its output open. */
static int command_main(const struct plan *p, struct outw *w) {
	int server = fcntl(SERVER_FD, F_SETFD, FD_CLOEXEC) == 0 ? SERVER_FD : -1;
	char err[4096] = "", cgdir[4200] = "";
	int outp[2] = {-1, -1}, errp[2] = {-1, -1}, ctl[2] = {-1, -1};
	long ooms_before = 0;
	struct bridge br;
	if (started.on) {
		/* Its keeper asked init for the command (keeper_start). */
		snprintf(err, sizeof err, "%s", started.failed);
		snprintf(cgdir, sizeof cgdir, "%s", started.cgdir);
		outp[0] = started.out;
		errp[0] = started.err;
		ctl[0] = started.ctl;
		ooms_before = started.ooms_before;
		br_open(&br, p, NULL, started.fifo);
		close(PLAN_FD);
	} else
		ooms_before = command_ask(p, err, sizeof err, cgdir, sizeof cgdir, outp, errp, ctl, &br);
	struct outs os = {-1, {-1, -1}};
	if (!err[0] && outs_init(&os, outp[0], errp[0]) < 0)
		snprintf(err, sizeof err, "epoll: %s", errtext(errno));
	int ret = 0;
	if (err[0]) {
		ret = finish_failed(w, err);
		if (os.fd[0] < 0 && outp[0] >= 0)
			close(outp[0]);
		if (os.fd[1] < 0 && errp[0] >= 0)
			close(errp[0]);
		goto out;
	}

	int placed = 0, recorded = 0, deadline_hit = 0, refreeze = 0;
	pid_t jobpid = 0;
	struct pollfd fds[3] = {{os.ep, POLLIN, 0}, {br.fifo, POLLIN, 0}, {ctl[0], POLLIN, 0}};
	char buf[65536];
	while (!recorded || outs_open(&os)) {
		int64_t wait_ns = -1;
		if (p->deadline_ns != 0 && !deadline_hit && !recorded) {
			int64_t left = p->deadline_ns - now_ns();
			if (left <= 0) {
				/* The backstop for a command that no server watches: its
				 * own processes, not the sandbox's others. A paused
				 * sandbox is thawed until the end is recorded (init,
				 * which reaps the command and reports, is frozen too). */
				deadline_hit = 1;
				mark_killed(FILE_KILLED);
				if (cg_frozen(p)) {
					cg_thaw(p);
					refreeze = 1;
				}
				command_kill(p, cgdir, jobpid);
				continue;
			}
			wait_ns = left;
		}
		if (br_due(&br, &wait_ns, &fds[1].fd))
			continue;
		int timeout = wait_ns < 0 ? -1 : wait_ns / 1000000 + 1 > 0x7fffffff ? 0x7fffffff : (int)(wait_ns / 1000000 + 1);
		if (poll(fds, 3, timeout) < 0) {
			if (errno != EINTR) {
				logmsg("poll: %s", errtext(errno));
				usleep(10000);
			}
			continue;
		}
		if (fds[0].revents)
			outs_read(&os, w, buf, sizeof buf);
		if (fds[1].fd >= 0 && fds[1].revents)
			br_read(&br, 0);
		if (fds[2].fd < 0 || fds[2].revents == 0)
			continue;
		char m[4200];
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(struct ucred))];
		} cm;
		struct iovec iov = {m, sizeof m};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b};
		ssize_t n = recvmsg(ctl[0], &mh, MSG_DONTWAIT);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n == 1 && (m[0] == CTL_PLACED || m[0] == CTL_PLACED_AHEAD) && !placed) {
			/* Kill writes its marker before it kills what is in the
			 * command's group: either it sees the command there now,
			 * or the command never goes. */
			placed = 1;
			struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
			if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
				struct ucred cr;
				memcpy(&cr, CMSG_DATA(c), sizeof cr);
				jobpid = cr.pid;
				/* For a Kill from the server, which ends a command
				 * without a cgroup of its own by its process group;
				 * one with a group is ended through it, and the file
				 * (made on the data directory's filesystem, milliseconds
				 * at times) would only hold up its end's record. */
				if (!cgdir[0] || !exists(cgdir)) {
					char num[32];
					int nn = snprintf(num, sizeof num, "%d", (int)jobpid);
					write_pid_file(FILE_JOB_PID, num, (size_t)nn);
				}
			}
			if (m[0] == CTL_PLACED) {
				char answer = exists(FILE_KILLED) || deadline_hit ? CTL_KILLED : CTL_GO;
				send(ctl[0], &answer, 1, MSG_NOSIGNAL);
			}
			continue;
		}
		if (n >= 12) {
			/* The command's end, or why it could not start (the first
			 * report: init's after it is the same end again). What it
			 * wrote before it ended is read first (until the pipes stay
			 * quiet a moment: what it left in the background may hold
			 * them open). */
			struct pollfd q = {os.ep, POLLIN, 0};
			while (outs_open(&os) && poll(&q, 1, 20) > 0)
				if (outs_read(&os, w, buf, sizeof buf) <= 0 && errno != EINTR)
					break;
			if (br.fifo >= 0)
				br_read(&br, 0);
			if (shim_record(p, w, m, (size_t)n, 0, 0, "", deadline_hit, ooms_before, &server) < 0) {
				logmsg("cannot record the exit status: %s", errtext(errno));
				ret = 1;
			}
		} else {
			/* Nobody holds the command's socket any more without a word:
			 * init has ended (the sandbox was destroyed, or its lifetime
			 * is over), and every process of it with it. */
			while (outs_open(&os)) {
				int k = outs_read(&os, w, buf, sizeof buf);
				if (k == 0 || (k < 0 && errno != EINTR))
					break;
			}
			const char *why = "the sandbox ended before the command did";
			out_printf(w, "%s%s\n", SETUP_PREFIX, why);
			struct rec r;
			memset(&r, 0, sizeof r);
			r.code = 128 + SIGKILL;
			r.signo = SIGKILL;
			r.killed = exists(FILE_KILLED);
			if (!r.killed)
				snprintf(r.reason, sizeof r.reason, "%s", why);
			r.deadline = deadline_hit;
			r.oom = cg_oom_kills(p) > ooms_before;
			r.output_bytes = w->n;
			r.truncated = w->n > w->limit;
			if (write_exit(&r, &server) < 0) {
				logmsg("cannot record the exit status: %s", errtext(errno));
				ret = 1;
			}
		}
		recorded = 1;
		if (server >= 0) {
			close(server); /* the server's Wait wakes up (if write_exit has not closed it) */
			server = -1;
		}
		close(ctl[0]);
		ctl[0] = -1;
		fds[2].fd = -1;
	}
	for (int i = 0; i < 2; i++)
		if (os.fd[i] >= 0)
			close(os.fd[i]);
	if (refreeze)
		cg_refreeze(p);
out:
	if (os.ep >= 0)
		close(os.ep);
	if (ctl[0] >= 0)
		close(ctl[0]);
	br_close(&br);
	if (server >= 0)
		close(server);
	if (cgdir[0])
		rmdir(cgdir); /* only once empty: what the command left behind keeps it */
	unlink(p->channel);
	if (w->err)
		logmsg("write output file: %s", errtext(w->err));
	return ret;
}

/* shim_main supervises one sandboxed command (runShim/supervise in
 * shim_linux.go): it starts init in fresh namespaces, places it in the
 * sandbox's cgroups, lets it go, keeps the output and the status lines,
 * enforces the deadline, and records how the command ended in exit.json.
 * It returns the shim's exit status. */
static int shim_main(size_t cmdline_len) {
	signal(SIGPIPE, SIG_IGN); /* a dead init must not take the shim along */
	struct outw w = {-1, -1, DEFAULT_OUTPUT_LIMIT, 0, 0, 0};
	size_t len = 0;
	char *data = read_all(PLAN_FD, MAX_PLAN_BYTES, &len);
	int rerr = errno;
	struct plan p;
	char err[4096] = "";
	if (data == NULL)
		snprintf(err, sizeof err, "read the plan: %s", errtext(rerr));
	else if (len == 0)
		snprintf(err, sizeof err, "no plan: the server went away before it sent one");
	else if (parse_plan(data, len, &p, err, sizeof err) == 0 && p.output_limit > 0)
		w.limit = p.output_limit;
	if (err[0])
		return finish_failed(&w, err);
	if (p.mode == MODE_COMMAND) {
		int rc = command_main(&p, &w); /* hands the plan (PLAN_FD) on */
		/* The shim may supervise another command (shim_idle). */
		if (w.fd >= 0)
			close(w.fd);
		if (w.sfd >= 0)
			close(w.sfd);
		plan_free(&p);
		free(data);
		return rc;
	}
	close(PLAN_FD);
	if (p.mode == MODE_KEEPER)
		return keeper_main(&p, cmdline_len);
	if (p.net_name[0])
		return finish_failed(&w, "network: the C helpers start no network helper (the server gives such sandboxes to the Go ones)");
	/* Supplementary groups would follow init and the job into the
	 * sandbox and still grant host group access (root's group!) there. */
	if (setgroups(0, NULL) < 0) {
		snprintf(err, sizeof err, "drop supplementary groups: %s", errtext(errno));
		return finish_failed(&w, err);
	}

	int syncp[2], statusp[2], outp[2], errp[2];
	if (pipe2(syncp, O_CLOEXEC) < 0 || pipe2(statusp, O_CLOEXEC) < 0 || pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
		snprintf(err, sizeof err, "pipe: %s", errtext(errno));
		return finish_failed(&w, err);
	}
	struct outs os;
	if (outs_init(&os, outp[0], errp[0]) < 0) {
		snprintf(err, sizeof err, "epoll: %s", errtext(errno));
		return finish_failed(&w, err);
	}
	/* cgroup v1: init places itself (init_main), through the groups'
	 * "tasks" files opened here; v2: the shim places it, below. */
	int tasks[3], ntasks = 0;
	if (open_v1_tasks(&p, tasks, &ntasks, err, sizeof err) < 0)
		return finish_failed(&w, err);
	/* A network namespace made ahead of need by the server (loopback up),
	 * or a new one. The shim itself does no networking. */
	unsigned long newnet = CLONE_NEWNET;
	if (p.netns) {
		if (setns(NETNS_FD, CLONE_NEWNET) < 0) {
			snprintf(err, sizeof err, "join the sandbox's network namespace: %s", errtext(errno));
			return finish_failed(&w, err);
		}
		close(NETNS_FD);
		newnet = 0;
	}
	int pidfd = -1;
	pid_t pid = clone_as_owner(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | newnet | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD | SIGCHLD,
				   p.host_id_base, &pidfd, err, sizeof err);
	if (pid == 0)
		init_main(&p, syncp[0], statusp[1], outp[1], errp[1], tasks, ntasks, cmdline_len);
	for (int i = 0; i < ntasks; i++)
		close(tasks[i]);
	close(syncp[0]);
	close(statusp[1]);
	close(outp[1]);
	close(errp[1]);
	if (pid < 0)
		return finish_failed(&w, err);

	struct bridge br;
	br_open(&br, &p, FILE_STATUS_FIFO, -1);

	/* Release: maps, pid record, cgroups (v2; init places itself in v1
	 * groups), then the go-ahead, unless Kill came first (it writes its
	 * marker before it kills what is in the cgroups: either it sees init
	 * there now, or init never goes; init checks again once placed). */
	char relerr[4096] = "";
	int killed_before_start = 0;
	char num[32];
	int nn = snprintf(num, sizeof num, "%d", (int)pid);
	int mapped = write_id_maps(pid, &p);
	if (mapped < 0) {
		snprintf(relerr, sizeof relerr, "map the sandbox's users: %s", errtext(errno));
	} else if (write_pid_file(FILE_INIT_PID, num, (size_t)nn) < 0) {
		snprintf(relerr, sizeof relerr, "write %s: %s", FILE_INIT_PID, errtext(errno));
	} else if (ntasks == 0) {
		for (int i = 0; i < 3 && !relerr[0]; i++) {
			const char *d = cg_dirs(&p, i);
			char e2[3000];
			if (d && cg_write(d, "cgroup.procs", num, e2, sizeof e2) < 0)
				snprintf(relerr, sizeof relerr, "place the sandbox in its cgroups: %s", e2);
		}
	}
	if (!relerr[0] && exists(FILE_KILLED))
		killed_before_start = 1;
	if (relerr[0] || killed_before_start || write_all(syncp[1], "g", 1) < 0) {
		if (!relerr[0] && !killed_before_start)
			snprintf(relerr, sizeof relerr, "release the sandbox init: %s", errtext(errno));
		kill(pid, SIGKILL); /* before the EOF below: init never acts */
	}
	close(syncp[1]);

	/* Until init has exited: output, status lines, deadline. */
	int deadline_hit = 0;
	char *sdata = NULL;
	size_t slen = 0;
	struct pollfd fds[3] = {{os.ep, POLLIN, 0}, {br.fifo, POLLIN, 0}, {pidfd, POLLIN, 0}};
	char buf[65536];
	for (;;) {
		int64_t wait_ns = -1; /* -1: no time limit */
		if (p.deadline_ns != 0 && !deadline_hit && !relerr[0] && !killed_before_start) {
			int64_t left = p.deadline_ns - now_ns();
			if (left <= 0) {
				/* The backstop for a job that no server watches. */
				deadline_hit = 1;
				mark_killed(FILE_KILLED);
				kill(pid, SIGKILL);
				cg_kill(&p);
				continue;
			}
			wait_ns = left;
		}
		if (br_due(&br, &wait_ns, &fds[1].fd))
			continue;
		int timeout = wait_ns < 0 ? -1 : wait_ns / 1000000 + 1 > 0x7fffffff ? 0x7fffffff : (int)(wait_ns / 1000000 + 1);
		int k = poll(fds, 3, timeout);
		if (k < 0) {
			if (errno != EINTR) {
				logmsg("poll: %s", errtext(errno));
				usleep(10000); /* ENOMEM passes; giving up would block the job */
			}
			continue;
		}
		if (fds[0].revents)
			outs_read(&os, &w, buf, sizeof buf);
		if (fds[1].fd >= 0 && fds[1].revents)
			br_read(&br, 0);
		if (fds[2].revents)
			break;
	}
	int ws = 0;
	while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
		;
	/* init's end took every process of the sandbox with it: what is left
	 * in the pipes is all there will be. */
	while (outs_open(&os)) {
		int n = outs_read(&os, &w, buf, sizeof buf);
		if (n == 0 || (n < 0 && errno != EINTR))
			break;
	}
	for (int i = 0; i < 2; i++)
		if (os.fd[i] >= 0)
			close(os.fd[i]);
	if (os.ep >= 0)
		close(os.ep);
	br_close(&br);
	sdata = read_all(statusp[0], 1 << 16, &slen);
	close(statusp[0]);
	int ret = 0;
	if (shim_record(&p, &w, sdata, slen, 1, ws, relerr, deadline_hit, 0, NULL) < 0) {
		logmsg("cannot record the exit status: %s", errtext(errno));
		ret = 1;
	}
	free(sdata);
	if (w.err)
		logmsg("write output file: %s", errtext(w.err));
	if (w.fd >= 0)
		close(w.fd);
	if (w.sfd >= 0)
		close(w.sfd);
	return ret;
}

/* probe_main starts an init that only checks it is pid 1 and uid 0, in
 * a user namespace owned by host uid base as a sandbox's is (shimProbe in
 * shim_linux.go). */
static int probe_main(uint32_t base) {
	int sync[2];
	char err[512];
	if (base == 0 || pipe2(sync, O_CLOEXEC) < 0)
		return 1;
	pid_t pid = clone_as_owner(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD, base, NULL,
				   err, sizeof err);
	if (pid == 0) {
		char c;
		close(sync[1]);
		if (read(sync[0], &c, 1) != 1 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
			_exit(CODE_SETUP_FAILED);
		_exit(getpid() == 1 && getuid() == 0 ? 0 : CODE_SETUP_FAILED);
	}
	close(sync[0]);
	if (pid < 0) {
		logmsg("sandbox init probe: %s", err);
		return 1;
	}
	struct plan p;
	memset(&p, 0, sizeof p);
	p.host_id_base = base;
	p.id_range = 65536;
	int ok = write_id_maps(pid, &p) == 0 && write_all(sync[1], "g", 1) == 0;
	if (!ok)
		logmsg("sandbox init probe: map the users: %s", errtext(errno));
	close(sync[1]);
	int ws;
	while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
		;
	if (!ok || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
		logmsg("sandbox init probe: not pid 1 and uid 0 in fresh namespaces (status %#x)", ws);
		return 1;
	}
	return write_all(1, "ok\n", 3) == 0 ? 0 : 1;
}

/* The dispatch, at load time, before the Go runtime: cheap (one getenv)
 * in every process that is not a C shim. */
__attribute__((constructor)) static void delegate_sandbox_helper(void) {
	const char *sel = getenv(SELECT_ENV);
	if (sel == NULL || strcmp(sel, SELECT_C) != 0)
		return;
	int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	size_t len = 0;
	char *cmd = read_all(fd, 1 << 20, &len);
	close(fd);
	if (cmd == NULL)
		return;
	/* argv: SelfExe __sandbox-shim <dir> | --probe <host uid> */
	char *args[5] = {NULL, NULL, NULL, NULL, NULL};
	int n = 0;
	for (size_t i = 0; i < len && n < 5; i += strlen(cmd + i) + 1)
		args[n++] = cmd + i;
	if (n == 4 && strcmp(args[1], SHIM_COMMAND) == 0 && strcmp(args[2], PROBE_ARG) == 0)
		_exit(probe_main((uint32_t)strtoul(args[3], NULL, 10)));
	if (n != 3 || strcmp(args[1], SHIM_COMMAND) != 0)
		return; /* not ours after all: the Go side will say what is wrong */
	if (args[2][0] != '/') {
		logmsg("usage: %s <absolute sandbox dir> (a plan on descriptor %d)", SHIM_COMMAND, PLAN_FD);
		_exit(2);
	}
	if (chdir(args[2]) < 0) {
		logmsg("cannot enter the sandbox directory %s: %s", args[2], errtext(errno));
		_exit(1);
	}
	log_to_file = 1;
	_exit(shim_main(len));
}

/* ---------- for the Go tests (helper_cgo_linux.go) ---------- */

const char *dsh_constants(void) {
	static char buf[2048];
	snprintf(buf, sizeof buf,
		 "magic=%u version=%u max=%u shim=%s init=%s argv0=%s probe=%s env=%s=%s prefix=%s codes=%d,%d,%d limit=%lld path=%s "
		 "files=%s,%s,%s,%s,%s,%s,%s,%s,%s plan_fd=%d netns_fd=%d ops=%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d",
		 PLAN_MAGIC, PLAN_VERSION, MAX_PLAN_BYTES, SHIM_COMMAND, INIT_COMMAND, INIT_ARGV0, PROBE_ARG, SELECT_ENV, SELECT_C,
		 SETUP_PREFIX, CODE_SETUP_FAILED, CODE_CANNOT_EXEC, CODE_NOT_FOUND, DEFAULT_OUTPUT_LIMIT, DEFAULT_JOB_PATH, FILE_OUTPUT,
		 FILE_STREAMS, FILE_EVENTS, FILE_EVENTS_LATEST, FILE_STATUS_FIFO, FILE_KILLED, FILE_INIT_PID, FILE_EXIT, FILE_SHIM_LOG, PLAN_FD, NETNS_FD, OP_MOUNT, OP_MKDIR, OP_TOUCH,
		 OP_SYMLINK, OP_READ_ONLY, OP_PIVOT, OP_UNSHARE_CGROUP, OP_HOSTNAME, OP_LOOPBACK, OP_NO_CORE_DUMPS, OP_DROP_BOUNDING,
		 OP_SECCOMP, OP_RESOLV_CONF, OP_INPUT, OP_SYSCTL, OP_NOFILE);
	size_t n = strlen(buf);
	snprintf(buf + n, sizeof buf - n,
		 ",%d,%d,%d kept=%d modes=%d,%d,%d request=%u,%u,%u,%u,%u,%d,%d ctl=%c%c%c server_fd=%d files=%s,%s spawn=%u,%d,%s,%s ahead=%c,%u channel=%s", OP_UNSHARE,
		 OP_KEEP_PATH, OP_BIND_KEPT, KEPT_SLOTS, MODE_SANDBOX, MODE_KEEPER, MODE_COMMAND, REQUEST_MAGIC, REQUEST_CGROUP,
		 REQUEST_ID, REQUEST_SPARE, SPARE_MAGIC, REQUEST_FDS, EXEC_ID_LEN, CTL_PLACED, CTL_GO, CTL_KILLED, SERVER_FD,
		 FILE_CONTROL, FILE_JOB_PID, SPAWN_MAGIC, SPAWN_FDS, FILE_SHIM_PID, DIR_EXECS, CTL_PLACED_AHEAD, REQUEST_KILLED, DIR_CHANNEL);
	return buf;
}

/* dsh_job_path is job_path for TestJobPath; env is NUL-separated. It
 * returns the path, or "" with the PATH searched in *pathenv. */
const char *dsh_job_path(const char *name, const char *envblock, int envlen, const char *dir, const char **pathenv) {
	static char buf[4096];
	static char *env[64];
	int n = 0;
	for (int i = 0; i < envlen && n < 63; i += (int)strlen(envblock + i) + 1)
		env[n++] = (char *)envblock + i;
	env[n] = NULL;
	const char *p = job_path(name, env, dir, buf, sizeof buf, pathenv);
	return p ? p : "";
}

/* dsh_quote is quote, for TestCQuote. */
const char *dsh_quote(const char *s) {
	static char buf[4200];
	quote(buf, sizeof buf, s);
	return buf;
}

/* dsh_cgroups is, for TestCCgroups, the distinct directories of a set
 * (newline-separated) and the OOM kills read from it (-1: unreadable). */
const char *dsh_cgroups(int version, const char *memory, const char *cpu, const char *pids, long *ooms) {
	static char buf[3 * 4096 + 4];
	struct plan p;
	memset(&p, 0, sizeof p);
	p.cg_version = (uint32_t)version;
	p.cg_memory = (char *)memory;
	p.cg_cpu = (char *)cpu;
	p.cg_pids = (char *)pids;
	buf[0] = 0;
	for (int i = 0; i < 3; i++) {
		const char *d = cg_dirs(&p, i);
		if (d != NULL)
			snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s\n", d);
	}
	*ooms = cg_oom_kills(&p);
	return buf;
}
