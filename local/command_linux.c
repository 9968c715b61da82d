//go:build linux && cgo

/*
 * A command of a kept sandbox (command_linux.go): its shim
 * (run_command_shim: runCommandShim), which asks the sandbox's init for
 * it (send_request: sendRequest, or finds it asked by its keeper),
 * keeps its output and status lines, enforces its deadline
 * (kill_command: killCommand) and records its end, then waits for the
 * sandbox's next command (shim_idle); and the command's own process in
 * the sandbox between init's fork and the job (run_exec: runExec, and a
 * spare forked ahead of its request, spare_child).
 */

#include "helper_linux.h"

/* place_shim_fds gives a command's shim its descriptors at fixed places:
 * PLAN_FD, SERVER_FD, then what keeper_start made (started) from 6 on,
 * and records the shim's pid in its directory, the working directory.
 * Nothing else stays open. */
int place_shim_fds(const char *id, int plan, int server) {
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

/* shim_idle readies a command's shim whose command is recorded, and its
 * output closed, for the sandbox's next command: it closes all it had,
 * tells its keeper (IDLE_MAGIC) and waits for a command (start_shim),
 * which it takes as a shim the keeper forked does (spawn_shim). It
 * returns 0 if none comes: the keeper has enough idle shims, or has
 * ended, or none came for SHIM_IDLE_MS. */
int shim_idle(void) {
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
	give_back_stack(); /* its command's buffers, at once */
	struct pollfd q = {pair[1], POLLIN, 0};
	if (k < 0 || lean_poll(&q, 1, SHIM_IDLE_MS) <= 0) {
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
	int fds[8], nfds = k > 0 ? parse_control(&mh, fds, 8, NULL) : 0;
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

/* send_request asks the sandbox's init for a command whose shim the
 * server started (run_command_shim; one the keeper started has all this
 * made by keeper_start): the command's output pipes and ctl pair (the
 * read ends and the shim's end stay in outp[0], errp[0], ctl[0]), its
 * cgroup (cgdir, "" for none), its status channel (br), and a request
 * sent to the keeper's socket. It returns the sandbox's OOM kills so
 * far; err says what failed. */
static long send_request(const struct plan *p, char *err, size_t errcap, char *cgdir, size_t cgcap, int *outp, int *errp, int *ctl,
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

/* run_command_shim supervises one command of a kept sandbox (runCommandShim
 * in keeper_linux.go): it asks the sandbox's init for the command, lets
 * it go once it is in its cgroup (unless Kill came first), keeps its
 * output and status lines, enforces its deadline (its own processes
 * only), records its end as soon as init reports it (and closes
 * SERVER_FD: the server's Wait wakes up), and stays while what the
 * command left in the background holds its output open. */
int run_command_shim(const struct plan *p, struct output_writer *w) {
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
		ooms_before = send_request(p, err, sizeof err, cgdir, sizeof cgdir, outp, errp, ctl, &br);
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
				kill_command(p, cgdir, jobpid);
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

/* kill_command kills one command of a kept sandbox: its process group
 * (of jobpid, 0: none) and every process of its cgroup (cgdir, "" for
 * none) until none is left, or two seconds (killCommand in Go). */
void kill_command(const struct plan *p, const char *cgdir, pid_t jobpid) {
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

/* run_exec is a kept sandbox's command between init's fork and the
 * job (runExec in keeper_linux.go): in a session of its own, it places
 * itself in its cgroup (cg, -1 for none), says so on ctl, waits for its
 * shim's go-ahead (not when ahead: a spare, placed before its request,
 * whose kill the keeper checked), takes its plan's steps (a mount
 * namespace and a /run of its own, its inputs, the bounding set, the
 * seccomp filter; a spare took the first taken of them before its
 * request came, and failed, if failed is set), drops to the job's user
 * and executes the job. What fails is written to the job's stderr and
 * reported on ctl. */
void run_exec(const struct plan *p, int out, int err, int ctl, int cg, int ahead, uint32_t taken, const char *failed) {
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

/* command_failed tells a command's shim why its command did not start:
 * on its stderr and on its ctl. */
void command_failed(int errw, int ctl, const char *msg) {
	char line[4300];
	int k = snprintf(line, sizeof line, "%s%s\n", SETUP_PREFIX, msg);
	write_all(errw, line, (size_t)(k < (int)sizeof line ? k : (int)sizeof line - 1));
	send_status(ctl, CODE_SETUP_FAILED, 0, msg);
}

/* spare_child is the next command of a kept sandbox (cgroup v1), forked
 * by init ahead of its request: it places itself in the group its keeper
 * made for it (cg: its "tasks" file: a thread that moves itself skips
 * the global lock, whose RCU grace period would hold the cgroup mutex,
 * and with it the keeper's renames, for milliseconds), and takes the
 * steps every command begins with (p's spare_ops), off the command's
 * way; then it waits on sock, whose other end the keeper holds, for the
 * request's descriptors (plan, stdout, stderr, ctl) and becomes the
 * command (run_exec, which is then in its group already, and
 * skips those steps of its plan). */
void spare_child(const struct plan *p, int sock, int cg) {
	if (dup3(sock, 3, O_CLOEXEC) < 0 || dup3(cg, 4, O_CLOEXEC) < 0)
		_exit(CODE_SETUP_FAILED);
	syscall(SYS_close_range, 5, ~0U, 0);
	if (write_all(4, "0", 1) < 0)
		_exit(CODE_SETUP_FAILED); /* init sees it end, and forks the command itself */
	close(4);
	/* The steps of every command (commandAheadOps in Go), taken while
	 * it waits; what fails is its command's setup failure. What they
	 * keep open for the command's steps moves out of the way of the
	 * descriptors run_exec places. */
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
	/* It waits p->spare_idle_ms for its request, then ends: a kept
	 * sandbox without commands holds no spare (its keeper's next
	 * command is then forked by init as it comes: keeper_ask finds the
	 * spare gone). Its socket is shut for reading first, so that a
	 * request is either sent before (and read here, taken) or refused
	 * to the keeper (EPIPE), never lost with the spare. */
	int recv_flags = MSG_CMSG_CLOEXEC;
	{
		struct pollfd w = {3, POLLIN, 0};
		int r;
		do
			r = lean_poll(&w, 1, p->spare_idle_ms > 0 ? (int)p->spare_idle_ms : -1);
		while (r < 0 && errno == EINTR);
		if (r == 0) {
			shutdown(3, SHUT_RD);
			recv_flags |= MSG_DONTWAIT;
		}
	}
	ssize_t n;
	do
		n = recvmsg(3, &mh, recv_flags);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		_exit(0); /* init is gone, or took another way, or none came */
	int nfds = parse_control(&mh, rfds, REQUEST_FDS, NULL);
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
	run_exec(&cp, rfds[1], rfds[2], rfds[3], -1, 1, cp.ahead, failed);
}
