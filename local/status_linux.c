//go:build linux && cgo

/*
 * The status channel's bridge (statusBridge and statusCopier in
 * status_linux.go), for a sandbox's shim and a command's.
 */

#include "helper_linux.h"

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
void br_read(struct bridge *b, int drain) {
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
void br_open(struct bridge *br, const struct plan *p, const char *path, int fd) {
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
int br_due(struct bridge *br, int64_t *wait_ns, int *fd) {
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
void br_close(struct bridge *br) {
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
