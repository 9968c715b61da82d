//go:build linux && cgo

/*
 * The sandbox's user namespace, owned by its slot's host uid
 * (owner_linux.go), and its id maps.
 */

#include "helper_linux.h"

int write_id_maps(pid_t pid, const struct plan *p) {
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

/* start_as_owner clones init into flags' namespaces, its user namespace
 * owned by host uid owner (startAsOwner in owner_linux.go). In the child
 * it returns 0, as fork does. */
pid_t start_as_owner(unsigned long flags, uint32_t owner, int *pidfd, char *err, size_t errcap) {
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
