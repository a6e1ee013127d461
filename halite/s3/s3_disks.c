// SPDX-License-Identifier: MIT
/*
 * A snapshot's frozen disks in the store (disks.h): the manifest written
 * and read back, and one disk brought whole into a local file that is
 * checked before anyone may use it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "s3_internal.h"
#include "s3_disks.h"

#define MANIFEST_VERSION 1

char *halite_s3_disk_key(const char *key, int index)
{
	char *k;
	int n = index < 0 ? asprintf(&k, "%s.disks/manifest.json", key) :
			    asprintf(&k, "%s.disks/%d.qcow2", key, index);

	return n < 0 ? NULL : k;
}

static void add_u64(cJSON *o, const char *k, uint64_t v)
{
	char s[24];

	snprintf(s, sizeof(s), "%" PRIu64, v);
	cJSON_AddStringToObject(o, k, s);
}

char *halite_s3_disks_json(const struct halite_s3_disks *m)
{
	cJSON *root = cJSON_CreateObject(), *a;
	char u[33], *s = NULL;

	if (!root)
		return NULL;
	s3_hex(m->uuid, 16, u);
	cJSON_AddNumberToObject(root, "halite_disks", MANIFEST_VERSION);
	cJSON_AddStringToObject(root, "snapshot_uuid", u);
	a = cJSON_AddArrayToObject(root, "disks");
	for (uint32_t i = 0; a && i < m->n; i++) {
		const struct halite_s3_disk *e = &m->d[i];
		cJSON *o = cJSON_CreateObject();

		if (!o)
			goto out;
		cJSON_AddItemToArray(a, o);
		cJSON_AddNumberToObject(o, "index", e->index);
		cJSON_AddStringToObject(o, "name", e->name);
		cJSON_AddStringToObject(o, "format", "qcow2");
		add_u64(o, "virtual_size", e->vsize);
		add_u64(o, "size", e->size);
		cJSON_AddStringToObject(o, "etag", e->etag);
		cJSON_AddStringToObject(o, "sha256", e->sha256);
	}
	if (a)
		s = cJSON_Print(root);
out:
	cJSON_Delete(root);
	return s;
}

static int bad(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(err, errlen, "the disks' manifest: ");

	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < errlen)
		vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return -EPROTO;
}

static bool is_hex(const char *s, size_t n)
{
	if (!s || strlen(s) != n)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* A decimal string of a 64-bit value, into *v. */
static bool get_u64(const cJSON *o, const char *k, uint64_t *v)
{
	const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));

	return s && !halite_parse_u64(s, v);
}

static int parse_disk(const cJSON *o, struct halite_s3_disk *e, char *err, size_t errlen)
{
	const cJSON *idx = cJSON_GetObjectItemCaseSensitive(o, "index");
	const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "name"));
	const char *fmt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "format"));
	const char *etag = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "etag"));
	const char *sha = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "sha256"));
	double v = cJSON_GetNumberValue(idx);

	if (!cJSON_IsNumber(idx) || v < 0 || v >= HALITE_S3_DISKS_MAX || v != (double)(int)v)
		return bad(err, errlen, "a disk's index is not a whole number below %d",
			   HALITE_S3_DISKS_MAX);
	e->index = (uint32_t)v;
	if (!name || strlen(name) >= sizeof(e->name))
		return bad(err, errlen, "disk %u has no name or one too long", e->index);
	if (!fmt || strcmp(fmt, "qcow2"))
		return bad(err, errlen, "disk %u is not qcow2", e->index);
	if (!get_u64(o, "virtual_size", &e->vsize) || !e->vsize || !get_u64(o, "size", &e->size) ||
	    !e->size)
		return bad(err, errlen, "disk %u: its sizes are not decimal strings above 0",
			   e->index);
	if (!etag || !etag[0] || strlen(etag) >= sizeof(e->etag))
		return bad(err, errlen, "disk %u has no ETag or one too long", e->index);
	if (!is_hex(sha, 64))
		return bad(err, errlen, "disk %u: its sha256 is not 64 lowercase hex digits",
			   e->index);
	snprintf(e->name, sizeof(e->name), "%s", name);
	snprintf(e->etag, sizeof(e->etag), "%s", etag);
	memcpy(e->sha256, sha, 65);
	return 0;
}

int halite_s3_disks_parse(const char *json, size_t len, struct halite_s3_disks *m, char *err,
			  size_t errlen)
{
	cJSON *root = cJSON_ParseWithLength(json, len), *o;
	const char *u;
	uint32_t seen = 0;
	int ret = 0;

	memset(m, 0, sizeof(*m));
	if (!cJSON_IsObject(root)) {
		ret = bad(err, errlen, "not a JSON object");
		goto out;
	}
	if (cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(root, "halite_disks")) !=
	    MANIFEST_VERSION) {
		ret = bad(err, errlen, "not version %d (halite_disks)", MANIFEST_VERSION);
		goto out;
	}
	u = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "snapshot_uuid"));
	if (!is_hex(u, 32)) {
		ret = bad(err, errlen, "snapshot_uuid is not 32 lowercase hex digits");
		goto out;
	}
	for (int i = 0; i < 16; i++)
		sscanf(u + 2 * i, "%2hhx", &m->uuid[i]);
	o = cJSON_GetObjectItemCaseSensitive(root, "disks");
	if (!cJSON_IsArray(o)) {
		ret = bad(err, errlen, "no disks array");
		goto out;
	}
	cJSON_ArrayForEach(o, o) {
		struct halite_s3_disk *e = &m->d[m->n];

		if (m->n == HALITE_S3_DISKS_MAX) {
			ret = bad(err, errlen, "more than %d disks", HALITE_S3_DISKS_MAX);
			break;
		}
		ret = parse_disk(o, e, err, errlen);
		if (ret)
			break;
		if (seen & (1u << e->index)) {
			ret = bad(err, errlen, "disk %u is listed twice", e->index);
			break;
		}
		seen |= 1u << e->index;
		m->n++;
	}
out:
	cJSON_Delete(root);
	return ret;
}

int halite_s3_disks_get(struct halite_s3 *s, const char *key, const uint8_t uuid[16],
			struct halite_s3_disks *m)
{
	struct halite_s3_object o;
	char *mkey = halite_s3_disk_key(key, -1), *buf = NULL, why[256];
	int64_t got;
	int ret;

	if (!mkey)
		return -ENOMEM;
	ret = halite_s3_head(s, mkey, &o);
	if (ret == -HALITE_S3_E_NO_SUCH_KEY) {
		ret = 1;
		goto out;
	}
	if (ret)
		goto out;
	if (!o.size || o.size > HALITE_S3_MANIFEST_MAX) {
		ret = s3_fail(s, -EPROTO, "s3://%s/%s: %" PRIu64 " bytes, not a disks' manifest "
			      "(at most %u)", s->bucket, mkey, o.size, HALITE_S3_MANIFEST_MAX);
		goto out;
	}
	buf = malloc(o.size);
	if (!buf) {
		ret = -ENOMEM;
		goto out;
	}
	got = halite_s3_get_range(s, mkey, 0, o.size, buf, o.etag[0] ? o.etag : NULL);
	if (got < 0) {
		ret = (int)got;
		goto out;
	}
	ret = halite_s3_disks_parse(buf, (size_t)got, m, why, sizeof(why));
	if (ret) {
		s3_fail(s, ret, "s3://%s/%s: %s", s->bucket, mkey, why);
		goto out;
	}
	if (memcmp(m->uuid, uuid, 16))
		ret = s3_fail(s, -ESTALE, "s3://%s/%s lists the disks of another snapshot (a "
			      "push to s3://%s/%s under way?)", s->bucket, mkey, s->bucket, key);
out:
	free(buf);
	free(mkey);
	return ret;
}

int halite_s3_disk_check(const char *path, const struct halite_s3_disk *e, char *err,
			 size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	char sha[65];
	uint64_t size;
	int ret;

	if (fd < 0)
		return -errno;
	ret = halite_s3_sha256_fd(fd, sha, &size);
	close(fd);
	if (ret) {
		snprintf(err, errlen, "%s: %s", path, strerror(-ret));
		return ret;
	}
	if (size != e->size) {
		snprintf(err, errlen, "%s is %" PRIu64 " bytes, disk %u of the manifest %" PRIu64,
			 path, size, e->index, e->size);
		return -EBADMSG;
	}
	if (strcmp(sha, e->sha256)) {
		snprintf(err, errlen, "%s: its SHA-256 is not that of disk %u in the manifest "
			 "(the copy is damaged)", path, e->index);
		return -EBADMSG;
	}
	return 0;
}

int halite_s3_disk_fetch(struct halite_s3 *s, const char *key, const struct halite_s3_disk *e,
			 const char *path)
{
	struct halite_s3_object o;
	char *dkey = halite_s3_disk_key(key, (int)e->index), *tmp = NULL, why[512];
	uint64_t parts;
	int fd = -1, ret;

	if (!dkey || asprintf(&tmp, "%s.tmp-XXXXXX", path) < 0) {
		tmp = NULL;
		ret = -ENOMEM;
		goto out;
	}
	/* mkostemp: 0600 and O_EXCL, so nothing planted at the name is followed. */
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		ret = s3_fail(s, -errno, "%s: %s", tmp, strerror(errno));
		free(tmp);
		tmp = NULL;
		goto out;
	}
	ret = halite_s3_download_fd(s, dkey, fd, 0, &o, &parts);
	if (ret)
		goto out;
	/* The download's ranges were all of the object its HEAD saw: that must be the manifest's. */
	if (strcmp(o.etag, e->etag)) {
		ret = s3_fail(s, -ESTALE, "s3://%s/%s has ETag %s, the manifest says %s: the disk "
			      "was replaced after its snapshot was pushed", s->bucket, dkey, o.etag,
			      e->etag);
		goto out;
	}
	if (ftruncate(fd, (off_t)o.size) < 0 || fsync(fd) < 0) {
		ret = s3_fail(s, -errno, "%s: %s", tmp, strerror(errno));
		goto out;
	}
	ret = halite_s3_disk_check(tmp, e, why, sizeof(why));
	if (ret) {
		s3_fail(s, ret, "s3://%s/%s: %s", s->bucket, dkey, why);
		goto out;
	}
	if (rename(tmp, path) < 0) {
		ret = s3_fail(s, -errno, "%s: %s", path, strerror(errno));
		goto out;
	}
	free(tmp);
	tmp = NULL;
out:
	if (fd >= 0)
		close(fd);
	if (tmp)
		unlink(tmp);
	free(tmp);
	free(dkey);
	return ret;
}
