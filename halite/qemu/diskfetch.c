// SPDX-License-Identifier: MIT
/*
 * A snapshot's frozen disks from the object store into this host's cache
 * (diskfetch.h): whole images, fetched once per host, checked on every use.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "s3.h"
#include "s3_disks.h"
#include "diskfetch.h"

static int seterr(char *err, size_t errlen, int ret, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int seterr(char *err, size_t errlen, int ret, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return ret;
}

/* @path a directory of ours (0700), made if missing; a link or a file there is refused. */
static int own_dir(const char *path, char *err, size_t errlen)
{
	struct stat st;

	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
	if (lstat(path, &st) < 0)
		return seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return seterr(err, errlen, -ENOTDIR, "%s: not a directory (the disks' cache)",
			      path);
	/* Another user could swap the images under us: as the LB cache, refused. */
	if (st.st_uid != geteuid() || (st.st_mode & 022))
		return seterr(err, errlen, -EPERM, "%s: the disks' cache must be a directory of "
			      "this user that no one else may write", path);
	return 0;
}

/* CACHE/disks/UUID, made: --cache-dir's, or a private one. */
static int cache_dir(struct hq_diskfetch *f, const uint8_t uuid[16], char *dir, size_t len,
		     char *err, size_t errlen)
{
	const char *c = getenv("HALITE_CACHE_DIR"), *td = getenv("TMPDIR");
	char u[33];
	int ret;

	if (c && *c) {
		char real[PATH_MAX];

		ret = own_dir(c, err, errlen);
		if (ret)
			return ret;
		/* Absolute: an overlay names its backing image by this path, from anywhere. */
		if (!realpath(c, real))
			return seterr(err, errlen, -errno, "%s: %s", c, strerror(errno));
		snprintf(f->root, sizeof(f->root), "%s", real);
	} else {
		snprintf(f->root, sizeof(f->root), "%s/halite-disks-XXXXXX", td && *td ? td : "/tmp");
		char real[PATH_MAX];

		if (!mkdtemp(f->root))
			return seterr(err, errlen, -errno, "%s: %s", f->root, strerror(errno));
		f->temp = true;
		/* As QEMU will name it (a $TMPDIR through a link): hq_disks_verify() compares. */
		if (realpath(f->root, real) && strlen(real) < sizeof(f->root))
			memcpy(f->root, real, strlen(real) + 1);
	}
	for (int i = 0; i < 16; i++)
		sprintf(u + 2 * i, "%02x", uuid[i]);
	if (snprintf(dir, len, "%s/disks/%s/N.qcow2.tmp-XXXXXX", f->root, u) >= (int)len)
		return seterr(err, errlen, -ENAMETOOLONG, "%s: too long a name for the disks' "
			      "cache", f->root);
	ret = snprintf(dir, len, "%s/disks", f->root) > 0 ? own_dir(dir, err, errlen) : -EINVAL;
	if (!ret && snprintf(dir, len, "%s/disks/%s", f->root, u) > 0)
		ret = own_dir(dir, err, errlen);
	return ret;
}

/* Disk @e into @path: the cached copy when whole and right, else from the store. */
static int bring_one(struct hq_diskfetch *f, struct halite_s3 *s, const char *key,
		     const struct halite_s3_disk *e, const char *path, char *err, size_t errlen)
{
	double t0 = halite_now_s();
	char why[512] = "";
	int ret;

	ret = halite_s3_disk_check(path, e, why, sizeof(why));
	if (!ret) {
		f->d[e->index].from = HQ_DISK_CACHE;
		f->d[e->index].seconds = halite_now_s() - t0;
		return 0;
	}
	if (ret == -EBADMSG) {
		/* A damaged copy is never used: it goes, and the store's replaces it. */
		f->d[e->index].damaged = true;
		if (unlink(path) < 0)
			return seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
	} else if (ret != -ENOENT) {
		return seterr(err, errlen, ret, "%s", why[0] ? why : strerror(-ret));
	}
	ret = halite_s3_disk_fetch(s, key, e, path);
	if (ret)
		return seterr(err, errlen, ret, "disk %u: %s", e->index, halite_s3_errmsg(s));
	f->d[e->index].from = HQ_DISK_STORE;
	f->d[e->index].bytes = e->size;
	f->d[e->index].seconds = halite_now_s() - t0;
	return 0;
}

static int bring_all(struct hq_diskfetch *f, struct halite_s3 *s, const char *key,
		     const uint8_t uuid[16], struct hq_disks *ds, char *err, size_t errlen)
{
	struct halite_s3_disks *m = calloc(1, sizeof(*m));
	char dir[HQ_PATH_MAX], path[HQ_PATH_MAX];
	int ret;

	if (!m)
		return seterr(err, errlen, -ENOMEM, "out of memory");
	ret = halite_s3_disks_get(s, key, uuid, m);
	if (ret == 1) {
		ret = 0; /* pushed without disks: they are this host's, as recorded */
		goto out;
	}
	if (ret) {
		seterr(err, errlen, ret, "%s", halite_s3_errmsg(s));
		goto out;
	}
	/* Every frozen disk is in the manifest, before anything is fetched. */
	for (int i = 0; i < ds->n; i++) {
		bool listed = false;

		for (uint32_t j = 0; j < m->n && !listed; j++)
			listed = m->d[j].index == (uint32_t)i;
		if (ds->d[i].frozen && !listed) {
			ret = seterr(err, errlen, -ENOENT, "disk %s of the snapshot is not in the "
				     "store's manifest (pushed with --no-disks?)", ds->d[i].name);
			goto out;
		}
		if (listed && !ds->d[i].frozen) {
			ret = seterr(err, errlen, -EPROTO, "the store's manifest lists disk %d, "
				     "which the snapshot did not freeze", i);
			goto out;
		}
	}
	ret = cache_dir(f, uuid, dir, sizeof(dir), err, errlen);
	for (uint32_t j = 0; j < m->n && !ret; j++) {
		const struct halite_s3_disk *e = &m->d[j];
		struct hq_disk *d = &ds->d[e->index];

		if (e->vsize != d->vsize) {
			ret = seterr(err, errlen, -EPROTO, "disk %s: the store's image is %llu "
				     "bytes to the guest, the snapshot's %llu", d->name,
				     (unsigned long long)e->vsize, (unsigned long long)d->vsize);
			break;
		}
		/* cache_dir() checked that the longest name fits. */
		if (snprintf(path, sizeof(path), "%s/%u.qcow2", dir, e->index) >= (int)sizeof(path))
			ret = seterr(err, errlen, -ENAMETOOLONG, "%s: name too long", dir);
		if (!ret)
			ret = bring_one(f, s, key, e, path, err, errlen);
		if (!ret)
			memcpy(d->local, path, sizeof(d->local));
	}
	f->used = !ret;
out:
	free(m);
	return ret;
}

int hq_diskfetch_bring(struct hq_diskfetch *f, const char *url, const uint8_t uuid[16],
		       struct hq_disks *ds, char *err, size_t errlen)
{
	struct halite_s3_config cfg;
	struct halite_s3_stats st;
	struct halite_s3 *s = NULL;
	char *bucket = NULL, *key = NULL;
	int ret;

	memset(f, 0, sizeof(*f));
	ret = halite_s3_parse_url(url, &bucket, &key, err, errlen);
	if (ret)
		return ret;
	ret = halite_s3_config_load(&cfg, err, errlen);
	if (!ret) {
		ret = halite_s3_open(&s, &cfg, bucket);
		halite_s3_config_clear(&cfg);
		if (ret)
			seterr(err, errlen, ret, "%s: %s", url, halite_strerror(ret));
	}
	if (!ret)
		ret = bring_all(f, s, key, uuid, ds, err, errlen);
	if (s) {
		halite_s3_get_stats(s, &st);
		f->requests = st.requests;
	}
	halite_s3_close(s);
	free(bucket);
	free(key);
	if (ret)
		for (int i = 0; i < ds->n; i++)
			ds->d[i].local[0] = '\0';
	return ret;
}

/* The private CACHE: disks/UUID/ with its images (and temporary files), then up. */
void hq_diskfetch_done(struct hq_diskfetch *f)
{
	char disks[PATH_MAX + 8];
	DIR *top, *sub;
	struct dirent *u, *e;

	if (!f->temp)
		return;
	snprintf(disks, sizeof(disks), "%s/disks", f->root);
	top = opendir(disks);
	while (top && (u = readdir(top))) {
		int dfd;

		if (u->d_name[0] == '.')
			continue;
		dfd = openat(dirfd(top), u->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		sub = dfd >= 0 ? fdopendir(dfd) : NULL;
		while (sub && (e = readdir(sub)))
			if (e->d_name[0] != '.')
				unlinkat(dirfd(sub), e->d_name, 0);
		if (sub)
			closedir(sub);
		else if (dfd >= 0)
			close(dfd);
		unlinkat(dirfd(top), u->d_name, AT_REMOVEDIR);
	}
	if (top)
		closedir(top);
	rmdir(disks);
	rmdir(f->root);
	f->temp = false;
}
