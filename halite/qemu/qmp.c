// SPDX-License-Identifier: MIT
/*
 * QMP client (see qmp.h). QEMU sends one JSON object per line; a read may
 * hold several or part of one, so input is buffered and split at newlines.
 * Requests carry an "id" and the reply with that id is the answer; events
 * are queued; replies with other ids (from a call that timed out) are
 * dropped, so a connection stays usable after a timeout: only a closed or
 * broken one needs hq_qmp_reconnect(). A wait polls the caller's abort
 * function every HQ_QMP_POLL_MS, so a wait on a QEMU that will never answer
 * (its main loop blocked on memory that will not come) ends as soon as the
 * caller knows it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "qmp.h"

/* A reply line may be long (info mtree), but not without bound. */
#define QMP_MAX_LINE (64u << 20)
#define QMP_MAX_EVENTS 1024

struct hq_qmp {
	int fd;
	bool broken; /* see hq_qmp_usable() */
	char path[108];
	hq_qmp_abort_fn abort_fn;
	void *abort_ctx;
	bool aborted; /* the last call or wait ended by abort_fn */
	pid_t peer;
	int major, minor, micro;
	char *buf;
	size_t len, cap;
	uint64_t next_id;
	cJSON *events; /* array, oldest first */
	cJSON *commands; /* query-commands, once asked */
	char err[512];
	char qemu_err[512]; /* QEMU's own words when the last call got an error reply */
};

static void qerr(struct hq_qmp *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void qerr(struct hq_qmp *q, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(q->err, sizeof(q->err), fmt, ap);
	va_end(ap);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int left_ms(int64_t deadline)
{
	int64_t l;

	if (deadline < 0)
		return -1;
	l = deadline - now_ms();
	return l < 0 ? 0 : l > INT32_MAX ? INT32_MAX : (int)l;
}

/* The caller's abort function's verdict; 0: go on waiting. */
static int aborted(struct hq_qmp *q)
{
	int r = q->abort_fn ? q->abort_fn(q->abort_ctx) : 0;

	if (r) {
		qerr(q, "QMP: the wait for QEMU was given up");
		q->aborted = true;
	}
	return r;
}

/*
 * One line as parsed JSON; waits until @deadline (< 0: forever), polling
 * the abort function every HQ_QMP_POLL_MS meanwhile.
 */
static int read_msg(struct hq_qmp *q, cJSON **out, int64_t deadline)
{
	for (;;) {
		char *nl = q->len ? memchr(q->buf, '\n', q->len) : NULL;
		struct pollfd p = { q->fd, POLLIN, 0 };
		ssize_t n;
		int r, wait;

		if (nl) {
			size_t l = (size_t)(nl - q->buf);
			cJSON *j;

			*nl = '\0';
			j = cJSON_ParseWithLength(q->buf, l);
			memmove(q->buf, nl + 1, q->len - l - 1);
			q->len -= l + 1;
			if (!j) {
				qerr(q, "QMP: a message that is not JSON");
				return -EPROTO;
			}
			*out = j;
			return 0;
		}
		if (q->len == q->cap) {
			size_t cap = q->cap ? 2 * q->cap : 65536;
			char *b;

			if (cap > QMP_MAX_LINE) {
				qerr(q, "QMP: a message longer than %u bytes", QMP_MAX_LINE);
				q->broken = true; /* its rest would be read as new lines */
				return -EPROTO;
			}
			b = realloc(q->buf, cap);
			if (!b)
				return -ENOMEM;
			q->buf = b;
			q->cap = cap;
		}
		wait = left_ms(deadline);
		if (q->abort_fn && (wait < 0 || wait > HQ_QMP_POLL_MS))
			wait = HQ_QMP_POLL_MS;
		r = poll(&p, 1, wait);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			qerr(q, "QMP: poll: %s", strerror(errno));
			return -errno;
		}
		if (r == 0) {
			r = aborted(q);
			if (r)
				return r;
			if (deadline < 0 || now_ms() < deadline)
				continue;
			qerr(q, "QMP: no answer in time");
			return -ETIMEDOUT;
		}
		n = read(q->fd, q->buf + q->len, q->cap - q->len);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0) {
			qerr(q, "QMP: QEMU closed the connection%s%s", n < 0 ? ": " : "",
			     n < 0 ? strerror(errno) : "");
			q->broken = true;
			return -ECONNRESET;
		}
		q->len += (size_t)n;
	}
}

static int send_all(struct hq_qmp *q, const char *s)
{
	size_t len = strlen(s), off = 0;

	while (off < len) {
		ssize_t n = send(q->fd, s + off, len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			qerr(q, "QMP: send: %s", strerror(errno));
			/* Part of a request may have gone: the stream is no longer ours to trust. */
			q->broken = true;
			return errno == EPIPE ? -ECONNRESET : -errno;
		}
		off += (size_t)n;
	}
	return 0;
}

static void queue_event(struct hq_qmp *q, cJSON *msg)
{
	if (cJSON_GetArraySize(q->events) >= QMP_MAX_EVENTS)
		cJSON_DeleteItemFromArray(q->events, 0);
	cJSON_AddItemToArray(q->events, msg);
}

/* Send @cmd with a new id; @args is taken over. 0 or -errno. */
static int send_cmd(struct hq_qmp *q, const char *cmd, cJSON *args, uint64_t *idp)
{
	cJSON *req = cJSON_CreateObject();
	uint64_t id = ++q->next_id;
	char *text;
	int r;

	q->err[0] = '\0';
	q->qemu_err[0] = '\0';
	q->aborted = false;
	cJSON_AddStringToObject(req, "execute", cmd);
	if (args)
		cJSON_AddItemToObject(req, "arguments", args);
	cJSON_AddNumberToObject(req, "id", (double)id);
	if (q->broken) {
		cJSON_Delete(req);
		qerr(q, "%s: QMP: the connection to QEMU was lost before", cmd);
		return -ECONNRESET;
	}
	r = aborted(q);
	if (r) {
		cJSON_Delete(req);
		return r;
	}
	text = cJSON_PrintUnformatted(req);
	cJSON_Delete(req);
	if (!text)
		return -ENOMEM;
	r = send_all(q, text);
	if (!r)
		r = send_all(q, "\n");
	free(text);
	*idp = id;
	return r;
}

int hq_qmp_send(struct hq_qmp *q, const char *cmd)
{
	uint64_t id;

	return send_cmd(q, cmd, NULL, &id);
}

int hq_qmp_call(struct hq_qmp *q, const char *cmd, cJSON *args, cJSON **ret, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	cJSON *id_item;
	uint64_t id = 0;
	int r;

	r = send_cmd(q, cmd, args, &id);
	if (r)
		return r;
	for (;;) {
		cJSON *msg = NULL, *e;

		r = read_msg(q, &msg, deadline);
		if (r) {
			if (r == -ETIMEDOUT)
				qerr(q, "%s: no answer from QEMU within %d ms", cmd, timeout_ms);
			return r;
		}
		if (cJSON_GetObjectItem(msg, "event")) {
			queue_event(q, msg);
			continue;
		}
		id_item = cJSON_GetObjectItem(msg, "id");
		if (!cJSON_IsNumber(id_item) || (uint64_t)id_item->valuedouble != id) {
			cJSON_Delete(msg); /* a late reply to an earlier call */
			continue;
		}
		e = cJSON_GetObjectItem(msg, "error");
		if (e) {
			const char *cls = cJSON_GetStringValue(cJSON_GetObjectItem(e, "class"));
			const char *desc = cJSON_GetStringValue(cJSON_GetObjectItem(e, "desc"));

			qerr(q, "%s: %s: %s", cmd, cls ? cls : "Error", desc ? desc : "?");
			snprintf(q->qemu_err, sizeof(q->qemu_err), "%s", desc ? desc : "?");
			cJSON_Delete(msg);
			return -EIO;
		}
		if (!cJSON_GetObjectItem(msg, "return")) {
			qerr(q, "%s: a reply without return", cmd);
			cJSON_Delete(msg);
			return -EPROTO;
		}
		if (ret)
			*ret = cJSON_DetachItemFromObject(msg, "return");
		cJSON_Delete(msg);
		return 0;
	}
}

int hq_qmp_hmp(struct hq_qmp *q, const char *cmdline, char **out, int timeout_ms)
{
	cJSON *args = cJSON_CreateObject(), *ret = NULL;
	const char *s;
	int r;

	cJSON_AddStringToObject(args, "command-line", cmdline);
	r = hq_qmp_call(q, "human-monitor-command", args, &ret, timeout_ms);
	if (r)
		return r;
	s = cJSON_GetStringValue(ret);
	if (!s) {
		cJSON_Delete(ret);
		qerr(q, "human-monitor-command %s: not text", cmdline);
		return -EPROTO;
	}
	*out = strdup(s);
	cJSON_Delete(ret);
	return *out ? 0 : -ENOMEM;
}

int hq_qmp_wait_event(struct hq_qmp *q, const char *name, cJSON **data, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;

	q->aborted = false;
	for (;;) {
		cJSON *msg = NULL;
		int n = cJSON_GetArraySize(q->events), r;

		for (int i = 0; i < n; i++) {
			cJSON *e = cJSON_GetArrayItem(q->events, i);
			const char *ev = cJSON_GetStringValue(cJSON_GetObjectItem(e, "event"));

			if (ev && !strcmp(ev, name)) {
				e = cJSON_DetachItemFromArray(q->events, i);
				if (data)
					*data = cJSON_DetachItemFromObject(e, "data");
				cJSON_Delete(e);
				return 0;
			}
		}
		r = read_msg(q, &msg, deadline);
		if (r) {
			if (r == -ETIMEDOUT)
				qerr(q, "no %s event within %d ms", name, timeout_ms);
			return r;
		}
		if (cJSON_GetObjectItem(msg, "event"))
			queue_event(q, msg);
		else
			cJSON_Delete(msg);
	}
}

bool hq_qmp_has_command(struct hq_qmp *q, const char *cmd)
{
	cJSON *c;

	if (!q->commands && hq_qmp_call(q, "query-commands", NULL, &q->commands, 10000))
		return false;
	cJSON_ArrayForEach(c, q->commands) {
		const char *n = cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));

		if (n && !strcmp(n, cmd))
			return true;
	}
	return false;
}

static int try_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		int e = -errno;

		close(fd);
		return e;
	}
	return fd;
}

pid_t hq_qmp_listener_pid(const char *path)
{
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	int fd = try_connect(path), r;

	if (fd < 0)
		return fd;
	r = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) ? -errno : cred.pid;
	close(fd);
	return r;
}

/*
 * Connect @q to q->path: retry until @retry_ms while the socket does not
 * exist or refuses, then read the greeting and negotiate, each within
 * @greet_ms. 0, or -errno with the reason in @err.
 */
static int open_conn(struct hq_qmp *q, int retry_ms, int greet_ms, char *err, size_t errlen)
{
	int64_t deadline = now_ms() + (retry_ms < 0 ? 0 : retry_ms);
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	cJSON *greet = NULL, *v;
	int fd, r;

	for (;;) {
		fd = try_connect(q->path);
		if (fd >= 0 || (fd != -ENOENT && fd != -ECONNREFUSED) || now_ms() >= deadline)
			break;
		usleep(10000);
	}
	if (fd < 0) {
		snprintf(err, errlen, "QMP socket %s: %s%s", q->path, strerror(-fd),
			 fd == -ENOENT || fd == -ECONNREFUSED ? " (is QEMU running with -qmp "
			 "unix:SOCKET,server=on,wait=off?)" : "");
		return fd == -ENOENT || fd == -ECONNREFUSED ? (retry_ms > 0 ? -ETIMEDOUT : fd) :
			fd;
	}
	q->fd = fd;
	q->broken = false;
	q->len = 0;
	if (!getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl))
		q->peer = cred.pid;
	r = read_msg(q, &greet, now_ms() + greet_ms);
	v = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(greet, "QMP"), "version"),
				"qemu");
	if (r || !v) {
		if (r == -ETIMEDOUT)
			snprintf(err, errlen, "QMP socket %s: no greeting within %g s (QEMU serves "
				 "one client per QMP socket: is another one connected?)", q->path,
				 greet_ms / 1000.0);
		else
			snprintf(err, errlen, "QMP socket %s: %s", q->path,
				 r ? q->err : "no QMP greeting (not a QMP monitor?)");
		cJSON_Delete(greet);
		q->broken = true;
		return r ? r : -EPROTO;
	}
	q->major = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "major"));
	q->minor = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "minor"));
	q->micro = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "micro"));
	cJSON_Delete(greet);
	r = hq_qmp_call(q, "qmp_capabilities", NULL, NULL, greet_ms);
	if (r) {
		snprintf(err, errlen, "QMP socket %s: %s", q->path, q->err);
		q->broken = true;
		return r;
	}
	return 0;
}

int hq_qmp_connect(struct hq_qmp **qp, const char *path, int timeout_ms, char *err,
		   size_t errlen)
{
	struct hq_qmp *q;
	int r;

	if (strlen(path) >= sizeof(q->path)) {
		snprintf(err, errlen, "QMP socket %s: %s", path, strerror(ENAMETOOLONG));
		return -ENAMETOOLONG;
	}
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->fd = -1;
	memcpy(q->path, path, strlen(path) + 1);
	q->events = cJSON_CreateArray();
	r = open_conn(q, timeout_ms, 10000, err, errlen);
	if (r) {
		hq_qmp_close(q);
		return r;
	}
	*qp = q;
	return 0;
}

int hq_qmp_reconnect(struct hq_qmp *q, int timeout_ms)
{
	char err[sizeof(q->err)];
	int r;

	if (q->fd >= 0)
		close(q->fd);
	q->fd = -1;
	q->broken = true;
	/* One attempt: the caller decides whether a refusal is worth another. */
	r = open_conn(q, 0, timeout_ms < 0 ? 10000 : timeout_ms, err, sizeof(err));
	if (r)
		memcpy(q->err, err, sizeof(err));
	return r;
}

bool hq_qmp_aborted(const struct hq_qmp *q)
{
	return q && q->aborted;
}

bool hq_qmp_usable(const struct hq_qmp *q)
{
	return q && !q->broken && q->fd >= 0;
}

void hq_qmp_set_abort(struct hq_qmp *q, hq_qmp_abort_fn fn, void *ctx)
{
	q->abort_fn = fn;
	q->abort_ctx = ctx;
}

pid_t hq_qmp_peer_pid(const struct hq_qmp *q)
{
	return q->peer;
}

void hq_qmp_version(const struct hq_qmp *q, int *major, int *minor, int *micro)
{
	*major = q->major;
	*minor = q->minor;
	*micro = q->micro;
}

const char *hq_qmp_qemu_error(const struct hq_qmp *q)
{
	return q ? q->qemu_err : "";
}

const char *hq_qmp_errmsg(const struct hq_qmp *q)
{
	return q ? q->err : "";
}

void hq_qmp_close(struct hq_qmp *q)
{
	if (!q)
		return;
	if (q->fd >= 0)
		close(q->fd);
	free(q->buf);
	cJSON_Delete(q->events);
	cJSON_Delete(q->commands);
	free(q);
}
