//go:build linux && cgo

/*
 * The shim of a sandbox (runShim and supervise in shim_linux.go): it
 * reads the plan and becomes a keeper or a command's shim if the plan
 * says so; otherwise it starts init in fresh namespaces, places it in
 * the sandbox's cgroups, lets it go, keeps the output (output_writer:
 * outputWriter) and the status lines, enforces the deadline, and
 * records how the command ended in exit.json. And the probe a server
 * runs at start (shim_probe: shimProbe).
 */

#include "helper_linux.h"

/* At most this many stream records (maxStreamRecords in streams.go): the
 * last one says the rest of the output is combined, so that a job that
 * switches stream at every byte cannot make its 8-byte records outgrow
 * its output. */
static int64_t max_stream_records(int64_t limit) {
	return limit / 64 > 256 ? limit / 64 : 256;
}

void out_write(struct output_writer *w, int stream, const char *p, size_t len) {
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

int outs_init(struct outs *o, int out, int err) {
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
int outs_read(struct outs *o, struct output_writer *w, char *buf, size_t cap) {
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

int outs_open(const struct outs *o) { return o->fd[0] >= 0 || o->fd[1] >= 0; }

void out_printf(struct output_writer *w, const char *fmt, ...) {
	char buf[4200];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof buf - 1)
		n = (int)sizeof buf - 1;
	out_write(w, STREAM_STDERR, buf, (size_t)n); /* the sandbox's own words */
}

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
int write_exit(const struct rec *r, int *tell) {
	char reason[8400], buf[9000];
	json_str(reason, sizeof reason, r->reason);
	int n = snprintf(buf, sizeof buf,
			 "{\"code\":%d,\"signo\":%d,\"oomKilled\":%s,\"outputBytes\":%lld,\"truncated\":%s,\"killed\":%s,\"deadlineExceeded\":%s,\"endedAt\":%lld,\"reason\":\"%s\"}",
			 r->code, r->signo, r->oom ? "true" : "false", (long long)r->output_bytes, r->truncated ? "true" : "false",
			 r->killed ? "true" : "false", r->deadline ? "true" : "false", (long long)r->ended_ns, reason);
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

/* finish_failed records a sandbox that could not start its command. */
int finish_failed(struct output_writer *w, const char *msg) {
	struct rec r;
	memset(&r, 0, sizeof r);
	out_printf(w, "%s%s\n", SETUP_PREFIX, msg);
	logmsg("sandbox setup failed: %s", msg);
	r.code = CODE_SETUP_FAILED;
	r.ended_ns = now_ns();
	snprintf(r.reason, sizeof r.reason, "%s", msg);
	r.output_bytes = w->n;
	r.truncated = w->n > w->limit;
	if (write_exit(&r, NULL) < 0) {
		logmsg("cannot record the exit status: %s", errtext(errno));
		return 1;
	}
	return 0;
}

/* shim_record records how the command ended: from init's report
 * (sdata), else from init's wait status (ws, when have_ws). */
int shim_record(const struct plan *p, struct output_writer *w, const char *sdata, size_t slen, int have_ws, int ws, const char *relerr,
		       int deadline_hit, long ooms_before, int *tell) {
	struct rec r;
	memset(&r, 0, sizeof r);
	r.ended_ns = now_ns(); /* init has reported or exited: the command has ended */
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

/* run_shim supervises one sandboxed command (runShim/supervise in
 * shim_linux.go): it starts init in fresh namespaces, places it in the
 * sandbox's cgroups, lets it go, keeps the output and the status lines,
 * enforces the deadline, and records how the command ended in exit.json.
 * It returns the shim's exit status. */
int run_shim(size_t cmdline_len) {
	signal(SIGPIPE, SIG_IGN); /* a dead init must not take the shim along */
	struct output_writer w = {-1, -1, DEFAULT_OUTPUT_LIMIT, 0, 0, 0};
	size_t len = 0;
	char *data = read_all(PLAN_FD, MAX_PLAN_BYTES, &len);
	int rerr = errno;
	struct plan p;
	char err[4096] = "";
	if (data == NULL)
		snprintf(err, sizeof err, "read the plan: %s", errtext(rerr));
	else if (len == 0)
		snprintf(err, sizeof err, "no plan: the server went away before it sent one");
	else if (unmarshal_plan(data, len, &p, err, sizeof err) == 0 && p.output_limit > 0)
		w.limit = p.output_limit;
	if (err[0])
		return finish_failed(&w, err);
	if (p.mode == MODE_COMMAND) {
		int rc = run_command_shim(&p, &w); /* hands the plan (PLAN_FD) on */
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
		return run_keeper(&p, cmdline_len);
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
	/* cgroup v1: init places itself (run_init), through the groups'
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
	pid_t pid = start_as_owner(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | newnet | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_PIDFD | SIGCHLD,
				   p.host_id_base, &pidfd, err, sizeof err);
	if (pid == 0)
		run_init(&p, syncp[0], statusp[1], outp[1], errp[1], tasks, ntasks, cmdline_len);
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

/* shim_probe starts an init that only checks it is pid 1 and uid 0, in
 * a user namespace owned by host uid base as a sandbox's is (shimProbe in
 * shim_linux.go). */
int shim_probe(uint32_t base) {
	int sync[2];
	char err[512];
	if (base == 0 || pipe2(sync, O_CLOEXEC) < 0)
		return 1;
	pid_t pid = start_as_owner(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD, base, NULL,
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
