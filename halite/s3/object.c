// SPDX-License-Identifier: MIT
/*
 * Whole objects and byte ranges of them: HEAD, ranged GETs into the
 * caller's buffers (one or many at once, as a lazy restore will read a
 * snapshot's blocks), a GET into a file, a small PUT and a DELETE.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "s3_internal.h"

int halite_s3_head(struct halite_s3 *s, const char *key, struct halite_s3_object *o)
{
	struct s3_xfer x;
	int ret;

	s3_xfer_init(&x);
	x.method = "HEAD";
	x.key = key;
	ret = s3_run1(s, &x);
	if (!ret && !x.has_length)
		ret = s3_fail(s, -HALITE_S3_E_PROTOCOL, "HEAD s3://%s/%s: no Content-Length",
			      s->bucket, key);
	if (!ret) {
		o->size = x.content_length;
		snprintf(o->etag, sizeof(o->etag), "%s", x.etag);
	}
	s3_xfer_clear(&x);
	return ret;
}

struct ranges {
	const char *key, *etag;
	struct halite_s3_range *r;
};

static int range_prep(void *ctx, size_t i, struct s3_xfer *x)
{
	struct ranges *rs = ctx;

	x->method = "GET";
	x->key = rs->key;
	x->if_match = rs->etag;
	x->range = true;
	x->range_off = rs->r[i].off;
	x->range_len = rs->r[i].len;
	x->dst = rs->r[i].buf;
	x->dst_cap = rs->r[i].len;
	return 0;
}

static int range_done(void *ctx, size_t i, struct s3_xfer *x)
{
	struct ranges *rs = ctx;

	rs->r[i].got = x->got;
	return 0;
}

int halite_s3_get_ranges(struct halite_s3 *s, const char *key, struct halite_s3_range *r,
			 size_t n, const char *etag)
{
	struct ranges rs = { .key = key, .etag = etag, .r = r };

	for (size_t i = 0; i < n; i++) {
		if (!r[i].len)
			return s3_fail(s, -EINVAL, "GET s3://%s/%s: an empty range", s->bucket, key);
		r[i].got = 0;
	}
	return s3_run(s, n, range_prep, range_done, &rs);
}

int64_t halite_s3_get_range(struct halite_s3 *s, const char *key, uint64_t off, size_t len,
			    void *buf, const char *etag)
{
	struct halite_s3_range r = { .off = off, .len = len, .buf = buf };
	int ret = halite_s3_get_ranges(s, key, &r, 1, etag);

	return ret < 0 ? ret : (int64_t)r.got;
}

int halite_s3_get_to_fd(struct halite_s3 *s, const char *key, int fd,
			struct halite_s3_object *o)
{
	struct s3_xfer x;
	int ret;

	s3_xfer_init(&x);
	x.method = "GET";
	x.key = key;
	x.fd = fd;
	ret = s3_run1(s, &x);
	if (!ret && x.has_length && x.content_length != x.got)
		ret = s3_fail(s, -HALITE_S3_E_PROTOCOL,
			      "GET s3://%s/%s: %zu bytes came of the %llu announced", s->bucket,
			      key, x.got, (unsigned long long)x.content_length);
	if (!ret) {
		o->size = x.got;
		snprintf(o->etag, sizeof(o->etag), "%s", x.etag);
	}
	s3_xfer_clear(&x);
	return ret;
}

struct download {
	const char *key, *etag;
	int fd;
	uint64_t size, part_size, done;
};

static int download_prep(void *ctx, size_t i, struct s3_xfer *x)
{
	struct download *d = ctx;
	uint64_t off = i * d->part_size;

	if (!x->scratch && !(x->scratch = malloc(d->part_size)))
		return -ENOMEM;
	x->method = "GET";
	x->key = d->key;
	x->if_match = d->etag;
	x->range = true;
	x->range_off = off;
	x->range_len = d->size - off < d->part_size ? d->size - off : d->part_size;
	x->dst = x->scratch;
	x->dst_cap = x->range_len;
	return 0;
}

static int download_done(void *ctx, size_t i, struct s3_xfer *x)
{
	struct download *d = ctx;
	int ret;

	if (x->got != x->range_len)
		return s3_fail(x->s, -HALITE_S3_E_PROTOCOL,
			       "GET s3://%s/%s: %zu bytes at %llu, %llu asked for", x->s->bucket,
			       d->key, x->got, (unsigned long long)x->range_off,
			       (unsigned long long)x->range_len);
	ret = halite_pwrite_all(d->fd, x->dst, x->got, x->range_off);
	if (ret < 0)
		return s3_fail(x->s, ret, "writing the download: %s", strerror(-ret));
	d->done += x->got;
	if (x->s->progress)
		x->s->progress(x->s->progress_ctx, d->done);
	return 0;
}

int halite_s3_download_fd(struct halite_s3 *s, const char *key, int fd, uint64_t part_size,
			  struct halite_s3_object *o, uint64_t *parts)
{
	struct halite_s3_object head;
	struct download d = { .key = key, .fd = fd, .part_size = part_size ? part_size : 8u << 20 };
	int ret = halite_s3_head(s, key, &head);

	if (ret)
		return ret;
	d.etag = head.etag[0] ? head.etag : NULL;
	d.size = head.size;
	ret = s3_run(s, (size_t)((d.size + d.part_size - 1) / d.part_size), download_prep,
		     download_done, &d);
	if (ret)
		return ret;
	*o = head;
	*parts = (d.size + d.part_size - 1) / d.part_size;
	return 0;
}

int halite_s3_put(struct halite_s3 *s, const char *key, const void *buf, size_t len)
{
	struct s3_xfer x;
	int ret;

	s3_xfer_init(&x);
	x.method = "PUT";
	x.key = key;
	x.body = buf ? buf : "";
	x.body_len = len;
	x.md5 = true;
	ret = s3_run1(s, &x);
	s3_xfer_clear(&x);
	return ret;
}

int halite_s3_delete(struct halite_s3 *s, const char *key)
{
	struct s3_xfer x;
	int ret;

	s3_xfer_init(&x);
	x.method = "DELETE";
	x.key = key;
	ret = s3_run1(s, &x);
	s3_xfer_clear(&x);
	return ret;
}
