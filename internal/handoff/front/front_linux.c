//go:build linux && cgo

/*
 * The hand-off's front end in C (see wire.go for the protocol): run
 * as the program is loaded, before the Go runtime starts, it hands
 * `delegate run` and `delegate exec` to the server serving the data dir
 * and exits with the command's status, so that such a command costs the
 * start of a small C program rather than of the Go one (~8 ms of CPU,
 * docs/BENCHMARKS.md). No server, a server that declines, or anything
 * unexpected before the request is sent: it returns, and the Go program
 * runs the command itself. It must stay in step with wire.go.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

/* The process's command line, NUL-separated, and its length. */
static char *hf_cmdline(size_t *len) {
	int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (buf == NULL)
			break;
		if (n == cap) {
			char *b = realloc(buf, cap * 2);
			if (b == NULL) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = b;
			cap *= 2;
		}
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	*len = n;
	return buf;
}

struct hf_buf {
	char *p;
	size_t len, cap;
	int bad;
};

static void hf_put(struct hf_buf *b, const void *data, size_t n) {
	if (b->bad)
		return;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->len + n)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (p == NULL) {
			b->bad = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, data, n);
	b->len += n;
}

static void hf_u32(struct hf_buf *b, uint32_t v) {
	unsigned char le[4] = {v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff, (v >> 24) & 0xff};
	hf_put(b, le, 4);
}

static void hf_str(struct hf_buf *b, const char *s) {
	size_t n = strlen(s);
	hf_u32(b, (uint32_t)n);
	hf_put(b, s, n);
}

static volatile sig_atomic_t hf_signals;

static void hf_on_signal(int sig) {
	(void)sig;
	hf_signals++;
}

static int hf_write_all(int fd, const char *p, size_t n) {
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static void hf_say(const char *msg, const char *dir) {
	char line[512];
	int n = snprintf(line, sizeof line, "delegate: %s%s\n", msg, dir);
	if (n > 0)
		hf_write_all(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* Whether argv (n words, the program's name first) is a command a server
 * may take: run or exec, after --data-dir flags at most (HandedOff, wire.go). */
static int hf_handed_off(char **argv, int n) {
	for (int i = 1; i < n; i++) {
		if (strcmp(argv[i], "run") == 0 || strcmp(argv[i], "exec") == 0)
			return 1;
		if (strcmp(argv[i], "--data-dir") == 0)
			i++;
		else if (strncmp(argv[i], "--data-dir=", 11) != 0)
			return 0;
	}
	return 0;
}

/* The data dir the command names (DataDir), into out; 0 when it is not
 * an absolute path. */
static int hf_data_dir(char **argv, int n, char *out, size_t size) {
	const char *dir = NULL;
	for (int i = 1; i < n; i++) {
		if (strcmp(argv[i], "--") == 0)
			break;
		if (strncmp(argv[i], "--data-dir=", 11) == 0)
			dir = argv[i] + 11;
		else if (strcmp(argv[i], "--data-dir") == 0 && i + 1 < n)
			dir = argv[++i];
	}
	const char *e;
	int w;
	if (dir != NULL && dir[0] != '\0')
		w = snprintf(out, size, "%s", dir);
	else if ((e = getenv("DELEGATE_DATA_DIR")) != NULL && e[0] != '\0')
		w = snprintf(out, size, "%s", e);
	else if ((e = getenv("XDG_STATE_HOME")) != NULL && e[0] != '\0')
		w = snprintf(out, size, "%s/delegate", e);
	else if ((e = getenv("HOME")) != NULL && e[0] != '\0')
		w = snprintf(out, size, "%s/.local/state/delegate", e);
	else
		return 0;
	return w > 0 && (size_t)w < size && out[0] == '/';
}

/* The hand-off, or a return when there is none to make. */
static void hf_try(char **argv, int n) {
	char dir[4096];
	if (!hf_handed_off(argv, n) || !hf_data_dir(argv, n, dir, sizeof dir))
		return;
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int w = snprintf(addr.sun_path, sizeof addr.sun_path, "%s/cli.sock", dir);
	if (w <= 0 || (size_t)w >= sizeof addr.sun_path)
		return;
	for (int fd = 0; fd < 3; fd++)
		if (fcntl(fd, F_GETFD) < 0)
			return; /* a closed standard descriptor: the Go side copes */
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return;
	if (connect(s, (struct sockaddr *)&addr, sizeof addr) < 0) {
		close(s);
		return;
	}
	/* The server must be of this process's uid: a data dir another uid
	 * can write to (DELEGATE_DATA_DIR=/tmp/...) must not get it this
	 * process's environment, its terminal and its exit status. */
	struct ucred cr;
	socklen_t crlen = sizeof cr;
	if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) < 0 || cr.uid != geteuid()) {
		close(s);
		return;
	}
	struct hf_buf body = {0};
	hf_u32(&body, (uint32_t)(n - 1));
	for (int i = 1; i < n; i++)
		hf_str(&body, argv[i]);
	uint32_t envc = 0;
	for (char **e = environ; *e != NULL; e++)
		envc++;
	hf_u32(&body, envc);
	for (char **e = environ; *e != NULL; e++)
		hf_str(&body, *e);
	char *cwd = getcwd(NULL, 0);
	hf_str(&body, cwd != NULL ? cwd : "");
	free(cwd);
	if (body.bad) {
		free(body.p);
		close(s);
		return;
	}
	struct hf_buf head = {0};
	hf_put(&head, "DLGH\x01", 5);
	hf_u32(&head, (uint32_t)body.len);
	if (head.bad) {
		free(body.p);
		close(s);
		return;
	}

	/* From here the server may run the command: a Ctrl-C is its. The
	 * signals are blocked but while waiting (ppoll), so none is lost. */
	struct sigaction sa = {.sa_handler = hf_on_signal}, oldint, oldterm;
	sigemptyset(&sa.sa_mask);
	sigset_t block, waitmask;
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, &waitmask);
	sigaction(SIGINT, &sa, &oldint);
	sigaction(SIGTERM, &sa, &oldterm);
	sigdelset(&waitmask, SIGINT);
	sigdelset(&waitmask, SIGTERM);

	int fds[3] = {0, 1, 2};
	char cbuf[CMSG_SPACE(sizeof fds)];
	memset(cbuf, 0, sizeof cbuf);
	struct iovec iov = {.iov_base = head.p, .iov_len = head.len};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof fds);
	memcpy(CMSG_DATA(cm), fds, sizeof fds);
	ssize_t sent;
	do
		sent = sendmsg(s, &msg, MSG_NOSIGNAL);
	while (sent < 0 && errno == EINTR);
	int ok = sent == (ssize_t)head.len && hf_write_all(s, body.p, body.len) == 0;
	free(head.p);
	free(body.p);

	unsigned char ans[5];
	size_t got = 0;
	int interrupted = 0;
	while (ok) {
		struct pollfd p = {.fd = s, .events = POLLIN};
		int r = ppoll(&p, 1, NULL, &waitmask);
		if (r < 0 && errno != EINTR)
			break;
		while (hf_signals > 0) {
			hf_signals--;
			interrupted = 1;
			send(s, "I", 1, MSG_NOSIGNAL);
		}
		if (r <= 0)
			continue;
		ssize_t m = read(s, ans + got, got == 0 ? 1 : sizeof ans - got);
		if (m < 0 && errno == EINTR)
			continue;
		if (m <= 0)
			break;
		got += (size_t)m;
		if (ans[0] == 'X' && got == sizeof ans)
			_exit((int)(int32_t)((uint32_t)ans[1] | (uint32_t)ans[2] << 8 | (uint32_t)ans[3] << 16 | (uint32_t)ans[4] << 24));
		if (ans[0] == 'D') {
			close(s);
			if (interrupted)
				_exit(130);
			sigaction(SIGINT, &oldint, NULL);
			sigaction(SIGTERM, &oldterm, NULL);
			sigprocmask(SIG_UNBLOCK, &block, NULL);
			return; /* declined: the Go program runs it */
		}
		if (ans[0] != 'X')
			break;
	}
	if (!ok) {
		/* The request did not go whole: the server has run nothing. */
		close(s);
		sigaction(SIGINT, &oldint, NULL);
		sigaction(SIGTERM, &oldterm, NULL);
		sigprocmask(SIG_UNBLOCK, &block, NULL);
		return;
	}
	hf_say("the server ended before the command did; its data dir: ", dir);
	_exit(125);
}

__attribute__((constructor)) static void delegate_handoff(void) {
	const char *no = getenv("DELEGATE_NO_HANDOFF");
	if (no != NULL && strcmp(no, "1") == 0)
		return;
	size_t len = 0;
	char *cmd = hf_cmdline(&len);
	if (cmd == NULL)
		return;
	int n = 0;
	for (size_t i = 0; i < len; i += strlen(cmd + i) + 1)
		n++;
	char **argv = malloc(sizeof(char *) * (size_t)(n + 1));
	if (argv != NULL) {
		int k = 0;
		for (size_t i = 0; i < len && k < n; i += strlen(cmd + i) + 1)
			argv[k++] = cmd + i;
		argv[k] = NULL;
		hf_try(argv, k);
		free(argv);
	}
	free(cmd);
}
