// SPDX-License-Identifier: MIT
/*
 * halite-cloned: the HTTP/JSON API on libmicrohttpd, its front door.
 *
 * One event-driven MHD thread per listener (epoll) serves every connection,
 * so idle, trickling or many connections cost a slot each, never a thread:
 * /healthz and /metrics always answer. Fast routes (reads of the registry)
 * answer inline. Slow routes (making a template, starting or deleting
 * clones: seconds) run on a worker thread while their connection is
 * suspended, then resume it; API_MAX_WORKERS at once, 503 beyond.
 *
 * Every request passes the gate at MHD's first call, when the headers are
 * in and no body byte has been read: the TCP listener's bearer token (401
 * and the connection closed), no Origin (a browser's request: 403), on TCP
 * a Host naming this daemon (DNS rebinding: 403), a URL of valid UTF-8
 * without control bytes, a known route, a body only as application/json
 * (415) and not declared over API_LINGER_BODY (413). A reply queued then
 * makes MHD refuse the body. A body that grows past the cap while it
 * arrives (chunked) gets its 413 written on the socket and the connection
 * closed at once: MHD cannot queue a reply mid-body, and reading the rest
 * is what an attacker wants. Bodies are checked by json_check_strict()
 * before cJSON sees them; every reply's strings are made valid UTF-8.
 *
 * The routes are data (routes[] below; halite-cloned --list-routes prints
 * them). Every error is JSON {"error": "..."} with its status.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/socket.h>

#include <gnutls/gnutls.h>
#include <microhttpd.h>

#include "cloned.h"

#define API_MAX_CONNECTIONS 1024 /* the unit's LimitNOFILE is far above */
#define API_PER_CLIENT 64	 /* connections per source IP (TCP) or peer uid (socket) */
#define API_IDLE_TIMEOUT_S 15
#define API_MAX_WORKERS 8	 /* slow requests at once */
#define API_MAX_UIDS 256	 /* distinct peers counted on the socket */
/*
 * A body declared over the cap but not above this is read and dropped
 * before its 413: a client that sends its whole body before it reads
 * (most do) would see its connection reset instead of the reply. Bigger
 * declared bodies get the 413 at once, and chunked ones once past the cap.
 */
#define API_LINGER_BODY (1u << 20)

struct api;

struct listener {
	struct api *a;
	struct MHD_Daemon *mhd;
	bool tcp;
	bool tls;		/* TLS with client certificates (--tls-*) */
	char hosts[4][80];	/* Host values that name this daemon (TCP) */
};

struct api {
	struct cloned *d;
	struct listener l[2];
	pthread_mutex_t lock;	/* guards what follows */
	pthread_cond_t idle;	/* a worker ended */
	unsigned workers;
	bool stopped;		/* MHD is stopped or abandoned: no resume */
	struct { uid_t uid; unsigned n; } uids[API_MAX_UIDS];
};

struct req;
typedef void (*route_fn)(struct cloned *d, struct req *q, struct http_reply *r);

struct route {
	const char *method;
	const char *path;	/* segments; "ID" is a template's or a clone's id */
	bool slow;		/* on a worker thread */
	bool body;		/* takes a JSON object */
	bool empty_ok;		/* ... or nothing: {} */
	route_fn run;
};

enum req_state { Q_BODY, Q_WORKING, Q_REPLY, Q_DONE }; /* Q_REPLY: a worker's, to send */

struct req {
	struct listener *l;
	struct MHD_Connection *conn;
	const struct route *rt;
	char seg[4][128];
	char allow[64];		/* a 405's Allow header */
	enum req_state st;
	bool too_big;		/* over the cap: the rest is dropped, then 413 */
	char *body;
	size_t len;
	cJSON *json;
	struct http_reply reply;
	uint64_t t0; /* request received: a clone's time to ready starts here */
};

static void healthz(struct cloned *d, struct req *q, struct http_reply *r)
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

static void metrics(struct cloned *d, struct req *q, struct http_reply *r)
{
	r->status = 200;
	r->text = metrics_render(d);
	if (!r->text)
		reply_error(r, 500, "out of memory");
}

static void r_tmpl_list(struct cloned *d, struct req *q, struct http_reply *r)
{
	tmpl_list(d, r);
}

static void r_tmpl_create(struct cloned *d, struct req *q, struct http_reply *r)
{
	tmpl_create(d, q->json, r);
}

static void r_tmpl_show(struct cloned *d, struct req *q, struct http_reply *r)
{
	tmpl_show(d, q->seg[1], r);
}

static void r_tmpl_delete(struct cloned *d, struct req *q, struct http_reply *r)
{
	tmpl_delete(d, q->seg[1], r);
}

static void r_clones_create(struct cloned *d, struct req *q, struct http_reply *r)
{
	clones_create(d, q->seg[1], q->json, q->t0, r);
}

static void r_clones_list(struct cloned *d, struct req *q, struct http_reply *r)
{
	clones_list(d, r);
}

static void r_clone_show(struct cloned *d, struct req *q, struct http_reply *r)
{
	clones_show(d, q->seg[1], r);
}

static void r_clone_delete(struct cloned *d, struct req *q, struct http_reply *r)
{
	clones_delete(d, q->seg[1], r);
}

static const struct route routes[] = {
	{ "GET", "/healthz", false, false, false, healthz },
	{ "GET", "/metrics", false, false, false, metrics },
	{ "GET", "/templates", false, false, false, r_tmpl_list },
	{ "POST", "/templates", true, true, false, r_tmpl_create },
	{ "GET", "/templates/ID", false, false, false, r_tmpl_show },
	{ "DELETE", "/templates/ID", true, false, false, r_tmpl_delete },
	{ "POST", "/templates/ID/clones", true, true, true, r_clones_create },
	{ "GET", "/clones", false, false, false, r_clones_list },
	{ "GET", "/clones/ID", false, false, false, r_clone_show },
	{ "DELETE", "/clones/ID", true, false, false, r_clone_delete },
};

void api_print_routes(FILE *f)
{
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
		fprintf(f, "%s %s %s\n", routes[i].method, routes[i].path,
			routes[i].slow ? "slow" : "fast");
}

/* Does @url's segments @seg/@n match @pattern? */
static bool path_matches(const char *pattern, char seg[4][128], int n)
{
	char pat[64], *save = NULL, *p;
	int k = 0;

	snprintf(pat, sizeof(pat), "%s", pattern);
	for (p = strtok_r(pat, "/", &save); p; p = strtok_r(NULL, "/", &save), k++)
		if (k >= n || (strcmp(p, "ID") && strcmp(p, seg[k])))
			return false;
	return k == n;
}

/* The route for @method @url into q->rt and q->seg; false with the reply set. */
static bool find_route(struct req *q, const char *method, const char *url,
		       const char *shown_url, struct http_reply *r)
{
	char allow[64] = "";
	int n = 0;

	/* split /a/b/c into at most 4 segments; anything longer or odd is unknown */
	for (const char *p = url; *p;) {
		const char *s;
		size_t len;

		if (*p != '/')
			goto unknown;
		s = ++p;
		while (*p && *p != '/')
			p++;
		len = (size_t)(p - s);
		if (len == 0 || len >= sizeof(q->seg[0]) || n == 4)
			goto unknown;
		memcpy(q->seg[n], s, len);
		q->seg[n++][len] = 0;
	}
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		if (!path_matches(routes[i].path, q->seg, n))
			continue;
		if (!strcmp(routes[i].method, method)) {
			q->rt = &routes[i];
			return true;
		}
		snprintf(allow + strlen(allow), sizeof(allow) - strlen(allow), "%s%s",
			 allow[0] ? ", " : "", routes[i].method);
	}
	if (allow[0]) {
		snprintf(q->allow, sizeof(q->allow), "%s", allow);
		r->allow = q->allow;
		reply_error(r, 405, "method %s not allowed here (allowed: %s)", method, allow);
		return false;
	}
unknown:
	reply_error(r, 404, "no route %s %s (see GET /healthz, /metrics, /templates, /clones)",
		    method, shown_url);
	return false;
}

/* The body as a JSON object into q->json; false with the reply set. */
static bool parse_body(struct req *q, struct http_reply *r)
{
	char err[256];

	if (q->len == 0) {
		if (q->rt->empty_ok) {
			q->json = cJSON_CreateObject();
			if (!q->json)
				reply_error(r, 500, "out of memory");
			return q->json != NULL;
		}
		reply_error(r, 400, "missing body: a JSON object");
		return false;
	}
	if (json_check_strict(q->body, q->len, err, sizeof(err))) {
		reply_error(r, 400, "%s", err);
		return false;
	}
	q->json = cJSON_ParseWithLength(q->body, q->len);
	if (!q->json) {
		reply_error(r, 400, "invalid JSON in the body (cJSON refused what the strict "
			    "check passed)");
		return false;
	}
	if (!cJSON_IsObject(q->json)) {
		reply_error(r, 400, "the body must be a JSON object");
		return false;
	}
	return true;
}

static enum MHD_Result send_reply(struct MHD_Connection *conn, struct http_reply *r, bool close)
{
	struct MHD_Response *resp;
	enum MHD_Result ret;
	char *text;
	bool json = !r->text;

	if (r->text) {
		text = r->text;
		/* label values name snapshots: the text stays UTF-8 too */
		if (!utf8_valid(text, strlen(text), NULL)) {
			text = utf8_sanitize(r->text, strlen(r->text), strlen(r->text) * 3);
			free(r->text);
		}
	} else {
		/* error messages echo URLs, paths and fields: the reply stays valid UTF-8 */
		text = r->json && !json_sanitize_tree(r->json) ? cJSON_PrintUnformatted(r->json)
							       : NULL;
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
	if (r->status == 401)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
	if (close)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
	ret = MHD_queue_response(conn, r->status ? r->status : 500, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* The TLS peer showed a certificate that --tls-client-ca signed, valid now. */
static bool client_cert_ok(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
	gnutls_session_t s;
	unsigned status = 0, n = 0;

	if (!ci || !ci->tls_session)
		return false;
	s = (gnutls_session_t)ci->tls_session;
	if (!gnutls_certificate_get_peers(s, &n) || !n)
		return false;
	return gnutls_certificate_verify_peers2(s, &status) == 0 && status == 0;
}

/* "Bearer TOKEN" against the token, in time that depends on the token's length only. */
static bool token_ok(const char *want, const char *hdr)
{
	const char *got;
	size_t wl, gl;
	unsigned char diff;

	if (!want || !hdr || strncasecmp(hdr, "Bearer ", 7))
		return false;
	got = hdr + 7;
	wl = strlen(want);
	gl = strlen(got);
	diff = wl != gl;
	for (size_t i = 0; i < wl; i++)
		diff |= (unsigned char)want[i] ^ (unsigned char)(i < gl ? got[i] : 0);
	return !diff;
}

static bool url_clean(const char *url)
{
	for (const unsigned char *p = (const unsigned char *)url; *p; p++)
		if (*p < 0x20 || *p == 0x7f)
			return false;
	return utf8_valid(url, strlen(url), NULL);
}

/* Is this media type application/json, parameters (charset=utf-8) aside? */
static bool is_json_type(const char *ct)
{
	size_t n;

	if (!ct)
		return false;
	while (*ct == ' ' || *ct == '\t')
		ct++;
	n = strcspn(ct, "; \t");
	return n == strlen("application/json") && !strncasecmp(ct, "application/json", n);
}

/*
 * The gate, at MHD's first call: headers in, no body read. False with the
 * reply set (and *@close: the connection is to be closed after it).
 */
static bool gate(struct req *q, struct MHD_Connection *conn, const char *method,
		 const char *url, const char *shown_url, struct http_reply *r, bool *close)
{
	struct listener *l = q->l;
	const char *h, *cl, *te;
	bool has_body;

	if (l->tls && !client_cert_ok(conn)) {
		*close = true;
		reply_error(r, 403, "a client certificate signed by the daemon's --tls-client-ca "
			    "is required");
		return false;
	}
	if (l->tcp && !token_ok(l->a->d->o.token,
				MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
							    MHD_HTTP_HEADER_AUTHORIZATION))) {
		*close = true;
		reply_error(r, 401, "authentication required: send 'Authorization: Bearer TOKEN' "
			    "with the token of the daemon's --token-file");
		return false;
	}
	if (MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin")) {
		*close = true;
		reply_error(r, 403, "browser requests are refused (the request has an Origin "
			    "header): use halite-clone, curl or another HTTP client");
		return false;
	}
	if (l->tcp) {
		bool ok = false;

		h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
		for (int i = 0; h && i < 4; i++)
			ok |= l->hosts[i][0] && !strcasecmp(h, l->hosts[i]);
		if (!ok) {
			char *shown = h ? utf8_sanitize(h, strlen(h), 200) : NULL;

			*close = true;
			reply_error(r, 403, "Host '%s' does not name this daemon (want %s): refused, "
				    "as a DNS rebinding attack would be", shown ? shown : "",
				    l->hosts[0]);
			free(shown);
			return false;
		}
	}
	cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	te = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
					 MHD_HTTP_HEADER_TRANSFER_ENCODING);
	has_body = te || (cl && strtoull(cl, NULL, 10) > 0);
	/*
	 * A caller's mistake (no such route, a bad URL) is answered once its
	 * body is in, within the cap: a client still sending would see its
	 * connection reset instead of the reply.
	 */
	if (!url_clean(url))
		reply_error(&q->reply, 400, "the URL %s is not valid UTF-8 or has control "
			    "characters", shown_url);
	else
		find_route(q, method, url, shown_url, &q->reply);
	if (has_body && !is_json_type(MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
								   MHD_HTTP_HEADER_CONTENT_TYPE))) {
		*close = true;
		reply_error(r, 415, "a request body must be Content-Type: application/json");
		return false;
	}
	if (cl && strtoull(cl, NULL, 10) > API_LINGER_BODY) {
		*close = true;
		reply_error(r, 413, "request body over %d bytes", CLONED_MAX_BODY);
		return false;
	}
	return true;
}

/*
 * A body past the cap mid-way: MHD cannot queue a reply now, so the 413 is
 * written on the socket (a small reply into an empty send buffer) and MHD is
 * told to close the connection without reading on.
 */
static void refuse_mid_body(struct MHD_Connection *conn, bool tls)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	char body[128], msg[384];
	int n;

	if (!ci)
		return;
	snprintf(body, sizeof(body), "{\"error\":\"request body over %d bytes\"}\n",
		 CLONED_MAX_BODY);
	n = snprintf(msg, sizeof(msg),
		     "HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\n"
		     "Connection: close\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
	if (tls) {
		/* inside the TLS stream: MHD's session, which ends with this connection */
		const union MHD_ConnectionInfo *ti =
			MHD_get_connection_info(conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);

		if (ti && ti->tls_session)
			(void)gnutls_record_send((gnutls_session_t)ti->tls_session, msg, (size_t)n);
		return;
	}
	(void)send(ci->connect_fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
	shutdown(ci->connect_fd, SHUT_WR);
}

static void *worker(void *arg)
{
	struct req *q = arg;
	struct api *a = q->l->a;

	q->rt->run(a->d, q, &q->reply);
	pthread_mutex_lock(&a->lock);
	q->st = Q_REPLY;
	if (!a->stopped)
		MHD_resume_connection(q->conn);
	a->workers--;
	pthread_cond_broadcast(&a->idle);
	pthread_mutex_unlock(&a->lock);
	return NULL;
}

/* A slow route on a worker, its connection suspended; false with the reply set. */
static bool start_worker(struct req *q, struct http_reply *r)
{
	struct api *a = q->l->a;
	pthread_attr_t at;
	pthread_t t;
	int ret = -EAGAIN;

	pthread_mutex_lock(&a->lock);
	if (!a->stopped && a->workers < API_MAX_WORKERS) {
		q->st = Q_WORKING;
		/* suspended before the worker can resume it */
		MHD_suspend_connection(q->conn);
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		ret = -pthread_create(&t, &at, worker, q);
		pthread_attr_destroy(&at);
		if (ret) {
			q->st = Q_BODY;
			MHD_resume_connection(q->conn);
		} else {
			a->workers++;
		}
	}
	pthread_mutex_unlock(&a->lock);
	if (ret == 0)
		return true;
	reply_error(r, 503, "the daemon is busy with %d slow requests: try again shortly",
		    API_MAX_WORKERS);
	return false;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url,
			       const char *method, const char *version, const char *upload,
			       size_t *upload_size, void **con_cls)
{
	struct listener *l = cls;
	struct cloned *d = l->a->d;
	struct req *q = *con_cls;
	struct http_reply r = { 0 };
	bool close = false;
	char *shown;

	if (!q) {
		q = calloc(1, sizeof(*q));
		if (!q)
			return MHD_NO;
		q->l = l;
		q->conn = conn;
		q->t0 = halite_now_ns();
		*con_cls = q;
		shown = utf8_sanitize(url, strlen(url), 512);
		if (!shown)
			return MHD_NO;
		if (gate(q, conn, method, url, shown, &r, &close)) {
			free(shown);
			return MHD_YES;
		}
		cl_log(d, HALITE_LOG_DEBUG, "%s %s -> %u", method, shown, r.status);
		free(shown);
		q->st = Q_DONE;
		return send_reply(conn, &r, close);
	}
	if (q->st == Q_BODY && q->too_big && !*upload_size) {
		reply_error(&q->reply, 413, "request body over %d bytes", CLONED_MAX_BODY);
		q->st = Q_REPLY;
	}
	if (q->st == Q_BODY && !q->rt && !*upload_size)
		q->st = Q_REPLY; /* a route's error, its body read */
	if (q->st == Q_REPLY) {
		q->st = Q_DONE;
		cl_log(d, HALITE_LOG_DEBUG, "%s %s -> %u", method, q->rt ? q->rt->path : "?",
		       q->reply.status);
		return send_reply(conn, &q->reply, q->too_big);
	}
	if (q->st != Q_BODY)
		return MHD_YES;
	if (*upload_size) {
		if (q->too_big || q->len + *upload_size > CLONED_MAX_BODY) {
			/* a declared length is at most API_LINGER_BODY (the gate) */
			if (!MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
							 MHD_HTTP_HEADER_CONTENT_LENGTH)) {
				refuse_mid_body(conn, l->tls);
				return MHD_NO;
			}
			q->too_big = true;
			*upload_size = 0;
			return MHD_YES;
		}
		char *b = realloc(q->body, q->len + *upload_size + 1);

		if (!b)
			return MHD_NO;
		memcpy(b + q->len, upload, *upload_size);
		q->body = b;
		q->len += *upload_size;
		*upload_size = 0;
		return MHD_YES;
	}
	if (q->rt->body && !parse_body(q, &r)) {
		q->st = Q_DONE;
		return send_reply(conn, &r, false);
	}
	if (q->rt->slow) {
		if (start_worker(q, &r))
			return MHD_YES;
	} else {
		q->rt->run(d, q, &r);
	}
	shown = utf8_sanitize(url, strlen(url), 512);
	cl_log(d, HALITE_LOG_DEBUG, "%s %s -> %u", method, shown ? shown : "?", r.status);
	free(shown);
	q->st = Q_DONE;
	return send_reply(conn, &r, false);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
		      enum MHD_RequestTerminationCode toe)
{
	struct req *q = *con_cls;

	if (q) {
		cJSON_Delete(q->json);
		cJSON_Delete(q->reply.json);
		free(q->reply.text);
		free(q->body);
		free(q);
		*con_cls = NULL;
	}
}

/*
 * The socket's per-client limit: MHD counts per IP address, and every
 * unix-socket peer has the same (none); its peers are told apart by uid
 * (SO_PEERCRED). A connection over the limit is shut down at once, which
 * MHD sees as the peer leaving.
 */
static void notify(void *cls, struct MHD_Connection *conn, void **socket_ctx,
		   enum MHD_ConnectionNotificationCode toe)
{
	struct listener *l = cls;
	struct api *a = l->a;
	const union MHD_ConnectionInfo *ci;
	struct ucred cr;
	socklen_t len = sizeof(cr);
	int slot = -1, fd;

	if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
		if (*socket_ctx) {
			slot = (int)(intptr_t)*socket_ctx - 1;
			pthread_mutex_lock(&a->lock);
			a->uids[slot].n--;
			pthread_mutex_unlock(&a->lock);
			*socket_ctx = NULL;
		}
		return;
	}
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!ci)
		return;
	fd = ci->connect_fd;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len)) {
		shutdown(fd, SHUT_RDWR);
		return;
	}
	pthread_mutex_lock(&a->lock);
	for (int i = 0; i < API_MAX_UIDS; i++) {
		if (a->uids[i].n && a->uids[i].uid == cr.uid) {
			slot = i;
			break;
		}
		if (!a->uids[i].n && slot < 0)
			slot = i;
	}
	if (slot >= 0 && a->uids[slot].n && a->uids[slot].uid != cr.uid)
		slot = -1;
	if (slot >= 0 && a->uids[slot].n < API_PER_CLIENT) {
		a->uids[slot].uid = cr.uid;
		a->uids[slot].n++;
		*socket_ctx = (void *)(intptr_t)(slot + 1);
	} else {
		slot = -1;
	}
	pthread_mutex_unlock(&a->lock);
	if (slot < 0)
		shutdown(fd, SHUT_RDWR);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[1024];
	size_t n;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n && msg[n - 1] == '\n')
		msg[--n] = 0;
	cl_log(cls, HALITE_LOG_DEBUG, "http: %s", msg);
}

static int start_one(struct api *a, struct listener *l, int fd)
{
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
			 MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC | MHD_USE_ERROR_LOG;
	struct MHD_OptionItem o[12];
	int n = 0;

/* Two-pointer options (a function and its argument) carry the function in .value. */
#define OPT(opt, v, p) (o[n++] = (struct MHD_OptionItem){ (opt), (intptr_t)(v), (p) })
	l->a = a;
	OPT(MHD_OPTION_EXTERNAL_LOGGER, mhd_log, a->d);
	OPT(MHD_OPTION_LISTEN_SOCKET, fd, NULL);
	OPT(MHD_OPTION_NOTIFY_COMPLETED, completed, l);
	OPT(MHD_OPTION_CONNECTION_TIMEOUT, API_IDLE_TIMEOUT_S, NULL);
	OPT(MHD_OPTION_CONNECTION_LIMIT, API_MAX_CONNECTIONS, NULL);
	/* Network clients are limited each; the unix socket checks its peer instead. */
	if (l->tls || l->tcp)
		OPT(MHD_OPTION_PER_IP_CONNECTION_LIMIT, API_PER_CLIENT, NULL);
	else
		OPT(MHD_OPTION_NOTIFY_CONNECTION, notify, l);
	if (l->tls) {
		flags |= MHD_USE_TLS;
		OPT(MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)a->d->o.tls_key);
		OPT(MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)a->d->o.tls_cert);
		/* a trust list makes MHD ask for the client's certificate */
		OPT(MHD_OPTION_HTTPS_MEM_TRUST, 0, (void *)a->d->o.tls_ca);
	}
	OPT(MHD_OPTION_END, 0, NULL);
#undef OPT
	l->mhd = MHD_start_daemon(flags, 0, NULL, NULL, handler, l, MHD_OPTION_ARRAY, o,
				  MHD_OPTION_END);
	return l->mhd ? 0 : -EIO;
}

/* The Host values that name the TCP listener: its --listen, and loopback names for its port. */
static void tcp_hosts(struct listener *l, const char *listen)
{
	const char *port = strrchr(listen, ':');

	snprintf(l->hosts[0], sizeof(l->hosts[0]), "%s", listen);
	if (!port)
		return;
	snprintf(l->hosts[1], sizeof(l->hosts[1]), "localhost%s", port);
	snprintf(l->hosts[2], sizeof(l->hosts[2]), "127.0.0.1%s", port);
	snprintf(l->hosts[3], sizeof(l->hosts[3]), "[::1]%s", port);
}

int api_start(struct cloned *d, int unix_fd, int tcp_fd, struct api **out)
{
	struct api *a = calloc(1, sizeof(*a));
	pthread_condattr_t ca;

	if (!a)
		return -ENOMEM;
	a->d = d;
	pthread_mutex_init(&a->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&a->idle, &ca);
	pthread_condattr_destroy(&ca);
	if (start_one(a, &a->l[0], unix_fd))
		goto fail;
	if (tcp_fd >= 0) {
		a->l[1].tcp = true;
		a->l[1].tls = d->o.tls_cert != NULL;
		tcp_hosts(&a->l[1], d->o.listen);
		if (start_one(a, &a->l[1], tcp_fd)) {
			MHD_stop_daemon(a->l[0].mhd);
			goto fail;
		}
	}
	*out = a;
	return 0;
fail:
	pthread_cond_destroy(&a->idle);
	pthread_mutex_destroy(&a->lock);
	free(a);
	return -EIO;
}

bool api_stop(struct api *a, unsigned grace_ms)
{
	struct timespec until;
	bool clean;

	if (!a)
		return true;
	/* no new connection; the listening sockets are the caller's to close */
	for (int i = 0; i < 2; i++)
		if (a->l[i].mhd)
			MHD_quiesce_daemon(a->l[i].mhd);
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += grace_ms / 1000;
	until.tv_nsec += (long)(grace_ms % 1000) * 1000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&a->lock);
	while (a->workers && pthread_cond_timedwait(&a->idle, &a->lock, &until) != ETIMEDOUT)
		;
	clean = !a->workers;
	a->stopped = true;
	pthread_mutex_unlock(&a->lock);
	if (!clean) {
		/*
		 * A worker still holds its connection and request: stopping MHD
		 * would free them under it. The process is about to exit; its
		 * state files are written whole (tmp + rename) or not at all.
		 */
		cl_log(a->d, HALITE_LOG_WARN, "%u slow requests still running at exit: left",
		       a->workers);
		return false;
	}
	for (int i = 0; i < 2; i++)
		if (a->l[i].mhd)
			MHD_stop_daemon(a->l[i].mhd);
	pthread_cond_destroy(&a->idle);
	pthread_mutex_destroy(&a->lock);
	free(a);
	return true;
}
