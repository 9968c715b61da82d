//go:build linux && cgo

/*
 * What the shims and the keeper do to a sandbox's cgroups (cgroupSet's
 * methods in cgroup_linux.go).
 */

#include "helper_linux.h"

const char *cg_dirs(const struct plan *p, int i) {
	const char *d[3] = {p->cg_memory, p->cg_cpu, p->cg_pids};
	/* Each distinct directory once (in cgroup v2 they are one). */
	for (int j = 0; j < i; j++)
		if (strcmp(d[j], d[i]) == 0)
			return NULL;
	return d[i][0] ? d[i] : NULL;
}

int cg_write(const char *dir, const char *file, const char *value, char *err, size_t errcap) {
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
void cg_kill(const struct plan *p) {
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
long cg_oom_kills(const struct plan *p) {
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

/* open_v1_tasks opens the "tasks" files of a cgroup v1 set, through
 * which init places itself (run_init); v2: none, the shim places it. */
int open_v1_tasks(const struct plan *p, int *tasks, int *ntasks, char *err, size_t errcap) {
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
void cg_thaw(const struct plan *p) {
	char err[512];
	if (p->cg_freezer[0])
		cg_write(p->cg_freezer, p->cg_version == 2 ? "cgroup.freeze" : "freezer.state", p->cg_version == 2 ? "0" : "THAWED", err,
			 sizeof err);
}

int cg_frozen(const struct plan *p) {
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
void cg_refreeze(const struct plan *p) {
	char err[512];
	if (p->cg_freezer[0])
		cg_write(p->cg_freezer, p->cg_version == 2 ? "cgroup.freeze" : "freezer.state", p->cg_version == 2 ? "1" : "FROZEN", err,
			 sizeof err);
}

/* group_has_procs says whether the cgroup dir holds a process. */
int group_has_procs(const char *dir) {
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
