/* SPDX-License-Identifier: MIT */
/* Private to halite/s3: the request engine and the helpers its files share. */
#ifndef HALITE_S3_INTERNAL_H
#define HALITE_S3_INTERNAL_H

#include <curl/curl.h>

#include "s3.h"

#define S3_ERRMSG_MAX 512
/* The most a response body we parse (XML) or keep for an error may be. */
#define S3_XML_MAX (16u << 20)
#define S3_ERRBODY_MAX (64u << 10)

struct halite_s3 {
	struct halite_s3_config cfg;
	char *bucket;
	char *base;		/* "http://host:port/bucket" or "https://bucket.host" */
	char *sigv4;		/* "aws:amz:REGION:s3" */
	char *userpwd;		/* "ACCESS:SECRET" */
	CURLM *multi;		/* its connection cache keeps connections alive */
	CURL **easy;		/* one per slot, reused */
	unsigned jobs, nslots;
	bool debug;		/* HALITE_S3_DEBUG=1 */
	uint32_t rnd;		/* xorshift state for the jitter */
	struct halite_s3_stats stats;
	void (*progress)(void *ctx, uint64_t bytes);
	void *progress_ctx;
	char errmsg[S3_ERRMSG_MAX];
};

/* One HTTP request and what came back. */
struct s3_xfer {
	/* The request, set by the caller. */
	const char *method;		/* "GET", "HEAD", "PUT", "POST", "DELETE" */
	const char *key;
	char query[512];		/* sorted and encoded, or "" */
	const void *body;
	size_t body_len;
	bool md5;			/* send Content-MD5 of the body */
	const char *content_md5;	/* or this one (tests: a wrong digest) */
	const char *if_match;
	bool range;
	uint64_t range_off, range_len;
	/* Where a 2xx body goes: a buffer, a file descriptor, or @mem (XML). */
	void *dst;
	size_t dst_cap;
	int fd;				/* -1: none */
	bool to_mem;

	/* The answer, set by the engine. */
	long status;
	uint64_t content_length;
	bool has_length;
	char etag[HALITE_S3_ETAG_MAX];
	size_t got;			/* body bytes kept */
	char *mem;
	size_t mem_len, mem_cap;
	int werr;			/* the write callback's failure */

	/* The engine's own. */
	struct halite_s3 *s;
	struct curl_slist *hdrs;
	char *url;
	unsigned attempts;
	double first_try;		/* its first attempt (halite_now_s()) */
	double not_before;
	void *scratch;			/* the caller's per-slot buffer, kept between requests */
};

/*
 * Runs @n requests with at most the handle's jobs in flight. @prep fills
 * request i in a zeroed xfer (fd = -1; scratch is the slot's, kept) before
 * its first attempt; @done takes a successful one (2xx). Failed requests
 * are retried as docs/object-store.md says. Returns 0, the first failure's
 * code (errmsg set), or what @prep or @done returned (< 0).
 */
int s3_run(struct halite_s3 *s, size_t n, int (*prep)(void *ctx, size_t i, struct s3_xfer *x),
	   int (*done)(void *ctx, size_t i, struct s3_xfer *x), void *ctx);
/* One request: s3_run() of one, @x set by the caller. */
int s3_run1(struct halite_s3 *s, struct s3_xfer *x);
void s3_xfer_init(struct s3_xfer *x);
void s3_xfer_clear(struct s3_xfer *x);	/* frees what the engine allocated */

/* errmsg from a format; returns @err. */
int s3_fail(struct halite_s3 *s, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The request's object URL part: "/KEY" with every byte outside RFC 3986's unreserved set and '/' escaped. */
char *s3_escape_key(const char *key);
/* @s percent-encoded for a query value: everything but unreserved. */
char *s3_escape_query(const char *s);

/*
 * The text of the first <@tag>...</@tag> in @xml (@len bytes) after
 * *@pos, entities decoded, into @out (cut to @outlen). *@pos moves past
 * it. 0, or -ENOENT when there is none.
 */
int s3_xml_tag(const char *xml, size_t len, size_t *pos, const char *tag, char *out,
	       size_t outlen);

/* MD5 of @len bytes as base64 (Content-MD5) and hex (an ETag), SHA-256 as hex. */
void s3_md5(const void *buf, size_t len, char b64[32], char hex[40]);
void s3_sha256_hex(const void *buf, size_t len, char hex[72]);
/* @n bytes of @d as lowercase hex into @hex (2 * @n + 1 bytes). */
void s3_hex(const unsigned char *d, unsigned n, char *hex);

#endif
