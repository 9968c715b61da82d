//go:build linux && cgo

/*
 * What every role of the C helpers uses (helper_linux.h says which file
 * holds which role): small tools (writing, reading, logging, quoting),
 * and the dispatch at load time (dispatchHelper in reexec.go), which
 * makes this process a shim before the Go runtime starts; and the hooks
 * the Go tests call (helper_cgo_linux.go).
 */

#include "helper_linux.h"

#include <link.h>
#include <malloc.h>
#include <sys/auxv.h>

int write_all(int fd, const void *buf, size_t n) {
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
char *read_all(int fd, size_t max, size_t *len) {
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
const char *errtext(int e) {
	static char buf[128];
	snprintf(buf, sizeof buf, "%s", strerror(e));
	if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z'))
		buf[0] = (char)(buf[0] - 'A' + 'a');
	return buf;
}

/* quote writes s as Go's %q does for printable text. */
void quote(char *out, size_t cap, const char *s) {
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
int logfd = -1, log_to_file = 0;

void logmsg(const char *fmt, ...) {
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
int write_file_atomic(const char *name, const char *data, size_t n) {
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

/* write_pid_file writes a pid record whole into "." name ".tmp" (in the
 * working directory), then
 * renames it into place: a reader finds no file (no pid yet), or all of
 * it, never one created and not yet written (writePIDFile in Go, which
 * names the temporary file alike). The temporary file may have been made
 * ahead, empty (aheadFiles): it is truncated only if it is not (on ext4 a
 * truncation to nothing makes the file's close start its writeback:
 * auto_da_alloc); and the rename, onto a name not there yet, is no
 * replace-by-rename, which would start it too. */
int write_pid_file(const char *name, const char *data, size_t n) {
	char tmp[256];
	if ((size_t)snprintf(tmp, sizeof tmp, ".%s.tmp", name) >= sizeof tmp) {
		errno = ENAMETOOLONG;
		return -1;
	}
	int fd = open(tmp, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -1;
	struct stat st;
	int rc = fstat(fd, &st);
	if (rc == 0 && st.st_size != 0)
		rc = ftruncate(fd, 0);
	if (rc == 0)
		rc = write_all(fd, data, n);
	if (close(fd) < 0 && rc == 0)
		rc = -1;
	if (rc == 0)
		rc = rename(tmp, name);
	if (rc < 0) {
		int e = errno;
		unlink(tmp);
		errno = e;
	}
	return rc;
}

int64_t mono_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int exists(const char *name) {
	struct stat st;
	return lstat(name, &st) == 0;
}

/* mark_killed leaves the kill marker at path (FILE_KILLED, in a job's
 * or a command's directory), as Kill does in Go. */
void mark_killed(const char *path) {
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd >= 0)
		close(fd);
}

/* close_except closes every descriptor from lo on but the n (at most
 * 8, in any order) of keep; those below lo, and -1, are left out. */
void close_except(unsigned lo, const int *keep, int n) {
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

/* close_strays closes what the shim inherited beyond what the server
 * gives it (PLAN_FD, NETNS_FD, SERVER_FD): a descriptor the server's
 * own parent left open without close-on-exec passes through the
 * server's exec of the shim, and a shim (a keeper: a kept sandbox's
 * life) would hold it for as long as it runs (the lock of a script that
 * ran the server's tests, for one). closeInherited in shim_linux.go. */
static void close_strays(void) {
	if (syscall(SYS_close_range, SERVER_FD + 1, ~0U, 0) < 0)
		for (int fd = SERVER_FD + 1; fd < 1024; fd++)
			close(fd);
}

/* The start of .data (glibc's crt1 defines it): what the writable
 * segment holds before it (the GOT, written by the loader) is the
 * loader's. Weak: a C runtime without it leaves the segment whole. */
extern char __data_start[] __attribute__((weak));

/* data_written says whether the page at pg of the writable segment may
 * hold what a C helper wrote, rather than the file's content: the
 * loader's part (up to .data's first page), and the pages of the C
 * variables that have initial values (all else the C code writes is in
 * .bss, past the file's part, anonymous memory). A C variable with an
 * initial value added elsewhere must be added here:
 * TestCHelperDataPages fails until it is. Go's own data is never
 * written in a helper: the Go runtime never starts in one. */
static int data_written(uintptr_t pg, uintptr_t page) {
	const struct {
		const void *start;
		size_t size;
	} vars[] = {{&logfd, sizeof logfd}, {&report_fd, sizeof report_fd}, {&kept_fd, sizeof kept_fd}};
	if (__data_start == NULL || pg < (((uintptr_t)__data_start & ~(page - 1)) + page))
		return 1;
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
		uintptr_t first = (uintptr_t)vars[i].start & ~(page - 1);
		uintptr_t last = ((uintptr_t)vars[i].start + vars[i].size - 1) & ~(page - 1);
		if (pg >= first && pg <= last)
			return 1;
	}
	return 0;
}

/* drop_clean_data gives back the pages of the writable segment [a, b)
 * that hold the file's content, never written (data_written): the
 * fault-around that maps 64 KiB at each read of a C variable or of the
 * GOT maps Go's data around them, ~200 KiB in each helper. */
static void drop_clean_data(uintptr_t a, uintptr_t b, uintptr_t page) {
	uintptr_t run = 0; /* the start of a run of pages to give back (0: none) */
	for (uintptr_t pg = a; pg < b; pg += page) {
		int keep = data_written(pg, page);
		if (!keep && run == 0)
			run = pg;
		else if (keep && run != 0) {
			madvise((void *)run, pg - run, MADV_DONTNEED);
			run = 0;
		}
	}
	if (run != 0)
		madvise((void *)run, b - run, MADV_DONTNEED);
}

/* drop_image_pages gives back the pages of this binary a helper holds
 * and has not written: its code and read-only data, and the writable
 * segment's pages that hold the file's content (drop_clean_data). What
 * the helper runs next comes back page by page (and the 64 KiB around
 * each: the kernel's fault-around), minor faults from the page cache:
 * nothing is read from the disk again, and what the helper wrote,
 * anonymous memory, stays. The segments go last to first: the first
 * holds the program headers this loop reads. */
static void drop_image_pages(void) {
	const ElfW(Phdr) *ph = (const ElfW(Phdr) *)getauxval(AT_PHDR);
	size_t n = getauxval(AT_PHNUM);
	if (ph == NULL)
		return;
	uintptr_t base = 0, page = (uintptr_t)sysconf(_SC_PAGESIZE);
	for (size_t i = 0; i < n; i++)
		if (ph[i].p_type == PT_PHDR)
			base = (uintptr_t)ph - ph[i].p_vaddr;
	for (size_t i = n; i-- > 0;) {
		if (ph[i].p_type != PT_LOAD)
			continue;
		uintptr_t a = (base + ph[i].p_vaddr) & ~(page - 1);
		uintptr_t b = (base + ph[i].p_vaddr + ph[i].p_filesz) & ~(page - 1); /* whole pages of the file only */
		if (b <= a)
			continue;
		if (ph[i].p_flags & PF_W)
			drop_clean_data(a, b, page);
		else
			madvise((void *)a, b - a, MADV_DONTNEED);
	}
}

/* give_back_stack returns to the kernel the stack's pages below this
 * frame and two more pages, where the frames of what the helper did
 * before it waits lie dead (the buffers of a command it served: 64 KiB
 * and more), so that a waiting helper holds what it will use, not what
 * it used. A page touched again comes back zeroed, as a new stack's. The
 * range below the stack's lowest page is its guard gap, where nothing is
 * mapped (madvise skips it, saying ENOMEM). */
void __attribute__((noinline)) give_back_stack(void) {
	char here;
	uintptr_t page = 4096;
	uintptr_t end = ((uintptr_t)&here - 2 * page) & ~(page - 1);
	uintptr_t size = 256 << 10;
	if (end > size)
		madvise((void *)(end - size), size, MADV_DONTNEED);
}

/* lean_poll is poll for a long-lived helper's wait (a kept sandbox's
 * keeper, init, spare and idle shim): once nothing has come for
 * LEAN_AFTER_MS, the helper gives back what it holds and does not need
 * while it waits (its dead stack, the binary's pages it has not written,
 * its free heap) and waits on. A burst of commands never pays for it;
 * a sandbox left idle holds, beside its anonymous memory, none of the
 * 50 MB binary's file pages, whose union over its helpers was ~500 KiB:
 * more than all of bubblewrap's processes (issue 41, item 5). */
int lean_poll(struct pollfd *fds, nfds_t n, int timeout) {
	int first = timeout < 0 || timeout > LEAN_AFTER_MS ? LEAN_AFTER_MS : timeout;
	int r = poll(fds, n, first);
	if (r != 0 || first == timeout)
		return r;
	give_back_stack();
	malloc_trim(0);
	drop_image_pages();
	return poll(fds, n, timeout < 0 ? -1 : timeout - first);
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
	if (n >= 3 && strcmp(args[1], SHIM_COMMAND) == 0)
		close_strays();
	if (n == 4 && strcmp(args[1], SHIM_COMMAND) == 0 && strcmp(args[2], PROBE_ARG) == 0)
		_exit(shim_probe((uint32_t)strtoul(args[3], NULL, 10)));
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
	_exit(run_shim(len));
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

