//go:build linux && cgo

/*
 * The plan (plan.go): its wire format read (unmarshalPlan) and the steps
 * it lists taken (runOps and runOp in plan_linux.go; the steps
 * themselves in mounts_linux.go, netlo_linux.go, init_linux.go and
 * seccomp_linux_*.go): init takes them for a sandbox, a kept sandbox's
 * command for itself.
 */

#include "helper_linux.h"

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

int unmarshal_plan(const char *data, size_t len, struct plan *p, char *err, size_t errcap) {
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
	p->spare_idle_ms = rd_u32(&r);
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

/* plan_free frees what unmarshal_plan allocated (a kept sandbox's init
 * parses a plan for every command). */
void plan_free(struct plan *p) {
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

/* read_plan_fd reads a plan from a memfd the server wrote, whatever its
 * offset. */
char *read_plan_fd(int fd, size_t *len) {
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
char *command_plan(int fd, struct plan *cp, char *msg, size_t msgcap) {
	size_t len = 0;
	char *data = read_plan_fd(fd, &len);
	memset(cp, 0, sizeof *cp);
	msg[0] = 0;
	if (data == NULL)
		snprintf(msg, msgcap, "read the plan: %s", errtext(errno));
	else if (unmarshal_plan(data, len, cp, msg, msgcap) < 0)
		; /* msg says why */
	else if (cp->mode != MODE_COMMAND)
		snprintf(msg, msgcap, "not the plan of a command");
	return data;
}

/* same_ops says whether steps a (na of them) are steps b (nb). */
int same_ops(const struct op *a, uint32_t na, const struct op *b, uint32_t nb) {
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
int kept_fd[KEPT_SLOTS] = {-1, -1};

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

/* take_ops takes steps ops[first:n], and returns 0, or -1 with why the
 * first that failed did in msg. */
int take_ops(const struct plan *p, const struct op *ops, uint32_t first, uint32_t n, char *msg, size_t cap) {
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
