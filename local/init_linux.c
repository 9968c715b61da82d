//go:build linux && cgo

/*
 * init, pid 1 of a sandbox (runInit in init_linux.go): it waits for the
 * shim's go-ahead, places itself in the sandbox's cgroups, takes the
 * plan's steps, starts the job and reaps every orphan until the job
 * ends, and reports how it ended to the shim. A kept sandbox's init then
 * serves its commands instead (serve_commands in keeper_linux.c).
 */

#include "helper_linux.h"

/* report_fd is where init reports (initStatus in state.go): descriptor
 * 4, a pipe to the shim; a kept sandbox's init reports on its requests'
 * socket once, then on each command's socket, and so does a command
 * that cannot start. */
int report_fd = 4;

/* send_status sends how a command ended (code, signal number, a reason)
 * on fd in one write: one message on a socket. */
void send_status(int fd, int code, int signo, const char *reason) {
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
void init_fail(int code, const char *fmt, ...) {
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
const char *job_path(const char *name, char *const *env, const char *dir, char *buf, size_t cap, const char **pathenv) {
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
const char *command_path(const struct plan *p, char *buf, size_t cap) {
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

/* run_ops takes the plan's steps from the first-th on, or reports the
 * first that fails. */
void run_ops(const struct plan *p, uint32_t first) {
	char msg[4200];
	if (take_ops(p, p->ops, first, p->nops, msg, sizeof msg) < 0)
		init_fail(CODE_SETUP_FAILED, "%s", msg);
}

/* run_init is init: sync_r brings the go-ahead, status_w takes the
 * report, out_w and err_w are the job's stdout and stderr; tasks are the
 * v1 groups' "tasks" files, opened by the shim (ntasks 0 when the shim
 * places init itself). */
void run_init(const struct plan *p, int sync_r, int status_w, int out_w, int err_w, const int *tasks, int ntasks,
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
		serve_commands(p);

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
