// SPDX-License-Identifier: MIT
/*
 * halite-cloned: the HTTP/JSON API on libmicrohttpd. One thread per
 * connection (MHD's): a clone request waits for its clones to run, which
 * may take a while, and must not hold up /healthz or /metrics. Bodies are
 * collected up to CLONED_MAX_BODY (the rest is read and dropped, then 413),
 * parsed with cJSON, and handed to the routes; every error is JSON
 * {"error": "..."} with its status.
 *
 *   GET    /healthz                     GET  /metrics
 *   GET    /templates                   POST /templates
 *   GET    /templates/ID                DELETE /templates/ID
 *   POST   /templates/ID/clones
 *   GET    /clones                      GET  /clones/ID   DELETE /clones/ID
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "cloned.h"

/* A Content-Length this large is refused before its body is read at all. */
#define HUGE_BODY (16u << 20)

struct req {
	char *body;
	size_t len;
	bool too_big;
	uint64_t t0; /* request received: a clone's time to ready starts here */
};

static void healthz(struct cloned *d, struct http_reply *r)
{
	cJSON *j = cJSON_CreateObject();
	unsigned nt = 0, nc = 0;

	pthread_mutex_lock(&d->lock);
	for (struct tmpl *tp = d->templates; tp; tp = tp->next)
		nt++;
	for (struct clone *c = d->clones; c; c = c->next)
		nc++;
	pthread_mutex_unlock(&d->lock);
	cJSON_AddBoolToObject(j, "ok", true);
	cJSON_AddNumberToObject(j, "templates", nt);
	cJSON_AddNumberToObject(j, "clones", nc);
	reply_json(r, 200, j);
}

/* The body as a JSON object; NULL with the reply set. Empty: {} if @empty_ok. */
static cJSON *parse_body(struct req *q, bool empty_ok, struct http_reply *r)
{
	const char *end = NULL;
	cJSON *j;

	if (q->len == 0) {
		if (empty_ok)
			return cJSON_CreateObject();
		reply_error(r, 400, "missing body: a JSON object");
		return NULL;
	}
	j = cJSON_ParseWithLengthOpts(q->body, q->len, &end, false);
	if (!j) {
		reply_error(r, 400, "invalid JSON in the body at byte %zu",
			    end && end >= q->body ? (size_t)(end - q->body) : (size_t)0);
		return NULL;
	}
	/* nothing but blanks after the value */
	for (; end && end < q->body + q->len; end++)
		if (!strchr(" \t\r\n", *end)) {
			cJSON_Delete(j);
			reply_error(r, 400, "invalid JSON in the body at byte %zu: text after the value",
				    (size_t)(end - q->body));
			return NULL;
		}
	if (!cJSON_IsObject(j)) {
		cJSON_Delete(j);
		reply_error(r, 400, "the body must be a JSON object");
		return NULL;
	}
	return j;
}

static bool method_is(const char *m, const char *want, struct http_reply *r, const char *allow)
{
	if (!strcmp(m, want))
		return true;
	if (!r->status) {
		r->allow = allow;
		reply_error(r, 405, "method %s not allowed here (allowed: %s)", m, allow);
	}
	return false;
}

static void route(struct cloned *d, const char *method, const char *url, struct req *q,
		  struct http_reply *r)
{
	char seg[4][128];
	int n = 0;
	cJSON *body;

	/* split /a/b/c into at most 4 segments; anything longer or odd is unknown */
	for (const char *p = url; *p && n <= 4;) {
		const char *s;
		size_t len;

		if (*p != '/')
			goto unknown;
		s = ++p;
		while (*p && *p != '/')
			p++;
		len = (size_t)(p - s);
		if (len == 0 || len >= sizeof(seg[0]) || n == 4)
			goto unknown;
		memcpy(seg[n], s, len);
		seg[n++][len] = 0;
	}
	if (n == 1 && !strcmp(seg[0], "healthz")) {
		if (method_is(method, "GET", r, "GET"))
			healthz(d, r);
		return;
	}
	if (n == 1 && !strcmp(seg[0], "metrics")) {
		if (method_is(method, "GET", r, "GET")) {
			r->status = 200;
			r->text = metrics_render(d);
			if (!r->text)
				reply_error(r, 500, "out of memory");
		}
		return;
	}
	if (n == 1 && !strcmp(seg[0], "templates")) {
		if (!strcmp(method, "GET")) {
			tmpl_list(d, r);
		} else if (method_is(method, "POST", r, "GET, POST")) {
			body = parse_body(q, false, r);
			if (body)
				tmpl_create(d, body, r);
			cJSON_Delete(body);
		}
		return;
	}
	if (n == 2 && !strcmp(seg[0], "templates")) {
		if (!strcmp(method, "GET"))
			tmpl_show(d, seg[1], r);
		else if (method_is(method, "DELETE", r, "GET, DELETE"))
			tmpl_delete(d, seg[1], r);
		return;
	}
	if (n == 3 && !strcmp(seg[0], "templates") && !strcmp(seg[2], "clones")) {
		if (method_is(method, "POST", r, "POST")) {
			body = parse_body(q, true, r);
			if (body)
				clones_create(d, seg[1], body, q->t0, r);
			cJSON_Delete(body);
		}
		return;
	}
	if (n == 1 && !strcmp(seg[0], "clones")) {
		if (method_is(method, "GET", r, "GET"))
			clones_list(d, r);
		return;
	}
	if (n == 2 && !strcmp(seg[0], "clones")) {
		if (!strcmp(method, "GET"))
			clones_show(d, seg[1], r);
		else if (method_is(method, "DELETE", r, "GET, DELETE"))
			clones_delete(d, seg[1], r);
		return;
	}
unknown:
	reply_error(r, 404, "no route %s %s (see GET /healthz, /metrics, /templates, /clones)",
		    method, url);
}

static enum MHD_Result send_reply(struct MHD_Connection *conn, struct http_reply *r)
{
	struct MHD_Response *resp;
	enum MHD_Result ret;
	char *text;
	bool json = !r->text;

	if (r->text) {
		text = r->text;
	} else {
		text = r->json ? cJSON_PrintUnformatted(r->json) : NULL;
		if (text) {
			size_t n = strlen(text);
			char *t = realloc(text, n + 2);

			if (t) {
				t[n] = '\n';
				t[n + 1] = 0;
				text = t;
			}
		}
	}
	cJSON_Delete(r->json);
	r->json = NULL;
	r->text = NULL;
	if (!text)
		return MHD_NO;
	resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
				json ? "application/json" : "text/plain; version=0.0.4; charset=utf-8");
	if (r->allow)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->allow);
	ret = MHD_queue_response(conn, r->status ? r->status : 500, resp);
	MHD_destroy_response(resp);
	return ret;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url,
			       const char *method, const char *version, const char *upload,
			       size_t *upload_size, void **con_cls)
{
	struct cloned *d = cls;
	struct req *q = *con_cls;
	struct http_reply r = { 0 };

	if (!q) {
		const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
							     MHD_HTTP_HEADER_CONTENT_LENGTH);

		q = calloc(1, sizeof(*q));
		if (!q)
			return MHD_NO;
		q->t0 = cl_now_ns();
		*con_cls = q;
		if (cl && strtoull(cl, NULL, 10) > HUGE_BODY) {
			reply_error(&r, 413, "request body over %d bytes", CLONED_MAX_BODY);
			return send_reply(conn, &r);
		}
		return MHD_YES;
	}
	if (*upload_size) {
		if (!q->too_big && q->len + *upload_size <= CLONED_MAX_BODY) {
			char *b = realloc(q->body, q->len + *upload_size + 1);

			if (!b)
				return MHD_NO;
			memcpy(b + q->len, upload, *upload_size);
			q->body = b;
			q->len += *upload_size;
		} else {
			q->too_big = true;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (q->too_big)
		reply_error(&r, 413, "request body over %d bytes", CLONED_MAX_BODY);
	else
		route(d, method, url, q, &r);
	cl_log(d, HALITE_LOG_DEBUG, "%s %s -> %u", method, url, r.status);
	return send_reply(conn, &r);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
		      enum MHD_RequestTerminationCode toe)
{
	struct req *q = *con_cls;

	if (q) {
		free(q->body);
		free(q);
		*con_cls = NULL;
	}
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[1024];
	size_t n;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n && msg[n - 1] == '\n')
		msg[--n] = 0;
	cl_log(cls, HALITE_LOG_WARN, "http: %s", msg);
}

static struct MHD_Daemon *start_one(struct cloned *d, int fd)
{
	return MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
					MHD_USE_AUTO | MHD_USE_ERROR_LOG,
				0, NULL, NULL, handler, d, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, d,
				MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_COMPLETED,
				completed, d,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned)256, MHD_OPTION_END);
}

int api_start(struct cloned *d, int unix_fd, int tcp_fd, void **mhd_unix, void **mhd_tcp)
{
	*mhd_unix = start_one(d, unix_fd);
	if (!*mhd_unix)
		return -EIO;
	*mhd_tcp = NULL;
	if (tcp_fd >= 0) {
		*mhd_tcp = start_one(d, tcp_fd);
		if (!*mhd_tcp) {
			MHD_stop_daemon(*mhd_unix);
			*mhd_unix = NULL;
			return -EIO;
		}
	}
	return 0;
}

void api_stop(void *mhd)
{
	if (mhd)
		MHD_stop_daemon(mhd);
}
