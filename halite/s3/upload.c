// SPDX-License-Identifier: MIT
/*
 * A file uploaded as one object, resumably: a multipart upload whose id is
 * kept in a small state file, so that a run after an interruption asks the
 * store which parts it holds (ListParts) and sends only the others.
 *
 * The state file is text, one "NAME VALUE" a line:
 *
 *   halite-s3-upload 1
 *   url s3://BUCKET/KEY
 *   size BYTES           the source's size and mtime when the upload began:
 *   mtime SEC.NSEC       a source changed since is uploaded anew
 *   part_size BYTES
 *   upload_id ID
 *
 * It holds no path, and is written 0600 without following a symlink. A part
 * the store lists is kept only if its size and MD5 (the ETag S3 gives a
 * part) match the source's bytes, so a wrong state file costs a re-upload,
 * never a wrong object.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "s3_internal.h"

#define DEFAULT_PART_SIZE (8ull << 20)
#define STATE_MAX 4096

struct upload {
	struct halite_s3 *s;
	const char *key;
	int fd;
	const struct halite_s3_upload_opts *o;
	uint64_t size, part_size, nparts;
	char mtime[48];
	char url[1200];
	struct halite_s3_part *all;	/* every part, by number - 1 */
	struct halite_s3_part *todo;	/* the ones to send */
	uint64_t bytes_done, sent;
};

static int read_part(struct upload *u, uint32_t number, void *buf, uint64_t len)
{
	uint64_t off = (uint64_t)(number - 1) * u->part_size, got = 0;

	while (got < len) {
		ssize_t r = pread(u->fd, (char *)buf + got, len - got, (off_t)(off + got));

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return s3_fail(u->s, r < 0 ? -errno : -EIO,
				       "reading the source at %" PRIu64 ": %s", off + got,
				       r < 0 ? strerror(errno) : "the file is shorter than it was");
		got += (uint64_t)r;
	}
	return 0;
}

/* ---- the state file ---- */

static int state_write(struct upload *u, const char *upload_id)
{
	char buf[STATE_MAX];
	int n, fd, ret = 0;

	n = snprintf(buf, sizeof(buf),
		     "halite-s3-upload 1\nurl %s\nsize %" PRIu64 "\nmtime %s\npart_size %" PRIu64
		     "\nupload_id %s\n", u->url, u->size, u->mtime, u->part_size, upload_id);
	if (n >= (int)sizeof(buf))
		return s3_fail(u->s, -ENAMETOOLONG, "%s: the upload id is too long",
			       u->o->state_path);
	fd = open(u->o->state_path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return s3_fail(u->s, -errno, "%s: %s", u->o->state_path, strerror(errno));
	/* An older file keeps its mode through O_TRUNC: the state is 0600 whatever it was. */
	if (fchmod(fd, 0600) < 0 || (ret = halite_pwrite_all(fd, buf, (size_t)n, 0)) < 0 ||
	    fsync(fd) < 0) {
		ret = ret ? ret : -errno;
		s3_fail(u->s, ret, "%s: %s", u->o->state_path, strerror(-ret));
	}
	close(fd);
	return ret;
}

/* "NAME VALUE" of @name in @buf, into @out. */
static bool state_field(const char *buf, const char *name, char *out, size_t len)
{
	size_t nl = strlen(name);

	for (const char *l = buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		const char *end = strchrnul(l, '\n');

		if ((size_t)(end - l) > nl && !strncmp(l, name, nl) && l[nl] == ' ') {
			snprintf(out, len, "%.*s", (int)(end - l - (long)nl - 1), l + nl + 1);
			return true;
		}
	}
	return false;
}

/*
 * The upload id of a state file for this very upload, malloc'd, in *@id
 * (NULL when there is none, or it is for another source or part size);
 * *@stale the id of one for an older upload of the same URL, to abort.
 */
static int state_read(struct upload *u, char **id, char **stale)
{
	char buf[STATE_MAX], v[1200], want[48];
	ssize_t n;
	int fd;

	*id = *stale = NULL;
	fd = open(u->o->state_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : s3_fail(u->s, -errno, "%s: %s", u->o->state_path,
						     strerror(errno));
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return s3_fail(u->s, -errno, "%s: %s", u->o->state_path, strerror(errno));
	buf[n] = 0;
	/* Not ours, or from another version: start over, as without one. */
	if (strncmp(buf, "halite-s3-upload 1\n", 19) || !state_field(buf, "upload_id", v, sizeof(v)) ||
	    !v[0])
		return 0;
	{
		char url[1200], size[32], mtime[48], ps[32];
		bool same_url = state_field(buf, "url", url, sizeof(url)) && !strcmp(url, u->url);
		char **dst;

		snprintf(want, sizeof(want), "%" PRIu64, u->size);
		snprintf(ps, sizeof(ps), "%" PRIu64, u->part_size);
		dst = same_url && state_field(buf, "size", size, sizeof(size)) &&
		      !strcmp(size, want) && state_field(buf, "mtime", mtime, sizeof(mtime)) &&
		      !strcmp(mtime, u->mtime) &&
		      state_field(buf, "part_size", want, sizeof(want)) && !strcmp(want, ps) ?
			      id : same_url ? stale : NULL;
		if (dst && !(*dst = strdup(v)))
			return -ENOMEM;
	}
	return 0;
}

/* ---- the parts ---- */

static int fill_part(void *ctx, size_t i, void *buf)
{
	struct upload *u = ctx;

	return read_part(u, u->todo[i].number, buf, u->todo[i].size);
}

static int part_sent(void *ctx, size_t i)
{
	struct upload *u = ctx;

	u->all[u->todo[i].number - 1] = u->todo[i];
	u->sent++;
	u->bytes_done += u->todo[i].size;
	if (u->o->progress)
		u->o->progress(u->o->progress_ctx, u->bytes_done, u->size);
	if (u->o->stop_after_parts && u->sent >= u->o->stop_after_parts)
		return s3_fail(u->s, -EINTR, "stopped after %" PRIu64 " parts, as asked (a test's "
			       "fault injection)", u->sent);
	return 0;
}

/* A part the store lists, kept if it is the source's: same size and MD5. */
static int keep_listed(struct upload *u, const struct halite_s3_part *p, void *buf, bool *keep)
{
	const struct halite_s3_part *want = &u->all[p->number - 1];
	char hex[40], quoted[44];
	int ret;

	*keep = false;
	if (p->number > u->nparts || p->size != want->size)
		return 0;
	ret = read_part(u, p->number, buf, p->size);
	if (ret)
		return ret;
	s3_md5(buf, p->size, NULL, hex);
	snprintf(quoted, sizeof(quoted), "\"%s\"", hex);
	*keep = !strcmp(p->etag, quoted) || !strcmp(p->etag, hex);
	return 0;
}

/* Marks the parts the store has (etag set); 1 if any, 0 if none, or < 0. */
static int resume(struct upload *u, const char *upload_id)
{
	struct halite_s3_part *listed = NULL;
	size_t n = 0;
	void *buf = NULL;
	int ret, kept = 0;

	ret = halite_s3_mpu_list(u->s, u->key, upload_id, &listed, &n);
	if (ret)
		return ret;
	if (n && !(buf = malloc(u->part_size))) {
		free(listed);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n && !ret; i++) {
		bool keep;

		ret = keep_listed(u, &listed[i], buf, &keep);
		if (!ret && keep) {
			u->all[listed[i].number - 1] = listed[i];
			u->bytes_done += listed[i].size;
			kept = 1;
		}
	}
	free(buf);
	free(listed);
	return ret ? ret : kept;
}

static int upload_small(struct upload *u, struct halite_s3_upload_result *res)
{
	void *buf = malloc(u->size ? u->size : 1);
	struct s3_xfer x;
	int ret;

	if (!buf)
		return -ENOMEM;
	ret = read_part(u, 1, buf, u->size);
	if (!ret) {
		s3_xfer_init(&x);
		x.method = "PUT";
		x.key = u->key;
		x.body = buf;
		x.body_len = u->size;
		x.md5 = true;
		ret = s3_run1(u->s, &x);
		if (!ret)
			snprintf(res->etag, sizeof(res->etag), "%s", x.etag);
		s3_xfer_clear(&x);
	}
	free(buf);
	if (!ret) {
		res->parts = 1;
		res->parts_sent = 1;
	}
	return ret;
}

static int upload_multipart(struct upload *u, struct halite_s3_upload_result *res)
{
	char *id = NULL, *stale = NULL;
	size_t ntodo = 0;
	int ret = 0;

	if (u->o->state_path)
		ret = state_read(u, &id, &stale);
	if (ret)
		return ret;
	/* An older upload of this URL, for a source since changed: its parts are garbage. */
	if (stale)
		halite_s3_mpu_abort(u->s, u->key, stale);
	free(stale);
	if (id) {
		ret = resume(u, id);
		if (ret == -HALITE_S3_E_NO_SUCH_UPLOAD) {
			free(id);
			id = NULL;
			ret = 0;
		}
		res->resumed = ret > 0;
		ret = ret < 0 ? ret : 0;
	}
	if (!ret && !id) {
		ret = halite_s3_mpu_create(u->s, u->key, &id);
		if (!ret && u->o->state_path)
			ret = state_write(u, id);
	}
	if (ret)
		goto out;
	for (uint64_t i = 0; i < u->nparts; i++)
		if (!u->all[i].etag[0])
			u->todo[ntodo++] = u->all[i];
	struct halite_s3_part_cb cb = { .fill = fill_part, .done = part_sent, .ctx = u };

	ret = halite_s3_mpu_upload_parts(u->s, u->key, id, u->todo, ntodo, &cb);
	if (!ret)
		ret = halite_s3_mpu_complete(u->s, u->key, id, u->all, u->nparts, res->etag);
	if (!ret && u->o->state_path && unlink(u->o->state_path) < 0 && errno != ENOENT)
		ret = s3_fail(u->s, -errno, "%s: %s", u->o->state_path, strerror(errno));
	res->parts = u->nparts;
	res->parts_sent = u->sent;
out:
	free(id);
	return ret;
}

int halite_s3_upload_fd(struct halite_s3 *s, const char *key, int fd,
			const struct halite_s3_upload_opts *opts,
			struct halite_s3_upload_result *res)
{
	struct upload u = { .s = s, .key = key, .fd = fd, .o = opts };
	struct stat st;
	int ret;

	if (!opts || opts->sz < sizeof(*opts))
		return s3_fail(s, -EINVAL, "upload: options of an unknown size");
	memset(res, 0, sizeof(*res));
	if (fstat(fd, &st) < 0)
		return s3_fail(s, -errno, "upload: %s", strerror(errno));
	if (!S_ISREG(st.st_mode))
		return s3_fail(s, -EINVAL, "upload: the source is not a regular file");
	u.size = (uint64_t)st.st_size;
	snprintf(u.mtime, sizeof(u.mtime), "%lld.%09ld", (long long)st.st_mtim.tv_sec,
		 st.st_mtim.tv_nsec);
	snprintf(u.url, sizeof(u.url), "s3://%s/%s", s->bucket, key);
	u.part_size = opts->part_size ? opts->part_size : DEFAULT_PART_SIZE;
	while ((u.size + u.part_size - 1) / u.part_size > HALITE_S3_MAX_PARTS)
		u.part_size *= 2;
	res->bytes = u.size;
	res->part_size = u.part_size;
	if (u.size <= u.part_size)
		return upload_small(&u, res);

	u.nparts = (u.size + u.part_size - 1) / u.part_size;
	u.all = calloc(u.nparts, sizeof(*u.all));
	u.todo = calloc(u.nparts, sizeof(*u.todo));
	if (!u.all || !u.todo) {
		ret = s3_fail(s, -ENOMEM, "out of memory");
		goto out;
	}
	for (uint64_t i = 0; i < u.nparts; i++) {
		u.all[i].number = (uint32_t)(i + 1);
		u.all[i].size = i + 1 < u.nparts ? u.part_size : u.size - i * u.part_size;
	}
	ret = upload_multipart(&u, res);
out:
	free(u.all);
	free(u.todo);
	return ret;
}
