// SPDX-License-Identifier: MIT
/*
 * Multipart upload: create, upload parts (several at once, each with its
 * Content-MD5 so the store checks it), list what the store holds (to
 * resume), complete, abort.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3_internal.h"

/* "uploadId=ID" with ID encoded, and @extra ("partNumber=3&", sorted before it) first. */
static int upload_query(struct s3_xfer *x, const char *extra, const char *upload_id)
{
	char *id = s3_escape_query(upload_id);
	int n;

	if (!id)
		return -ENOMEM;
	n = snprintf(x->query, sizeof(x->query), "%suploadId=%s", extra, id);
	free(id);
	return n < (int)sizeof(x->query) ? 0 : -ENAMETOOLONG;
}

int halite_s3_mpu_create(struct halite_s3 *s, const char *key, char **upload_id)
{
	char id[1024];
	struct s3_xfer x;
	size_t pos = 0;
	int ret;

	s3_xfer_init(&x);
	x.method = "POST";
	x.key = key;
	/* "uploads=": the canonical form of the bare "uploads", which libcurl signs as written. */
	snprintf(x.query, sizeof(x.query), "uploads=");
	x.to_mem = true;
	ret = s3_run1(s, &x);
	if (!ret && s3_xml_tag(x.mem, x.mem_len, &pos, "UploadId", id, sizeof(id)))
		ret = s3_fail(s, -HALITE_S3_E_PROTOCOL,
			      "CreateMultipartUpload s3://%s/%s: no UploadId in the answer",
			      s->bucket, key);
	if (!ret && !(*upload_id = strdup(id)))
		ret = -ENOMEM;
	s3_xfer_clear(&x);
	return ret;
}

static int part_cmp(const void *a, const void *b)
{
	const struct halite_s3_part *pa = a, *pb = b;

	return pa->number < pb->number ? -1 : pa->number > pb->number;
}

/* The <Part> elements of one ListParts page appended to *@parts. */
static int parse_parts(struct halite_s3 *s, const char *xml, size_t len,
		       struct halite_s3_part **parts, size_t *n, size_t *cap)
{
	size_t pos = 0;
	char body[2048];

	while (!s3_xml_tag(xml, len, &pos, "Part", body, sizeof(body))) {
		struct halite_s3_part p = { 0 };
		char num[32] = "", size[32] = "";
		size_t bp = 0, bl = strlen(body);

		s3_xml_tag(body, bl, &bp, "PartNumber", num, sizeof(num));
		bp = 0;
		s3_xml_tag(body, bl, &bp, "ETag", p.etag, sizeof(p.etag));
		bp = 0;
		s3_xml_tag(body, bl, &bp, "Size", size, sizeof(size));
		p.number = (uint32_t)strtoul(num, NULL, 10);
		p.size = strtoull(size, NULL, 10);
		if (p.number < 1 || p.number > HALITE_S3_MAX_PARTS)
			return s3_fail(s, -HALITE_S3_E_PROTOCOL,
				       "ListParts: a part numbered '%s'", num);
		if (*n == *cap) {
			size_t c = *cap ? *cap * 2 : 64;
			struct halite_s3_part *np = realloc(*parts, c * sizeof(*np));

			if (!np)
				return -ENOMEM;
			*parts = np;
			*cap = c;
		}
		(*parts)[(*n)++] = p;
	}
	return 0;
}

int halite_s3_mpu_list(struct halite_s3 *s, const char *key, const char *upload_id,
		       struct halite_s3_part **parts_out, size_t *n_out)
{
	struct halite_s3_part *parts = NULL;
	size_t n = 0, cap = 0;
	char marker[32] = "0", truncated[16];
	int ret;

	/* A page holds up to 1000 parts; 10000 parts take ten pages, no more. */
	for (int page = 0; page <= HALITE_S3_MAX_PARTS / 1000; page++) {
		struct s3_xfer x;
		char extra[64];
		size_t pos = 0;

		s3_xfer_init(&x);
		x.method = "GET";
		x.key = key;
		x.to_mem = true;
		snprintf(extra, sizeof(extra), "part-number-marker=%s&", marker);
		ret = upload_query(&x, extra, upload_id);
		if (!ret)
			ret = s3_run1(s, &x);
		if (!ret)
			ret = parse_parts(s, x.mem, x.mem_len, &parts, &n, &cap);
		truncated[0] = 0;
		if (!ret) {
			s3_xml_tag(x.mem, x.mem_len, &pos, "IsTruncated", truncated,
				   sizeof(truncated));
			pos = 0;
			s3_xml_tag(x.mem, x.mem_len, &pos, "NextPartNumberMarker", marker,
				   sizeof(marker));
		}
		s3_xfer_clear(&x);
		if (ret)
			goto fail;
		if (strcmp(truncated, "true"))
			break;
	}
	if (n)
		qsort(parts, n, sizeof(*parts), part_cmp);
	*parts_out = parts;
	*n_out = n;
	return 0;
fail:
	/* radosgw (16.2) says NoSuchKey where S3 says NoSuchUpload: the upload is gone either way. */
	if (ret == -HALITE_S3_E_NO_SUCH_KEY)
		ret = -HALITE_S3_E_NO_SUCH_UPLOAD;
	free(parts);
	return ret;
}

int halite_s3_mpu_complete(struct halite_s3 *s, const char *key, const char *upload_id,
			   const struct halite_s3_part *parts, size_t n,
			   char etag[HALITE_S3_ETAG_MAX])
{
	size_t cap = 64 + n * (64 + HALITE_S3_ETAG_MAX), len = 0, pos = 0;
	char *doc = malloc(cap), code[128] = "", msg[256] = "";
	struct s3_xfer x;
	int ret;

	if (!doc)
		return -ENOMEM;
	len += (size_t)snprintf(doc + len, cap - len, "<CompleteMultipartUpload>");
	for (size_t i = 0; i < n; i++)
		len += (size_t)snprintf(doc + len, cap - len,
					"<Part><PartNumber>%" PRIu32 "</PartNumber><ETag>%s</ETag></Part>",
					parts[i].number, parts[i].etag);
	len += (size_t)snprintf(doc + len, cap - len, "</CompleteMultipartUpload>");

	s3_xfer_init(&x);
	x.method = "POST";
	x.key = key;
	x.body = doc;
	x.body_len = len;
	x.to_mem = true;
	ret = upload_query(&x, "", upload_id);
	if (!ret)
		ret = s3_run1(s, &x);
	/* S3 may answer 200 and then report a failure in the body: <Error>, not <CompleteMultipartUploadResult>. */
	if (!ret && x.mem && strstr(x.mem, "<Error>")) {
		s3_xml_tag(x.mem, x.mem_len, &pos, "Code", code, sizeof(code));
		pos = 0;
		s3_xml_tag(x.mem, x.mem_len, &pos, "Message", msg, sizeof(msg));
		ret = s3_fail(s, -HALITE_S3_E_STORE,
			      "CompleteMultipartUpload s3://%s/%s: %s: %s", s->bucket, key, code, msg);
	}
	if (!ret) {
		pos = 0;
		etag[0] = 0;
		if (s3_xml_tag(x.mem, x.mem_len, &pos, "ETag", etag, HALITE_S3_ETAG_MAX))
			snprintf(etag, HALITE_S3_ETAG_MAX, "%s", x.etag);
	}
	s3_xfer_clear(&x);
	free(doc);
	/* radosgw (16.2) answers with an empty <ETag>: the object's own, from a HEAD. */
	if (!ret && !etag[0]) {
		struct halite_s3_object o;

		ret = halite_s3_head(s, key, &o);
		if (!ret)
			snprintf(etag, HALITE_S3_ETAG_MAX, "%s", o.etag);
	}
	return ret;
}

int halite_s3_mpu_abort(struct halite_s3 *s, const char *key, const char *upload_id)
{
	struct s3_xfer x;
	int ret;

	s3_xfer_init(&x);
	x.method = "DELETE";
	x.key = key;
	ret = upload_query(&x, "", upload_id);
	if (!ret)
		ret = s3_run1(s, &x);
	s3_xfer_clear(&x);
	return ret;
}

struct parts_run {
	const char *key, *upload_id;
	struct halite_s3_part *parts;
	const struct halite_s3_part_cb *cb;
	size_t max_size;
};

static int part_prep(void *ctx, size_t i, struct s3_xfer *x)
{
	struct parts_run *pr = ctx;
	char extra[48];
	int ret;

	/* The slot's buffer, the size of the largest part, reused for each part it sends. */
	if (!x->scratch && !(x->scratch = malloc(pr->max_size ? pr->max_size : 1)))
		return -ENOMEM;
	ret = pr->cb->fill(pr->cb->ctx, i, x->scratch);
	if (ret < 0)
		return ret;
	x->method = "PUT";
	x->key = pr->key;
	x->body = x->scratch;
	x->body_len = pr->parts[i].size;
	x->md5 = true;
	snprintf(extra, sizeof(extra), "partNumber=%" PRIu32 "&", pr->parts[i].number);
	return upload_query(x, extra, pr->upload_id);
}

static int part_done(void *ctx, size_t i, struct s3_xfer *x)
{
	struct parts_run *pr = ctx;

	if (!x->etag[0])
		return s3_fail(x->s, -HALITE_S3_E_PROTOCOL, "UploadPart s3://%s/%s part %" PRIu32
			       ": no ETag in the answer", x->s->bucket, pr->key, pr->parts[i].number);
	snprintf(pr->parts[i].etag, sizeof(pr->parts[i].etag), "%s", x->etag);
	return pr->cb->done ? pr->cb->done(pr->cb->ctx, i) : 0;
}

int halite_s3_mpu_upload_parts(struct halite_s3 *s, const char *key, const char *upload_id,
			       struct halite_s3_part *parts, size_t n,
			       const struct halite_s3_part_cb *cb)
{
	struct parts_run pr = { .key = key, .upload_id = upload_id, .parts = parts, .cb = cb };

	for (size_t i = 0; i < n; i++)
		if (parts[i].size > pr.max_size)
			pr.max_size = parts[i].size;
	return s3_run(s, n, part_prep, part_done, &pr);
}
