// SPDX-License-Identifier: MIT
/*
 * push and pull: a snapshot's frozen disks beside it in the store
 * (halite/s3/s3_disks.h says the layout).
 *
 * A push flattens each frozen image with its backing chain into one qcow2
 * (qemu-img convert), so no path of this host travels, in a private
 * directory of ours, uploads it, then the manifest; the caller uploads the
 * snapshot last. A pull brings them into FILE.disks/.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "inspect.h"
#include "s3cmd.h"
#include "s3_disks.h"

/* The snapshot's uuid and its qemu.disks record (malloc'd, NULL: none). 0 or an exit code. */
static int read_record(const char *path, uint8_t uuid[16], char **rec)
{
	HALITE_OPTS(halite_reader_opts, ro);
	struct halite_reader *r;
	const void *v;
	uint32_t len;
	int ret;

	*rec = NULL;
	ret = halite_reader_open(&r, path, &ro);
	if (ret < 0) {
		errorf("%s: %s", path, halite_strerror(ret));
		return EXIT_FAIL;
	}
	memcpy(uuid, halite_reader_info(r)->uuid, 16);
	if (!halite_reader_meta_find(r, "qemu.disks", &v, &len)) {
		*rec = strndup(v, len);
		if (!*rec) {
			halite_reader_free(r);
			errorf("out of memory");
			return EXIT_FAIL;
		}
	}
	halite_reader_free(r);
	return 0;
}

static const char *jstr(const cJSON *o, const char *k)
{
	const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));

	return s ? s : "";
}

/* A format of a disk image file (not a protocol, nor vvfat's directory). */
static bool disk_format_ok(const char *fmt)
{
	static const char *const ok[] = { "raw", "qcow2", "qed", "vmdk", "vdi", "vhdx", "vpc" };

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (!strcmp(fmt, ok[i]))
			return true;
	return false;
}

/*
 * Frozen disk @i of the record (@o) as the snapshot froze it: its image is
 * a regular file of the recorded size and modification time, as a restore
 * checks; an image written since would not match the snapshot's memory.
 */
static int check_image(const cJSON *o, int i, const char *path)
{
	const char *img = jstr(o, "image");
	struct stat st;
	uint64_t size = 0;
	int64_t mtime = 0;

	if (img[0] != '/' || halite_parse_u64(jstr(o, "size"), &size)) {
		errorf("%s: its record of disk %d is incomplete", path, i);
		return EXIT_BAD;
	}
	mtime = strtoll(jstr(o, "mtime_ns"), NULL, 10);
	errno = 0;
	if (stat(img, &st) < 0 || !S_ISREG(st.st_mode)) {
		errorf("%s: disk %d: its frozen image %s: %s (--no-disks pushes the snapshot "
		       "alone)", path, i, img, errno ? strerror(errno) : "not a regular file");
		return EXIT_FAIL;
	}
	/*
	 * The record names host files and a format, and push reads them with
	 * qemu-img (which follows the image's own backing files) and uploads
	 * what it read: only for the user whose files they are, so that no
	 * one can make another user's push, root's above all, upload a file
	 * they cannot read themselves. A format save never records (vvfat
	 * reads a directory tree) is refused likewise.
	 */
	if (st.st_uid != geteuid()) {
		errorf("%s: disk %d: its frozen image %s belongs to uid %u, not to this user: push "
		       "it as its owner (or --no-disks)", path, i, img, (unsigned)st.st_uid);
		return EXIT_FAIL;
	}
	if (!disk_format_ok(jstr(o, "format"))) {
		errorf("%s: disk %d: format '%s' is not a disk image format qemu-img flattens here "
		       "(raw, qcow2, qed, vmdk, vdi, vhdx, vpc)", path, i, jstr(o, "format"));
		return EXIT_BAD;
	}
	if ((uint64_t)st.st_size != size ||
	    (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec != mtime) {
		errorf("%s: disk %d: its frozen image %s was written after the snapshot (size or "
		       "modification time differ)", path, i, img);
		return EXIT_FAIL;
	}
	return 0;
}

static void disk_progress(void *ctx, uint64_t done, uint64_t total)
{
	progress_update(ctx, (int64_t)done, false);
}

/* Disk @i flattened into @tmp, uploaded, described in @e. 0 or an exit code. */
static int push_one(struct s3cmd *c, const cJSON *o, int i, const char *tmp, uint64_t part_size,
		    int progress, struct halite_s3_disk *e)
{
	HALITE_OPTS(halite_s3_upload_opts, uo);
	struct halite_s3_upload_result res;
	struct progress prog;
	char *dkey, why[1024], label[64];
	const char *fmt = jstr(o, "format"), *img = jstr(o, "image");
	uint64_t size;
	int fd, ret;

	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		errorf("%s: %s", tmp, strerror(errno));
		return EXIT_FAIL;
	}
	close(fd);
	/* -U: the source QEMU may still hold the image (read-only below its overlay). */
	if (halite_run((char *const[]){ "qemu-img", "convert", "-U", "-q", "-f", (char *)fmt,
					"-O", "qcow2", (char *)img, (char *)tmp, NULL },
		       NULL, 0, why, sizeof(why))) {
		errorf("disk %d: flattening %s with qemu-img convert: %s", i, img, why);
		return EXIT_FAIL;
	}
	fd = open(tmp, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || halite_s3_sha256_fd(fd, e->sha256, &size)) {
		errorf("%s: %s", tmp, strerror(errno));
		if (fd >= 0)
			close(fd);
		return EXIT_FAIL;
	}
	dkey = halite_s3_disk_key(c->key, i);
	if (!dkey) {
		close(fd);
		errorf("out of memory");
		return EXIT_FAIL;
	}
	snprintf(label, sizeof(label), "disk %d", i);
	progress_begin(&prog, progress, "push", label, (int64_t)size);
	uo.part_size = part_size;
	uo.progress = disk_progress;
	uo.progress_ctx = &prog;
	ret = halite_s3_upload_fd(c->s, dkey, fd, &uo, &res);
	close(fd);
	free(dkey);
	if (ret)
		return s3cmd_fail(c, ret);
	progress_update(&prog, (int64_t)res.bytes, true);
	e->index = (uint32_t)i;
	snprintf(e->name, sizeof(e->name), "%s", jstr(o, "device")[0] ? jstr(o, "device") :
		 jstr(o, "node"));
	e->vsize = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o,
										    "virtual_size"));
	e->size = res.bytes;
	snprintf(e->etag, sizeof(e->etag), "%s", res.etag);
	return 0;
}

static int put_manifest(struct s3cmd *c, const struct halite_s3_disks *m)
{
	char *json = halite_s3_disks_json(m), *mkey = halite_s3_disk_key(c->key, -1);
	int ret = json && mkey ? halite_s3_put(c->s, mkey, json, strlen(json)) : -ENOMEM;

	free(json);
	free(mkey);
	if (ret == -ENOMEM) {
		errorf("out of memory");
		return EXIT_FAIL;
	}
	return ret ? s3cmd_fail(c, ret) : 0;
}

int push_disks(struct s3cmd *c, const char *path, uint64_t part_size, int progress, cJSON *out)
{
	struct halite_s3_disks *m = calloc(1, sizeof(*m));
	char *rec = NULL, dir[PATH_MAX], tmp[PATH_MAX + 32];
	const char *td = getenv("TMPDIR");
	cJSON *a = NULL, *o;
	int ret, i = 0;

	if (!m) {
		errorf("out of memory");
		return EXIT_FAIL;
	}
	dir[0] = '\0';
	ret = read_record(path, m->uuid, &rec);
	if (ret || !rec)
		goto out;
	a = cJSON_Parse(rec);
	if (!cJSON_IsArray(a)) {
		errorf("%s: its qemu.disks is not a JSON array", path);
		ret = EXIT_BAD;
		goto out;
	}
	cJSON_ArrayForEach(o, a) {
		if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "frozen")) &&
		    (ret = check_image(o, i, path)))
			goto out;
		i++;
	}
	/* The flattened copies in a directory of ours (0700), never beside the user's files. */
	snprintf(dir, sizeof(dir), "%s/halite-push-XXXXXX", td && *td ? td : "/tmp");
	if (!mkdtemp(dir)) {
		errorf("%s: %s", dir, strerror(errno));
		dir[0] = '\0';
		ret = EXIT_FAIL;
		goto out;
	}
	i = 0;
	cJSON_ArrayForEach(o, a) {
		if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "frozen"))) {
			i++;
			continue;
		}
		if (m->n == HALITE_S3_DISKS_MAX || i >= HALITE_S3_DISKS_MAX) {
			errorf("%s: more than %d disks", path, HALITE_S3_DISKS_MAX);
			ret = EXIT_BAD;
			goto out;
		}
		snprintf(tmp, sizeof(tmp), "%s/%d.qcow2", dir, i);
		ret = push_one(c, o, i, tmp, part_size, progress, &m->d[m->n]);
		unlink(tmp);
		if (ret)
			goto out;
		if (out) {
			cJSON *j = cJSON_CreateObject();

			cJSON_AddNumberToObject(j, "index", i);
			json_add_u64(j, "bytes", m->d[m->n].size);
			cJSON_AddStringToObject(j, "etag", m->d[m->n].etag);
			cJSON_AddStringToObject(j, "sha256", m->d[m->n].sha256);
			cJSON_AddItemToArray(out, j);
		} else {
			notef("disk %d: %" PRIu64 " bytes (qcow2, flattened) to s3://%s/%s.disks/"
			      "%d.qcow2", i, m->d[m->n].size, c->bucket, c->key, i);
		}
		m->n++;
		i++;
	}
	if (!m->n)
		goto out;
	/* The manifest after every disk it lists, the snapshot (the caller's) after it. */
	ret = put_manifest(c, m);
out:
	if (dir[0])
		rmdir(dir);
	cJSON_Delete(a);
	free(rec);
	free(m);
	return ret;
}

/*
 * FILE.disks, made 0700 if missing; one that is not a directory of ours that
 * only we may write is refused: the images are renamed into it.
 */
static int disks_dir(const char *dir)
{
	struct stat st;

	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		errorf("%s: %s", dir, strerror(errno));
		return EXIT_FAIL;
	}
	if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
		errorf("%s: not a directory (pull keeps the snapshot's disks there)", dir);
		return EXIT_FAIL;
	}
	if (st.st_uid != geteuid() || (st.st_mode & 022)) {
		errorf("%s: another user's, or writable by others (pull keeps the snapshot's "
		       "disks there)", dir);
		return EXIT_FAIL;
	}
	return 0;
}

/* The manifest @m as @path (0600; a link there is not followed). */
static int write_manifest(const char *path, const struct halite_s3_disks *m)
{
	char *json = halite_s3_disks_json(m);
	int fd, ret = EXIT_FAIL;
	size_t n;

	if (!json) {
		errorf("out of memory");
		return EXIT_FAIL;
	}
	n = strlen(json);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0) {
		bool whole;

		errno = 0;
		whole = write(fd, json, n) == (ssize_t)n;

		/* close() either way, once: its error counts only after a whole write. */
		if (!close(fd) && whole)
			ret = 0;
	}
	if (ret)
		errorf("%s: %s", path, errno ? strerror(errno) : "short write");
	free(json);
	return ret;
}

int pull_disks(struct s3cmd *c, const char *file, int progress, cJSON *out)
{
	struct halite_s3_disks *m = calloc(1, sizeof(*m));
	char *rec = NULL, dir[PATH_MAX], dst[PATH_MAX + 32];
	int ret, r;

	if (!m) {
		errorf("out of memory");
		return EXIT_FAIL;
	}
	ret = read_record(file, m->uuid, &rec);
	if (ret)
		goto out;
	r = halite_s3_disks_get(c->s, c->key, m->uuid, m);
	if (r == 1 || (!r && !m->n))
		goto out; /* pushed without disks */
	if (r) {
		ret = s3cmd_fail(c, r);
		goto out;
	}
	snprintf(dir, sizeof(dir), "%s.disks", file);
	ret = disks_dir(dir);
	if (ret)
		goto out;
	for (uint32_t i = 0; i < m->n; i++) {
		const struct halite_s3_disk *e = &m->d[i];
		struct progress prog;
		char label[64];

		snprintf(dst, sizeof(dst), "%s/%u.qcow2", dir, e->index);
		snprintf(label, sizeof(label), "disk %u", e->index);
		progress_begin(&prog, progress, "pull", label, (int64_t)e->size);
		r = halite_s3_disk_fetch(c->s, c->key, e, dst);
		if (r) {
			ret = s3cmd_fail(c, r);
			goto out;
		}
		progress_update(&prog, (int64_t)e->size, true);
		if (out) {
			cJSON *j = cJSON_CreateObject();

			cJSON_AddNumberToObject(j, "index", e->index);
			cJSON_AddStringToObject(j, "file", dst);
			json_add_u64(j, "bytes", e->size);
			cJSON_AddItemToArray(out, j);
		} else {
			notef("%s: disk %u, %" PRIu64 " bytes", dst, e->index, e->size);
		}
	}
	/* The manifest too: FILE.disks/ says by itself what it holds. */
	snprintf(dst, sizeof(dst), "%s/manifest.json", dir);
	ret = write_manifest(dst, m);
out:
	free(rec);
	free(m);
	return ret;
}
