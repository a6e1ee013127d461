// SPDX-License-Identifier: MIT
/*
 * QMP client (see qmp.h). QEMU sends one JSON object per line; a read may
 * hold several or part of one, so input is buffered and split at newlines.
 * Requests carry an "id" and the reply with that id is the answer; events
 * are queued; replies with other ids (from a call that timed out) are
 * dropped.
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
	pid_t peer;
	int major, minor, micro;
	char *buf;
	size_t len, cap;
	uint64_t next_id;
	cJSON *events; /* array, oldest first */
	cJSON *commands; /* query-commands, once asked */
	char err[512];
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

/* One line as parsed JSON; waits until @deadline (< 0: forever). */
static int read_msg(struct hq_qmp *q, cJSON **out, int64_t deadline)
{
	for (;;) {
		char *nl = q->len ? memchr(q->buf, '\n', q->len) : NULL;
		struct pollfd p = { q->fd, POLLIN, 0 };
		ssize_t n;
		int r;

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
				return -EPROTO;
			}
			b = realloc(q->buf, cap);
			if (!b)
				return -ENOMEM;
			q->buf = b;
			q->cap = cap;
		}
		r = poll(&p, 1, left_ms(deadline));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			qerr(q, "QMP: poll: %s", strerror(errno));
			return -errno;
		}
		if (r == 0) {
			qerr(q, "QMP: no answer in time");
			return -ETIMEDOUT;
		}
		n = read(q->fd, q->buf + q->len, q->cap - q->len);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0) {
			qerr(q, "QMP: QEMU closed the connection%s%s", n < 0 ? ": " : "",
			     n < 0 ? strerror(errno) : "");
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

int hq_qmp_call(struct hq_qmp *q, const char *cmd, cJSON *args, cJSON **ret, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	cJSON *req = cJSON_CreateObject(), *id_item;
	uint64_t id = ++q->next_id;
	char *text;
	int r;

	q->err[0] = '\0';
	cJSON_AddStringToObject(req, "execute", cmd);
	if (args)
		cJSON_AddItemToObject(req, "arguments", args);
	cJSON_AddNumberToObject(req, "id", (double)id);
	text = cJSON_PrintUnformatted(req);
	cJSON_Delete(req);
	if (!text)
		return -ENOMEM;
	r = send_all(q, text);
	if (!r)
		r = send_all(q, "\n");
	free(text);
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

int hq_qmp_connect(struct hq_qmp **qp, const char *path, int timeout_ms, char *err,
		   size_t errlen)
{
	int64_t deadline = now_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	struct hq_qmp *q;
	cJSON *greet = NULL, *v;
	int fd, r;

	for (;;) {
		fd = try_connect(path);
		if (fd >= 0 || (fd != -ENOENT && fd != -ECONNREFUSED) || now_ms() >= deadline)
			break;
		usleep(10000);
	}
	if (fd < 0) {
		snprintf(err, errlen, "QMP socket %s: %s%s", path, strerror(-fd),
			 fd == -ENOENT || fd == -ECONNREFUSED ? " (is QEMU running with -qmp "
			 "unix:SOCKET,server=on,wait=off?)" : "");
		return fd == -ENOENT || fd == -ECONNREFUSED ? (timeout_ms > 0 ? -ETIMEDOUT : fd) :
			fd;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		close(fd);
		return -ENOMEM;
	}
	q->fd = fd;
	q->events = cJSON_CreateArray();
	if (!getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl))
		q->peer = cred.pid;
	r = read_msg(q, &greet, now_ms() + 10000);
	v = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(greet, "QMP"), "version"),
				"qemu");
	if (r || !v) {
		snprintf(err, errlen, "QMP socket %s: %s", path,
			 r == -ETIMEDOUT ? "no greeting within 10 s (QEMU serves one client per "
			 "QMP socket: is another one connected?)" :
			 r ? q->err : "no QMP greeting (not a QMP monitor?)");
		cJSON_Delete(greet);
		hq_qmp_close(q);
		return r ? r : -EPROTO;
	}
	q->major = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "major"));
	q->minor = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "minor"));
	q->micro = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "micro"));
	cJSON_Delete(greet);
	r = hq_qmp_call(q, "qmp_capabilities", NULL, NULL, 10000);
	if (r) {
		snprintf(err, errlen, "QMP socket %s: %s", path, q->err);
		hq_qmp_close(q);
		return r;
	}
	*qp = q;
	return 0;
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

const char *hq_qmp_errmsg(const struct hq_qmp *q)
{
	return q ? q->err : "";
}

void hq_qmp_close(struct hq_qmp *q)
{
	if (!q)
		return;
	close(q->fd);
	free(q->buf);
	cJSON_Delete(q->events);
	cJSON_Delete(q->commands);
	free(q);
}
