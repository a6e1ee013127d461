// SPDX-License-Identifier: MIT
/*
 * The host's LB cache (lbcache.h): one file per entry in a directory that
 * every process on the host shares.
 *
 * Layout of DIR (created 0700, every file 0600):
 *   DIR/state    64 bytes, the cache's size; its flock is the cache's lock
 *   DIR/lb/UUID-OFFSET
 *                one entry: UUID 32 lower-case hex digits, OFFSET 16; the
 *                name is made from those two numbers only
 *
 * An entry file, little-endian:
 *   0   8  magic "HLTLBC\0\1"
 *   8  16  uuid
 *   24  8  offset
 *   32  8  len, the bytes that follow the header
 *   40  8  XXH3-64 of the len bytes, seeded with XXH3-64 of bytes 0..39
 *   48 16  reserved, zero
 *   64  len bytes
 * A reader accepts an entry only when the file is exactly 64 + len bytes and
 * every field and the checksum match what it asked for: a file cut short by
 * a crash, or garbage, is a miss, never wrong bytes.
 *
 * Writing: the bytes go into an unnamed file (O_TMPFILE), which is linked
 * under its name only when complete, so a reader never sees a partial entry
 * and a writer that dies leaves nothing behind. File systems without
 * O_TMPFILE get a named temporary file and rename(); the scan removes ones
 * older than an hour, left by a writer that died.
 *
 * The bound and LRU across processes: an entry's mtime is the time it was
 * last used (set explicitly, at nanosecond resolution, on put and on every
 * hit: the kernel's own timestamps are only as fine as its tick). A put
 * takes the lock (flock on DIR/state, plus a mutex for this process's
 * threads, since flock is per open file), links the entry, adds its size to
 * the total in DIR/state and, while the total is above the bound, removes
 * the least recently used entry. Candidates come from a scan of DIR/lb that
 * keeps the LBC_CANDIDATES oldest; each is removed only if its mtime is
 * still the one the scan saw (a hit since then made it recent), so the
 * entries removed are exactly the oldest, and a scan is needed once per
 * LBC_CANDIDATES evictions, not once per put. A scan also recounts the
 * total. A holder that dies inside the lock leaves DIR/state marked busy;
 * the next holder recounts. Hits take no lock.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <halite/errors.h>

#include "endian_util.h"
#include "lbcache.h"
#include "log_internal.h"
#include "stats.h"

#define LBC_HDR 64
#define LBC_NAME_LEN 49 /* 32 + '-' + 16 */
#define LBC_STATE_LEN 64
#define LBC_CANDIDATES 1024
#define LBC_TMP_MAX_AGE_S 3600

static const uint8_t lbc_magic[8] = { 'H', 'L', 'T', 'L', 'B', 'C', 0, 1 };
static const uint8_t lbc_state_magic[8] = { 'H', 'L', 'T', 'L', 'B', 'S', 0, 1 };

struct lbc_cand {
	struct timespec mtime;
	char name[LBC_NAME_LEN + 1];
};

struct halite_lbcache {
	int dir_fd;
	int lb_fd;
	int state_fd; /* its flock is the lock */
	uint64_t max_bytes;
	pthread_mutex_t mu; /* this process's threads; guards what follows */
	uint64_t used;	    /* valid while locked */
	struct lbc_cand *cand; /* the oldest entries at the last scan, oldest first */
	size_t ncand, cand_pos;
	bool no_tmpfile;
	uint64_t tmp_seq;
	/* counters: relaxed atomics */
	uint64_t hits, misses, bytes_hit, puts, evictions;
};

static void lbc_err(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void lbc_err(char *err, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	halite_vformat_error(err, errlen, code, fmt, ap);
	va_end(ap);
}

static void lbc_count(uint64_t *ctr, uint64_t n)
{
	__atomic_fetch_add(ctr, n, __ATOMIC_RELAXED);
}

static void lbc_name(char name[LBC_NAME_LEN + 1], const uint8_t uuid[16], uint64_t off)
{
	static const char hex[] = "0123456789abcdef";

	for (int i = 0; i < 16; i++) {
		name[2 * i] = hex[uuid[i] >> 4];
		name[2 * i + 1] = hex[uuid[i] & 15];
	}
	snprintf(name + 32, LBC_NAME_LEN + 1 - 32, "-%016" PRIx64, off);
}

static bool lbc_is_name(const char *s)
{
	for (int i = 0; i < LBC_NAME_LEN; i++) {
		char ch = s[i];

		if (i == 32 ? ch != '-' : !((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
			return false;
	}
	return s[LBC_NAME_LEN] == '\0';
}

static int ts_cmp(const struct timespec *a, const struct timespec *b)
{
	if (a->tv_sec != b->tv_sec)
		return a->tv_sec < b->tv_sec ? -1 : 1;
	if (a->tv_nsec != b->tv_nsec)
		return a->tv_nsec < b->tv_nsec ? -1 : 1;
	return 0;
}

/* Older first; equal times by name, so the order is total. */
static int cand_cmp(const struct lbc_cand *a, const struct lbc_cand *b)
{
	int r = ts_cmp(&a->mtime, &b->mtime);

	return r ? r : strcmp(a->name, b->name);
}

static int cand_qsort_cmp(const void *a, const void *b)
{
	return cand_cmp(a, b);
}

/* The entry's last use is now: wall-clock time, so it survives a reboot. */
static void lbc_touch(int fd)
{
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT } };

	clock_gettime(CLOCK_REALTIME, &ts[1]);
	futimens(fd, ts);
}

/* ---- the lock and the total in DIR/state ---- */

static void lbc_state_store(const struct halite_lbcache *c, bool busy)
{
	uint8_t b[LBC_STATE_LEN] = { 0 };

	memcpy(b, lbc_state_magic, 8);
	halite_put_le32(b + 8, busy);
	halite_put_le64(b + 16, c->used);
	/* A failed write leaves the state busy or invalid: the next holder recounts. */
	(void)!pwrite(c->state_fd, b, sizeof(b), 0);
}

/* The total if DIR/state holds a valid one left by a holder that finished. */
static bool lbc_state_load(const struct halite_lbcache *c, uint64_t *used)
{
	uint8_t b[LBC_STATE_LEN];

	if (pread(c->state_fd, b, sizeof(b), 0) != (ssize_t)sizeof(b))
		return false;
	if (memcmp(b, lbc_state_magic, 8) || halite_get_le32(b + 8) != 0)
		return false;
	*used = halite_get_le64(b + 16);
	return true;
}

/* Keeps the LBC_CANDIDATES oldest in a max-heap on the way through a scan. */
static void cand_heap_push(struct lbc_cand *h, size_t *n, const struct lbc_cand *x)
{
	size_t i;

	if (*n == LBC_CANDIDATES) {
		if (cand_cmp(x, &h[0]) >= 0)
			return;
		/* Replace the newest kept and sift it down. */
		i = 0;
		h[0] = *x;
		for (;;) {
			size_t l = 2 * i + 1, r = l + 1, m = i;

			if (l < *n && cand_cmp(&h[l], &h[m]) > 0)
				m = l;
			if (r < *n && cand_cmp(&h[r], &h[m]) > 0)
				m = r;
			if (m == i)
				return;
			struct lbc_cand t = h[i];
			h[i] = h[m];
			h[m] = t;
			i = m;
		}
	}
	i = (*n)++;
	h[i] = *x;
	while (i && cand_cmp(&h[(i - 1) / 2], &h[i]) < 0) {
		struct lbc_cand t = h[i];
		h[i] = h[(i - 1) / 2];
		h[(i - 1) / 2] = t;
		i = (i - 1) / 2;
	}
}

/*
 * Under the lock: recounts the total from DIR/lb and refills the candidates.
 * Names that are not entries are left alone, except our own temporary files
 * old enough that their writer must be gone.
 */
static int lbc_scan(struct halite_lbcache *c)
{
	struct timespec now;
	uint64_t used = 0;
	size_t n = 0;
	struct dirent *de;
	DIR *d;
	int fd;

	fd = openat(c->lb_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		int e = -errno;

		close(fd);
		return e;
	}
	clock_gettime(CLOCK_REALTIME, &now);
	while ((de = readdir(d))) {
		struct lbc_cand x;
		struct stat st;

		if (fstatat(c->lb_fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
			continue;
		if (!strncmp(de->d_name, "tmp.", 4)) {
			if (now.tv_sec - st.st_mtim.tv_sec > LBC_TMP_MAX_AGE_S)
				unlinkat(c->lb_fd, de->d_name, 0);
			continue;
		}
		if (!lbc_is_name(de->d_name))
			continue;
		used += (uint64_t)st.st_size;
		x.mtime = st.st_mtim;
		memcpy(x.name, de->d_name, LBC_NAME_LEN + 1);
		cand_heap_push(c->cand, &n, &x);
	}
	closedir(d);
	qsort(c->cand, n, sizeof(c->cand[0]), cand_qsort_cmp);
	c->ncand = n;
	c->cand_pos = 0;
	c->used = used;
	return 0;
}

static int lbc_lock(struct halite_lbcache *c)
{
	int ret;

	pthread_mutex_lock(&c->mu);
	while (flock(c->state_fd, LOCK_EX) < 0) {
		if (errno != EINTR) {
			ret = -errno;
			pthread_mutex_unlock(&c->mu);
			return ret;
		}
	}
	if (!lbc_state_load(c, &c->used)) {
		ret = lbc_scan(c);
		if (ret < 0) {
			flock(c->state_fd, LOCK_UN);
			pthread_mutex_unlock(&c->mu);
			return ret;
		}
	}
	/* From here until unlock the total may be wrong: say so on disk. */
	lbc_state_store(c, true);
	return 0;
}

static void lbc_unlock(struct halite_lbcache *c)
{
	lbc_state_store(c, false);
	flock(c->state_fd, LOCK_UN);
	pthread_mutex_unlock(&c->mu);
}

/* Under the lock: removes @name if it is still the file @want (NULL: any). */
static void lbc_remove(struct halite_lbcache *c, const char *name, const struct stat *want)
{
	struct stat st;

	if (fstatat(c->lb_fd, name, &st, AT_SYMLINK_NOFOLLOW))
		return;
	if (want && (st.st_ino != want->st_ino || st.st_dev != want->st_dev))
		return;
	if (unlinkat(c->lb_fd, name, 0))
		return;
	if (S_ISREG(st.st_mode))
		c->used -= c->used < (uint64_t)st.st_size ? c->used : (uint64_t)st.st_size;
}

/* Under the lock: the least recently used entries go until the total fits. */
static int lbc_evict(struct halite_lbcache *c)
{
	int scans = 0;

	while (c->used > c->max_bytes) {
		struct lbc_cand *x;
		struct stat st;

		if (c->cand_pos == c->ncand) {
			int ret;

			/*
			 * Only hits racing with us can make a fresh scan's
			 * candidates all go stale; a few rounds outlast them. An
			 * empty scan leaves nothing to remove.
			 */
			if (scans == 4 || (scans && !c->ncand))
				return 0;
			ret = lbc_scan(c);
			if (ret < 0)
				return ret;
			scans++;
			continue;
		}
		x = &c->cand[c->cand_pos++];
		if (fstatat(c->lb_fd, x->name, &st, AT_SYMLINK_NOFOLLOW))
			continue; /* gone: someone else removed it and counted it */
		if (ts_cmp(&st.st_mtim, &x->mtime))
			continue; /* used or replaced since the scan: no longer among the oldest */
		if (unlinkat(c->lb_fd, x->name, 0))
			continue;
		c->used -= c->used < (uint64_t)st.st_size ? c->used : (uint64_t)st.st_size;
		lbc_count(&c->evictions, 1);
	}
	return 0;
}

/* ---- opening ---- */

/* @fd is a directory or file of ours that no one else may write. */
static int lbc_check_owned(int fd, const char *what, const char *path, bool want_dir,
			   char *err, size_t errlen)
{
	struct stat st;

	if (fstat(fd, &st)) {
		int e = -errno;

		lbc_err(err, errlen, e, "cache %s %s", what, path);
		return e;
	}
	if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
		int e = want_dir ? -ENOTDIR : -EINVAL;

		lbc_err(err, errlen, e, "cache %s %s is not a %s", what, path,
			want_dir ? "directory" : "regular file");
		return e;
	}
	if (st.st_uid != geteuid()) {
		lbc_err(err, errlen, -EPERM, "cache %s %s is owned by uid %u, not by this user (uid %u)",
			what, path, (unsigned int)st.st_uid, (unsigned int)geteuid());
		return -EPERM;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		lbc_err(err, errlen, -EPERM, "cache %s %s is group- or world-writable (mode %04o)",
			what, path, (unsigned int)(st.st_mode & 07777));
		return -EPERM;
	}
	return 0;
}

/* mkdir 0700 if missing, then open it without following a symbolic link. */
static int lbc_open_dir(int at, const char *name, const char *path, char *err, size_t errlen)
{
	bool made = mkdirat(at, name, 0700) == 0;
	int fd, ret;

	if (!made && errno != EEXIST) {
		ret = -errno;
		lbc_err(err, errlen, ret, "cannot create cache directory %s", path);
		return ret;
	}
	fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		struct stat st;

		ret = -errno;
		/* O_DIRECTORY makes a symbolic link ENOTDIR, not ELOOP: say which. */
		if (ret == -ELOOP || (ret == -ENOTDIR && !fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) &&
				      S_ISLNK(st.st_mode)))
			ret = -ELOOP;
		if (ret == -ELOOP)
			lbc_err(err, errlen, ret, "cache directory %s is a symbolic link", path);
		else
			lbc_err(err, errlen, ret, "cannot open cache directory %s", path);
		return ret;
	}
	/* The umask may have taken bits we want; we own it, so set them. */
	if (made)
		fchmod(fd, 0700);
	ret = lbc_check_owned(fd, "directory", path, true, err, errlen);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	return fd;
}

int halite_lbcache_open(struct halite_lbcache **out, const char *dir, uint64_t max_bytes,
			char *err, size_t errlen)
{
	struct halite_lbcache *c;
	char path[4096];
	int ret;

	if (err && errlen)
		err[0] = '\0';
	if (!out || !dir || !*dir || !max_bytes) {
		lbc_err(err, errlen, -EINVAL, "cache: %s", !dir || !*dir ? "no directory given"
							 : "a size of 0 bytes");
		return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		lbc_err(err, errlen, -ENOMEM, "cache %s", dir);
		return -ENOMEM;
	}
	c->dir_fd = c->lb_fd = c->state_fd = -1;
	c->max_bytes = max_bytes;
	pthread_mutex_init(&c->mu, NULL);
	c->cand = calloc(LBC_CANDIDATES, sizeof(c->cand[0]));
	if (!c->cand) {
		ret = -ENOMEM;
		lbc_err(err, errlen, ret, "cache %s", dir);
		goto fail;
	}
	ret = lbc_open_dir(AT_FDCWD, dir, dir, err, errlen);
	if (ret < 0)
		goto fail;
	c->dir_fd = ret;
	snprintf(path, sizeof(path), "%s/lb", dir);
	ret = lbc_open_dir(c->dir_fd, "lb", path, err, errlen);
	if (ret < 0)
		goto fail;
	c->lb_fd = ret;
	snprintf(path, sizeof(path), "%s/state", dir);
	c->state_fd = openat(c->dir_fd, "state", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (c->state_fd < 0) {
		ret = -errno;
		lbc_err(err, errlen, ret, "cannot open cache state %s", path);
		goto fail;
	}
	ret = lbc_check_owned(c->state_fd, "state file", path, false, err, errlen);
	if (ret < 0)
		goto fail;
	/* Recounts a cache that is new or was left busy by a process that died. */
	ret = lbc_lock(c);
	if (ret < 0) {
		lbc_err(err, errlen, ret, "cannot lock cache state %s", path);
		goto fail;
	}
	ret = lbc_evict(c); /* another process may have used a larger bound */
	lbc_unlock(c);
	if (ret < 0) {
		lbc_err(err, errlen, ret, "cannot scan cache directory %s/lb", dir);
		goto fail;
	}
	*out = c;
	return 0;
fail:
	halite_lbcache_close(c);
	return ret;
}

void halite_lbcache_close(struct halite_lbcache *c)
{
	if (!c)
		return;
	if (c->state_fd >= 0)
		close(c->state_fd);
	if (c->lb_fd >= 0)
		close(c->lb_fd);
	if (c->dir_fd >= 0)
		close(c->dir_fd);
	pthread_mutex_destroy(&c->mu);
	free(c->cand);
	free(c);
}

/* ---- entries ---- */

static uint64_t lbc_sum(const uint8_t *hdr, const void *buf, size_t len)
{
	return XXH3_64bits_withSeed(buf, len, XXH3_64bits(hdr, 40));
}

static void lbc_header(uint8_t hdr[LBC_HDR], const uint8_t uuid[16], uint64_t off,
		       const void *buf, size_t len)
{
	memset(hdr, 0, LBC_HDR);
	memcpy(hdr, lbc_magic, 8);
	memcpy(hdr + 8, uuid, 16);
	halite_put_le64(hdr + 24, off);
	halite_put_le64(hdr + 32, len);
	halite_put_le64(hdr + 40, lbc_sum(hdr, buf, len));
}

static bool lbc_header_ok(const uint8_t hdr[LBC_HDR], const uint8_t uuid[16], uint64_t off,
			  const void *buf, size_t len)
{
	static const uint8_t zero[16];

	return !memcmp(hdr, lbc_magic, 8) && !memcmp(hdr + 8, uuid, 16) &&
	       halite_get_le64(hdr + 24) == off && halite_get_le64(hdr + 32) == len &&
	       !memcmp(hdr + 48, zero, 16) && halite_get_le64(hdr + 40) == lbc_sum(hdr, buf, len);
}

static bool lbc_len_ok(size_t len)
{
	return len > 0 && len <= HALITE_LBCACHE_MAX_ENTRY;
}

/* A bad entry @fd found under @name goes, if no one replaced it meanwhile. */
static void lbc_remove_bad(struct halite_lbcache *c, const char *name, int fd)
{
	struct stat st;

	if (fstat(fd, &st) || lbc_lock(c) < 0)
		return;
	lbc_remove(c, name, &st);
	lbc_unlock(c);
}

int halite_lbcache_get(struct halite_lbcache *c, const uint8_t uuid[16], uint64_t off,
		       void *buf, size_t len)
{
	char name[LBC_NAME_LEN + 1];
	uint8_t hdr[LBC_HDR];
	struct iovec iov[2] = { { hdr, LBC_HDR }, { buf, len } };
	struct stat st;
	ssize_t n;
	int fd;

	if (!lbc_len_ok(len))
		return -EINVAL;
	lbc_name(name, uuid, off);
	fd = openat(c->lb_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;

		if (e == ENOENT) {
			lbc_count(&c->misses, 1);
			return 0;
		}
		if (e != ELOOP)
			return -e;
		/* A symbolic link where an entry should be: not ours, and never followed. */
		if (lbc_lock(c) == 0) {
			lbc_remove(c, name, NULL);
			lbc_unlock(c);
		}
		lbc_count(&c->misses, 1);
		return 0;
	}
	if (fstat(fd, &st)) {
		int e = -errno;

		close(fd);
		return e;
	}
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != LBC_HDR + (uint64_t)len)
		goto bad;
	/* Files are at most 64 MiB + 64: one preadv returns them whole unless cut. */
	n = preadv(fd, iov, 2, 0);
	if (n < 0) {
		int e = -errno;

		close(fd);
		return e;
	}
	if ((size_t)n != LBC_HDR + len || !lbc_header_ok(hdr, uuid, off, buf, len))
		goto bad;
	lbc_touch(fd);
	close(fd);
	lbc_count(&c->hits, 1);
	lbc_count(&c->bytes_hit, len);
	return 1;
bad:
	/*
	 * Cut short, garbage, or another length than the LB has: never
	 * returned, and removed so that the next put replaces it.
	 */
	lbc_remove_bad(c, name, fd);
	close(fd);
	lbc_count(&c->misses, 1);
	return 0;
}

static int lbc_write_all(int fd, const uint8_t *hdr, const void *buf, size_t len)
{
	struct iovec iov[2] = { { (void *)hdr, LBC_HDR }, { (void *)buf, len } };
	size_t done = 0, total = LBC_HDR + len;

	while (done < total) {
		ssize_t n = pwritev(fd, iov, 2, (off_t)done);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		done += (size_t)n;
		/* Skip what was written, for a short write's next round. */
		for (size_t skip = (size_t)n; skip;) {
			struct iovec *v = iov[0].iov_len ? &iov[0] : &iov[1];
			size_t k = skip < v->iov_len ? skip : v->iov_len;

			v->iov_base = (uint8_t *)v->iov_base + k;
			v->iov_len -= k;
			skip -= k;
		}
	}
	return 0;
}

/*
 * A file for the entry's bytes, not yet visible under any name: unnamed
 * (O_TMPFILE) where the file system can, else "tmp.PID.SEQ" in DIR/lb, a
 * name the readers never open.
 */
static int lbc_tmp_open(struct halite_lbcache *c, char tmp[64])
{
	int fd;

	tmp[0] = '\0';
	if (!__atomic_load_n(&c->no_tmpfile, __ATOMIC_RELAXED)) {
		fd = openat(c->lb_fd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
		if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR))
			return fd < 0 ? -errno : fd;
		__atomic_store_n(&c->no_tmpfile, true, __ATOMIC_RELAXED);
	}
	/*
	 * Processes in other pid namespaces may share our pid: the clock makes
	 * the name unique, and O_EXCL makes sure.
	 */
	for (int tries = 0; tries < 8; tries++) {
		snprintf(tmp, 64, "tmp.%ld.%" PRIu64 ".%" PRIx64, (long)getpid(),
			 __atomic_fetch_add(&c->tmp_seq, 1, __ATOMIC_RELAXED), halite_now_ns());
		fd = openat(c->lb_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			    0600);
		if (fd >= 0 || errno != EEXIST)
			break;
	}
	if (fd < 0)
		tmp[0] = '\0'; /* not ours: never unlinked */
	return fd < 0 ? -errno : fd;
}

/*
 * Under the lock: the complete file @fd becomes the entry @name, replacing
 * one there, and the total counts it. An unnamed file is linked by its
 * descriptor: AT_EMPTY_PATH where the kernel lets us, else through
 * /proc/self/fd, the one link we follow, to our own descriptor.
 */
static int lbc_publish(struct halite_lbcache *c, int fd, const char *tmp, const char *name,
		       uint64_t size)
{
	char proc[64];
	struct stat old;

	if (tmp[0]) {
		bool had = !fstatat(c->lb_fd, name, &old, AT_SYMLINK_NOFOLLOW) &&
			   S_ISREG(old.st_mode);

		if (renameat(c->lb_fd, tmp, c->lb_fd, name))
			return -errno;
		if (had)
			c->used -= c->used < (uint64_t)old.st_size ? c->used
								    : (uint64_t)old.st_size;
		c->used += size;
		return 0;
	}
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	for (int tries = 0; tries < 2; tries++) {
		if (!linkat(fd, "", c->lb_fd, name, AT_EMPTY_PATH) ||
		    (errno != EEXIST && !linkat(AT_FDCWD, proc, c->lb_fd, name, AT_SYMLINK_FOLLOW))) {
			c->used += size;
			return 0;
		}
		if (errno != EEXIST)
			return -errno;
		/* An older copy of the entry: the new one replaces it. */
		lbc_remove(c, name, NULL);
	}
	return -EEXIST;
}

int halite_lbcache_put(struct halite_lbcache *c, const uint8_t uuid[16], uint64_t off,
		       const void *buf, size_t len)
{
	char name[LBC_NAME_LEN + 1], tmp[64];
	uint8_t hdr[LBC_HDR];
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT } };
	uint64_t size = LBC_HDR + (uint64_t)len;
	int fd, ret;

	if (!lbc_len_ok(len))
		return -EINVAL;
	if (size > c->max_bytes)
		return -HALITE_E_LIMIT;
	lbc_name(name, uuid, off);
	lbc_header(hdr, uuid, off, buf, len);
	fd = lbc_tmp_open(c, tmp);
	if (fd < 0)
		return fd;
	/* The slow part, writing the bytes, happens outside the lock. */
	ret = lbc_write_all(fd, hdr, buf, len);
	if (ret < 0)
		goto out;
	clock_gettime(CLOCK_REALTIME, &ts[1]);
	if (futimens(fd, ts)) {
		ret = -errno;
		goto out;
	}
	ret = lbc_lock(c);
	if (ret < 0)
		goto out;
	ret = lbc_publish(c, fd, tmp, name, size);
	if (ret == 0) {
		tmp[0] = '\0';
		lbc_count(&c->puts, 1);
		ret = lbc_evict(c);
	}
	lbc_unlock(c);
out:
	if (tmp[0])
		unlinkat(c->lb_fd, tmp, 0);
	close(fd);
	return ret;
}

void halite_lbcache_drop(struct halite_lbcache *c, const uint8_t uuid[16], uint64_t off)
{
	char name[LBC_NAME_LEN + 1];

	lbc_name(name, uuid, off);
	if (lbc_lock(c) < 0)
		return;
	lbc_remove(c, name, NULL);
	lbc_unlock(c);
}

void halite_lbcache_no_tmpfile(struct halite_lbcache *c)
{
	__atomic_store_n(&c->no_tmpfile, true, __ATOMIC_RELAXED);
}

void halite_lbcache_stats(const struct halite_lbcache *c, struct halite_lbcache_stats *st)
{
	uint64_t used = 0;

	st->hits = __atomic_load_n(&c->hits, __ATOMIC_RELAXED);
	st->misses = __atomic_load_n(&c->misses, __ATOMIC_RELAXED);
	st->bytes_hit = __atomic_load_n(&c->bytes_hit, __ATOMIC_RELAXED);
	st->puts = __atomic_load_n(&c->puts, __ATOMIC_RELAXED);
	st->evictions = __atomic_load_n(&c->evictions, __ATOMIC_RELAXED);
	/*
	 * Read without the lock: while a put runs the state is marked busy, and
	 * the total it holds is the one before that put, which is still a
	 * value the cache had.
	 */
	{
		uint8_t b[LBC_STATE_LEN];

		if (pread(c->state_fd, b, sizeof(b), 0) == (ssize_t)sizeof(b) &&
		    !memcmp(b, lbc_state_magic, 8))
			used = halite_get_le64(b + 16);
	}
	st->bytes_stored = used;
}
