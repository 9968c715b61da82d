//go:build linux && cgo

/*
 * A kept sandbox (keeper_linux.go tells the whole): its keeper
 * (run_keeper: runKeeper), which starts the sandbox's init and relays
 * command requests to it (relay), readies the next command's cgroup and
 * process ahead of its request (spares, cgroup v1), and starts the
 * commands' shims itself (keeper_start, start_shim, spawn_shim); and
 * the sandbox's init once its root is made (serve_commands:
 * serveCommands), which starts each command (start_command:
 * startCommand) and reports each one's end.
 */

#include "helper_linux.h"

/* A kept sandbox's keeper gives each command (cgroup v1) a group of its
 * own, below the sandbox's pids group: the group of the spare init holds
 * ready (spare_child), renamed after the command, or else a new one. */
struct spares {
	int v1;      /* cgroup v1: spares (v2's groups cannot be renamed; the shim makes them) */
	unsigned n;  /* the last spare's number */
	int have;    /* init has a spare in group spare-<n> */
	int sock;    /* the keeper's end of that spare's socket (-1: none) */
};

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
			logmsg("the spare is not in its cgroup %s (not placed yet, or ended idle): the command is forked", from);
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
int valid_exec_id(const char *id, size_t len) {
	if (len != EXEC_ID_LEN || memcmp(id, "ex-", 3) != 0)
		return 0;
	for (size_t i = 3; i < len; i++)
		if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
			return 0;
	return 1;
}

/* The command keeper_start started last (a shim it forks takes a copy). */
struct started_cmd started;

/* send_fds sends buf with the descriptors fds on the connected socket
 * sock. */
ssize_t send_fds(int sock, const void *buf, size_t n, const int *fds, int nfds) {
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

/* parse_control takes the descriptors a received message brought: at most
 * max into fds (any more are closed), and says in *root, when root is
 * not NULL, whether its sender's credentials (SO_PASSCRED) are uid 0.
 * It returns how many it took. */
int parse_control(struct msghdr *mh, int *fds, int max, int *root) {
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

static int start_shim(const char *id, int plan, int server);

/* keeper_start starts command id (the server's SPAWN_MAGIC request: its
 * plan on plan, the server's pipe on server). The keeper makes what the
 * command's shim would otherwise make (its output pipes, its ctl pair,
 * its cgroup: the spare's, renamed, in v1), sends init the request
 * itself, and only then starts the command's shim (start_shim: one
 * that supervised an earlier command and waits, or a fork): the command
 * starts while its shim is readied, and its request takes one hop
 * instead of a shim's set-up and two hops. */
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
		kill_command(p, s->cgdir, 0);
	}
	int ours[] = {outp[0], errp[0], ctl[0], s->fifo};
	for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++)
		if (ours[i] >= 0)
			close(ours[i]);
	s->on = 0;
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
 * <dir>/execs/<id>", run_command_shim), sparing the server a fork and an
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
	int rc = run_shim(0);
	for (int served = 1; served < SHIM_SERVES && rc == 0 && shim_idle(); served++)
		rc = run_shim(0);
	_exit(rc);
}

/* relay passes one request that came on ctl (a datagram with
 * descriptors) to init, if it is from root and well formed; a request
 * that names its command (REQUEST_ID) gets the command's group here. A
 * server's request to start a command's shim (SPAWN_MAGIC) is done here
 * (spawn_shim). */
static void relay(const struct plan *p, struct spares *sp, int ctl, int init) {
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
	int nfds = parse_control(&mh, fds, REQUEST_FDS + 1, &root);
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

/* run_keeper is a kept sandbox's supervisor (runKeeper in
 * keeper_linux.go): it starts the sandbox's init in the sandbox's
 * namespaces, says on SERVER_FD whether the sandbox could be made, then
 * relays command requests from FILE_CONTROL to init until init ends (a
 * kill, Destroy) or the plan's until, when it kills init, and with it
 * every process of the sandbox. */
int run_keeper(const struct plan *p, size_t cmdline_len) {
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
	pid_t pid = start_as_owner(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD | SIGCHLD,
				   p->host_id_base, &pidfd, err, sizeof err);
	if (pid == 0)
		run_init(p, syncp[0], req[1], devnull, devnull, tasks, ntasks, cmdline_len);
	int left = setns(own, CLONE_NEWNET);
	close(own);
	for (int i = 0; i < ntasks; i++)
		close(tasks[i]);
	close(syncp[0]);
	close(req[1]);
	close(devnull);
	if (pid < 0)
		return keeper_fail(&server, err);

	/* Release (as run_shim does), then init's first word: its root is
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
		if (lean_poll(fds, 2, timeout) < 0)
			continue;
		if (fds[1].revents)
			break;
		if (fds[0].revents) {
			relay(p, &sp, ctl, req[0]);
			spare_make(p, &sp, req[0]); /* the next command's */
		}
	}
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	unlink(FILE_CONTROL);
	return 0;
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
			run_exec(&cp, fds[1], fds[2], ctl, cg, 0, 0, NULL);
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

/* serve_commands is a kept sandbox's init once its root is made: it says
 * so on its requests' socket (descriptor 4), then starts each command
 * that comes there and reports each one's end on the command's own
 * socket, reaping every orphan of the sandbox meanwhile, until its
 * keeper goes (serveCommands in keeper_linux.go). */
void serve_commands(const struct plan *p) {
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
		if (lean_poll(fds, 2, -1) < 0)
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
		int nfds = parse_control(&mh, rfds, REQUEST_FDS + 1, NULL);
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
