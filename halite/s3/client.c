// SPDX-License-Identifier: MIT
/*
 * The client handle and its request engine: every request, one or many,
 * runs through s3_run(), which keeps up to `jobs` of them in flight on one
 * curl multi handle and retries the failures worth retrying.
 *
 * Keep-alive: the multi handle owns the connection cache, and it lives as
 * long as the client, so a connection opened by one request serves the
 * next; the easy handles are reused too (curl_easy_reset keeps their
 * caches). Signing: libcurl's SigV4 over the method, path, query and the
 * headers we give it; the body's SHA-256 goes in x-amz-content-sha256, as
 * S3 requires, computed here so that the value is right whichever of the
 * payload hash and the header libcurl's version signs.
 *
 * Retries: no answer (a curl error), 5xx, and 429 are retried after a
 * full-jitter exponential backoff, up to max_attempts in all; every other
 * answer that is not 2xx fails at once with the store's <Code> and
 * <Message>. A request's body is in memory (a part, or XML), so a retry
 * sends it again as it was.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "s3_internal.h"

#define DEFAULT_JOBS 8
#define MAX_JOBS 64

static const char *const s3_errstr[HALITE_S3_E_MAX - HALITE_S3_E_BASE] = {
	[HALITE_S3_E_URL - HALITE_S3_E_BASE] = "not an s3://BUCKET/KEY URL",
	[HALITE_S3_E_CONFIG - HALITE_S3_E_BASE] = "object store not configured",
	[HALITE_S3_E_CHANGED - HALITE_S3_E_BASE] =
		"the object changed: its ETag is not the one expected",
	[HALITE_S3_E_NO_SUCH_KEY - HALITE_S3_E_BASE] = "no such key",
	[HALITE_S3_E_NO_SUCH_BUCKET - HALITE_S3_E_BASE] = "no such bucket",
	[HALITE_S3_E_NO_SUCH_UPLOAD - HALITE_S3_E_BASE] = "no such multipart upload",
	[HALITE_S3_E_DENIED - HALITE_S3_E_BASE] = "access denied (credentials or permission)",
	[HALITE_S3_E_BAD_DIGEST - HALITE_S3_E_BASE] =
		"the store's checksum of the body differs from the one sent",
	[HALITE_S3_E_STORE - HALITE_S3_E_BASE] = "the object store refused the request",
	[HALITE_S3_E_NETWORK - HALITE_S3_E_BASE] = "no answer from the object store",
	[HALITE_S3_E_PROTOCOL - HALITE_S3_E_BASE] = "an answer of the object store not understood",
};

const char *halite_s3_strerror(int err)
{
	const char *s;

	if (err < 0)
		err = -err;
	if (err >= HALITE_S3_E_BASE && err < HALITE_S3_E_MAX)
		return s3_errstr[err - HALITE_S3_E_BASE];
	/* Below the library: its other codes are halite_strerror()'s, which calls this one. */
	s = err < HALITE_E_BASE ? strerrordesc_np(err) : NULL;
	return s ? s : "unknown error";
}

int s3_fail(struct halite_s3 *s, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->errmsg, sizeof(s->errmsg), fmt, ap);
	va_end(ap);
	return err;
}

const char *halite_s3_errmsg(const struct halite_s3 *s)
{
	return s ? s->errmsg : "";
}

void halite_s3_get_stats(const struct halite_s3 *s, struct halite_s3_stats *st)
{
	*st = s->stats;
}

void halite_s3_set_retry(struct halite_s3 *s, unsigned retry_for_ms, unsigned backoff_cap_ms)
{
	s->cfg.retry_for_ms = retry_for_ms;
	s->cfg.backoff_cap_ms = backoff_cap_ms;
}

void halite_s3_set_jobs(struct halite_s3 *s, unsigned jobs)
{
	s->jobs = jobs == 0 ? DEFAULT_JOBS : jobs > MAX_JOBS ? MAX_JOBS : jobs;
}

void halite_s3_set_progress(struct halite_s3 *s, void (*fn)(void *ctx, uint64_t bytes),
			    void *ctx)
{
	s->progress = fn;
	s->progress_ctx = ctx;
}

static char *dup_str(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* The URL every request's "/KEY?QUERY" is appended to. */
static int make_base(struct halite_s3 *s)
{
	const struct halite_s3_config *c = &s->cfg;
	bool path = c->addressing == HALITE_S3_ADDR_PATH ||
		    (c->addressing == HALITE_S3_ADDR_AUTO && c->endpoint);
	int ret;

	if (c->endpoint) {
		const char *host = strstr(c->endpoint, "://") + 3;
		size_t el = strlen(c->endpoint);

		while (el && c->endpoint[el - 1] == '/')
			el--;
		if (path)
			ret = asprintf(&s->base, "%.*s/%s", (int)el, c->endpoint, s->bucket);
		else
			ret = asprintf(&s->base, "%.*s%s.%.*s", (int)(host - c->endpoint),
				       c->endpoint, s->bucket, (int)(el - (size_t)(host - c->endpoint)),
				       host);
	} else if (path) {
		ret = asprintf(&s->base, "https://s3.%s.amazonaws.com/%s", c->region, s->bucket);
	} else {
		ret = asprintf(&s->base, "https://%s.s3.%s.amazonaws.com", s->bucket, c->region);
	}
	if (ret < 0) {
		s->base = NULL;
		return -ENOMEM;
	}
	return 0;
}

int halite_s3_open(struct halite_s3 **sp, const struct halite_s3_config *c, const char *bucket)
{
	static bool curl_ready;
	struct halite_s3 *s;

	/* Not thread-safe in libcurl either: the tools open their client before any thread. */
	if (!curl_ready) {
		if (curl_global_init(CURL_GLOBAL_DEFAULT))
			return -ENOMEM;
		curl_ready = true;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->cfg = *c;
	s->cfg.endpoint = dup_str(c->endpoint);
	s->cfg.region = dup_str(c->region);
	s->cfg.access_key = dup_str(c->access_key);
	s->cfg.secret_key = dup_str(c->secret_key);
	s->cfg.session_token = dup_str(c->session_token);
	if (!s->cfg.max_attempts)
		s->cfg.max_attempts = 1;
	s->bucket = strdup(bucket);
	s->multi = curl_multi_init();
	s->easy = calloc(MAX_JOBS, sizeof(*s->easy));
	s->nslots = MAX_JOBS;
	halite_s3_set_jobs(s, 0);
	s->debug = getenv("HALITE_S3_DEBUG") && !strcmp(getenv("HALITE_S3_DEBUG"), "1");
	if (getrandom(&s->rnd, sizeof(s->rnd), 0) != sizeof(s->rnd) || !s->rnd)
		s->rnd = (uint32_t)time(NULL) ^ (uint32_t)getpid() ^ 0x9e3779b9u;
	if (!s->cfg.region || !s->cfg.access_key || !s->cfg.secret_key || !s->bucket ||
	    !s->multi || !s->easy || make_base(s) ||
	    asprintf(&s->sigv4, "aws:amz:%s:s3", s->cfg.region) < 0 ||
	    asprintf(&s->userpwd, "%s:%s", s->cfg.access_key, s->cfg.secret_key) < 0) {
		halite_s3_close(s);
		return -ENOMEM;
	}
	*sp = s;
	return 0;
}

void halite_s3_close(struct halite_s3 *s)
{
	if (!s)
		return;
	for (unsigned i = 0; s->easy && i < s->nslots; i++)
		if (s->easy[i])
			curl_easy_cleanup(s->easy[i]);
	if (s->multi)
		curl_multi_cleanup(s->multi);
	free(s->easy);
	free(s->base);
	free(s->sigv4);
	free(s->userpwd);
	free(s->bucket);
	halite_s3_config_clear(&s->cfg);
	free(s);
}

void s3_xfer_init(struct s3_xfer *x)
{
	memset(x, 0, sizeof(*x));
	x->fd = -1;
}

void s3_xfer_clear(struct s3_xfer *x)
{
	curl_slist_free_all(x->hdrs);
	free(x->url);
	free(x->mem);
	x->hdrs = NULL;
	x->url = NULL;
	x->mem = NULL;
	x->mem_len = x->mem_cap = 0;
}

static uint32_t next_rnd(struct halite_s3 *s)
{
	uint32_t v = s->rnd;

	v ^= v << 13;
	v ^= v >> 17;
	v ^= v << 5;
	return s->rnd = v;
}

/* ---- one request's callbacks ---- */

static bool ok_status(long st)
{
	return st >= 200 && st < 300;
}

static int mem_append(struct s3_xfer *x, const char *p, size_t n, size_t max)
{
	if (x->mem_len + n > max)
		return -HALITE_S3_E_PROTOCOL;
	if (x->mem_len + n + 1 > x->mem_cap) {
		size_t cap = (x->mem_len + n + 1) * 2;
		char *m = realloc(x->mem, cap);

		if (!m)
			return -ENOMEM;
		x->mem = m;
		x->mem_cap = cap;
	}
	memcpy(x->mem + x->mem_len, p, n);
	x->mem_len += n;
	x->mem[x->mem_len] = 0;
	return 0;
}

static size_t on_write(char *p, size_t size, size_t nmemb, void *arg)
{
	struct s3_xfer *x = arg;
	size_t n = size * nmemb;
	int ret = 0;

	if (!ok_status(x->status)) {
		/* An error's body: keep its start for the message, drop the rest. */
		if (x->mem_len < S3_ERRBODY_MAX)
			mem_append(x, p, n < S3_ERRBODY_MAX - x->mem_len ? n : S3_ERRBODY_MAX - x->mem_len,
				   S3_ERRBODY_MAX);
		return n;
	}
	if (x->dst) {
		if (x->got + n > x->dst_cap)
			ret = -HALITE_S3_E_PROTOCOL;
		else
			memcpy((char *)x->dst + x->got, p, n);
	} else if (x->fd >= 0) {
		ret = halite_pwrite_all(x->fd, p, n, x->got);
	} else if (x->to_mem) {
		ret = mem_append(x, p, n, S3_XML_MAX);
	}
	if (ret < 0) {
		x->werr = ret;
		return 0; /* curl aborts the transfer */
	}
	x->got += n;
	if (x->s->progress && x->fd >= 0)
		x->s->progress(x->s->progress_ctx, x->got);
	return n;
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *arg)
{
	struct s3_xfer *x = arg;
	size_t n = size * nmemb, vl;
	const char *v;

	if (n > 5 && !strncmp(p, "HTTP/", 5)) {
		const char *sp = memchr(p, ' ', n);

		x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
		x->etag[0] = 0;
		x->has_length = false;
		return n;
	}
	v = memchr(p, ':', n);
	if (!v)
		return n;
	vl = n - (size_t)(v + 1 - p);
	v++;
	while (vl && (*v == ' ' || *v == '\t'))
		v++, vl--;
	while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
		vl--;
	if (!strncasecmp(p, "etag:", 5) && vl < sizeof(x->etag)) {
		memcpy(x->etag, v, vl);
		x->etag[vl] = 0;
	} else if (!strncasecmp(p, "content-length:", 15)) {
		x->content_length = strtoull(v, NULL, 10);
		x->has_length = true;
	}
	return n;
}

/* ---- building a request ---- */

static int add_header(struct s3_xfer *x, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static int add_header(struct s3_xfer *x, const char *fmt, ...)
{
	struct curl_slist *l;
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	l = curl_slist_append(x->hdrs, line);
	if (!l)
		return -ENOMEM;
	x->hdrs = l;
	return 0;
}

/* The URL and headers, once per request: a retry sends the same ones. */
static int build(struct halite_s3 *s, struct s3_xfer *x)
{
	char sha[72], md5[32];
	char *path = s3_escape_key(x->key);
	int ret = 0;

	x->s = s;
	if (!path || asprintf(&x->url, "%s%s%s%s", s->base, path, x->query[0] ? "?" : "",
			      x->query) < 0) {
		x->url = NULL;
		free(path);
		return -ENOMEM;
	}
	free(path);
	s3_sha256_hex(x->body ? x->body : "", x->body ? x->body_len : 0, sha);
	ret |= add_header(x, "x-amz-content-sha256: %s", sha);
	/*
	 * No "Expect:" to turn 100-continue off: libcurl 7.88 would sign the
	 * empty header it never sends. The round trip lets the store refuse a
	 * large part before its body is sent, which is no loss.
	 */
	if (x->body) {
		ret |= add_header(x, "Content-Type: %s", x->to_mem ? "application/xml" :
							       "application/octet-stream");
	}
	if (x->md5) {
		s3_md5(x->body, x->body_len, md5, NULL);
		ret |= add_header(x, "Content-MD5: %s", md5);
	} else if (x->content_md5) {
		ret |= add_header(x, "Content-MD5: %s", x->content_md5);
	}
	if (x->if_match)
		ret |= add_header(x, "If-Match: %s", x->if_match);
	if (x->range)
		ret |= add_header(x, "Range: bytes=%llu-%llu", (unsigned long long)x->range_off,
				  (unsigned long long)(x->range_off + x->range_len - 1));
	if (s->cfg.session_token)
		ret |= add_header(x, "x-amz-security-token: %s", s->cfg.session_token);
	return ret ? -ENOMEM : 0;
}

static void setup_easy(struct halite_s3 *s, CURL *e, struct s3_xfer *x)
{
	curl_easy_reset(e);
	curl_easy_setopt(e, CURLOPT_URL, x->url);
	curl_easy_setopt(e, CURLOPT_AWS_SIGV4, s->sigv4);
	curl_easy_setopt(e, CURLOPT_USERPWD, s->userpwd);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->hdrs);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 10L);
	/* A stalled connection (under 1 byte/s for 30 s) fails and is retried. */
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 30L);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
	curl_easy_setopt(e, CURLOPT_PRIVATE, x);
	/* HALITE_S3_DEBUG=1: libcurl's trace of every request on stderr. */
	if (s->debug)
		curl_easy_setopt(e, CURLOPT_VERBOSE, 1L);
	if (!strcmp(x->method, "HEAD")) {
		curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
	} else if (!strcmp(x->method, "GET")) {
		curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
	} else if (!strcmp(x->method, "DELETE")) {
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "DELETE");
	} else {
		/* PUT and POST: the body from memory, which SigV4 can hash and a retry resend. */
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, x->body ? x->body : "");
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
				 (curl_off_t)(x->body ? x->body_len : 0));
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, x->method);
	}
	x->status = 0;
	x->got = 0;
	x->mem_len = 0;
	x->werr = 0;
	x->etag[0] = 0;
	x->has_length = false;
}

/* ---- the answer ---- */

static int error_code(long status, const char *code)
{
	if (status == 412)
		return -HALITE_S3_E_CHANGED;
	if (status == 403)
		return -HALITE_S3_E_DENIED;
	if (!strcmp(code, "NoSuchBucket"))
		return -HALITE_S3_E_NO_SUCH_BUCKET;
	if (!strcmp(code, "NoSuchUpload"))
		return -HALITE_S3_E_NO_SUCH_UPLOAD;
	if (status == 404 || !strcmp(code, "NoSuchKey"))
		return -HALITE_S3_E_NO_SUCH_KEY;
	if (!strcmp(code, "BadDigest") || !strcmp(code, "InvalidDigest"))
		return -HALITE_S3_E_BAD_DIGEST;
	return -HALITE_S3_E_STORE;
}

/* The store's error answer: its code and message in errmsg. */
static int store_error(struct halite_s3 *s, struct s3_xfer *x, const char *after)
{
	char code[128] = "", msg[256] = "";
	size_t pos = 0;
	int err;

	if (x->mem_len) {
		s3_xml_tag(x->mem, x->mem_len, &pos, "Code", code, sizeof(code));
		pos = 0;
		s3_xml_tag(x->mem, x->mem_len, &pos, "Message", msg, sizeof(msg));
	}
	err = error_code(x->status, code);
	if (!code[0] && !msg[0] && x->mem_len) {
		/* Not S3's XML: show the start of what came, on one line. */
		snprintf(msg, sizeof(msg), "%.200s", x->mem);
		for (char *p = msg; *p; p++)
			if (*p == '\n' || *p == '\r')
				*p = ' ';
	}
	if (!code[0] && !msg[0])
		snprintf(msg, sizeof(msg), "%s", halite_s3_strerror(err));
	return s3_fail(s, err, "%s s3://%s/%s: HTTP %ld%s%s%s%s%s", x->method, s->bucket, x->key,
		       x->status, code[0] ? " " : "", code, msg[0] ? ": " : "", msg, after);
}

/* ---- the engine ---- */

enum slot_state { SLOT_IDLE, SLOT_RUNNING, SLOT_WAITING };

struct slot {
	enum slot_state state;
	size_t index;
	struct s3_xfer x;
	CURL *easy;
};

static int slot_start(struct halite_s3 *s, struct slot *sl)
{
	setup_easy(s, sl->easy, &sl->x);
	if (curl_multi_add_handle(s->multi, sl->easy) != CURLM_OK)
		return s3_fail(s, -ENOMEM, "%s s3://%s/%s: cannot start the request",
			       sl->x.method, s->bucket, sl->x.key);
	if (!sl->x.attempts++)
		sl->x.first_try = halite_now_s();
	sl->state = SLOT_RUNNING;
	s->stats.requests++;
	return 0;
}

/*
 * A finished request: 1 when it succeeded, 0 when it will be retried (the
 * slot waits), or the failure's code.
 */
static int slot_finished(struct halite_s3 *s, struct slot *sl, CURLcode rc)
{
	struct s3_xfer *x = &sl->x;
	char after[64] = "";
	long connects = 0;
	bool retry;

	curl_multi_remove_handle(s->multi, sl->easy);
	if (curl_easy_getinfo(sl->easy, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK)
		s->stats.connects += (uint64_t)connects;
	if (x->werr)
		return s3_fail(s, x->werr, "%s s3://%s/%s: %s", x->method, s->bucket, x->key,
			       x->werr == -HALITE_S3_E_PROTOCOL ?
			       "the answer is longer than asked for" : strerror(-x->werr));
	if (rc == CURLE_OK && ok_status(x->status)) {
		s->stats.bytes_up += x->body ? x->body_len : 0;
		s->stats.bytes_down += x->got;
		return 1;
	}
	retry = rc != CURLE_OK || x->status >= 500 || x->status == 429;
	if (retry && (x->attempts < s->cfg.max_attempts ||
		      (halite_now_s() - x->first_try) * 1000 < s->cfg.retry_for_ms)) {
		unsigned ms = halite_s3_backoff_ms(x->attempts, s->cfg.backoff_base_ms,
						  s->cfg.backoff_cap_ms, next_rnd(s));

		sl->state = SLOT_WAITING;
		x->not_before = halite_now_s() + ms / 1000.0;
		s->stats.retries++;
		return 0;
	}
	if (retry && x->attempts > 1)
		snprintf(after, sizeof(after), " (after %u attempts in %.1f s)", x->attempts,
			 halite_now_s() - x->first_try);
	if (rc != CURLE_OK)
		return s3_fail(s, -HALITE_S3_E_NETWORK, "%s %s: %s%s", x->method, x->url,
			       curl_easy_strerror(rc), after);
	return store_error(s, x, after);
}

/* Milliseconds until the first waiting slot may go, at most @max. */
static int wait_ms(struct slot *slots, unsigned n, int max)
{
	double now = halite_now_s();
	int ms = max;

	for (unsigned i = 0; i < n; i++) {
		if (slots[i].state != SLOT_WAITING)
			continue;
		double d = (slots[i].x.not_before - now) * 1000.0;

		if (d < ms)
			ms = d < 0 ? 0 : (int)d + 1;
	}
	return ms;
}

int s3_run(struct halite_s3 *s, size_t n, int (*prep)(void *ctx, size_t i, struct s3_xfer *x),
	   int (*done)(void *ctx, size_t i, struct s3_xfer *x), void *ctx)
{
	unsigned nslots = (unsigned)(n < s->jobs ? n : s->jobs), busy = 0;
	struct slot *slots = calloc(nslots ? nslots : 1, sizeof(*slots));
	size_t next = 0;
	int ret = 0;

	if (!slots)
		return s3_fail(s, -ENOMEM, "out of memory");
	s->errmsg[0] = 0;
	for (unsigned i = 0; i < nslots; i++) {
		if (!s->easy[i] && !(s->easy[i] = curl_easy_init())) {
			ret = s3_fail(s, -ENOMEM, "out of memory");
			goto out;
		}
		slots[i].easy = s->easy[i];
		s3_xfer_init(&slots[i].x);
	}
	while (!ret && (next < n || busy)) {
		CURLMsg *m;
		int left, running;

		for (unsigned i = 0; i < nslots && !ret; i++) {
			struct slot *sl = &slots[i];

			if (sl->state == SLOT_IDLE && next < n) {
				void *scratch = sl->x.scratch;

				s3_xfer_clear(&sl->x);
				s3_xfer_init(&sl->x);
				sl->x.scratch = scratch;
				sl->index = next++;
				ret = prep(ctx, sl->index, &sl->x);
				if (!ret)
					ret = build(s, &sl->x);
				if (!ret)
					ret = slot_start(s, sl);
				busy += !ret;
			} else if (sl->state == SLOT_WAITING && halite_now_s() >= sl->x.not_before) {
				ret = slot_start(s, sl);
			}
		}
		if (ret)
			break;
		curl_multi_perform(s->multi, &running);
		while ((m = curl_multi_info_read(s->multi, &left))) {
			struct slot *sl = NULL;
			struct s3_xfer *x;
			int r;

			if (m->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
			sl = (struct slot *)((char *)x - offsetof(struct slot, x));
			r = slot_finished(s, sl, m->data.result);
			if (r == 1) {
				sl->state = SLOT_IDLE;
				busy--;
				r = done ? done(ctx, sl->index, x) : 0;
			}
			if (r < 0 && !ret)
				ret = r;
		}
		if (!ret && busy)
			curl_multi_poll(s->multi, NULL, 0, wait_ms(slots, nslots, 1000), NULL);
	}
out:
	for (unsigned i = 0; i < nslots; i++) {
		if (slots[i].state == SLOT_RUNNING)
			curl_multi_remove_handle(s->multi, slots[i].easy);
		s3_xfer_clear(&slots[i].x);
		free(slots[i].x.scratch);
	}
	free(slots);
	return ret;
}

struct run1 {
	struct s3_xfer *x;
};

static int run1_prep(void *ctx, size_t i, struct s3_xfer *x)
{
	struct run1 *r = ctx;

	*x = *r->x;
	return 0;
}

static int run1_done(void *ctx, size_t i, struct s3_xfer *x)
{
	struct run1 *r = ctx;

	/* The answer goes back to the caller, who frees its memory (s3_xfer_clear). */
	*r->x = *x;
	x->hdrs = NULL;
	x->url = NULL;
	x->mem = NULL;
	return 0;
}

int s3_run1(struct halite_s3 *s, struct s3_xfer *x)
{
	struct run1 r = { .x = x };

	return s3_run(s, 1, run1_prep, run1_done, &r);
}
