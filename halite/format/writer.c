/* SPDX-License-Identifier: MIT */
/*
 * Format v1 writer (docs/format.md).
 *
 * One pass, front to back: the header at create, each stream's locality block
 * when it fills (so a stream's blocks land in the file in the order the guest
 * touched them, and blocks of different streams interleave in fill order),
 * then at finish the sections, the directory and the footer, which is written
 * last so that a file cut short anywhere is recognisably incomplete.
 * writer_lb.c fills and writes the locality blocks; writer_tail.c writes
 * the sections, directory and footer and commits the file. This file
 * creates a writer (options, regions, the temporary file), gathers what the
 * sections will hold, and frees it.
 *
 * Replacing a file. The file is built under a temporary name in the target's
 * directory (".NAME.XXXXXX", created O_EXCL so nothing already there is ever
 * opened, mode 0600 since it holds guest RAM) and only finish, after the
 * footer and an fdatasync, renames it over the target. So the target path
 * holds the older file, untouched, or the complete new one, whatever fails
 * and whenever anyone looks; a restore reading the older file keeps its
 * inode. A writer freed without a successful finish removes its temporary
 * file, or, when asked to keep it, renames it to "TARGET.incomplete": a
 * partial file never takes the target's name. Only a process killed before
 * it frees the writer leaves the temporary file behind.
 */
#define _GNU_SOURCE /* O_DIRECT, qsort_r, asprintf */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "endian_util.h"
#include "io_internal.h"
#include "writer_test.h"
#include "export.h"
#include "layout.h"
#include "log_internal.h"
#include "opts.h"

#include "writer_int.h"

/* "4 KiB", "64 KiB", "8 MiB", else bytes: the way the options are written. */
static const char *size_words(uint64_t v, char *buf, size_t len)
{
	if (v && !(v & ((1u << 20) - 1)))
		snprintf(buf, len, "%llu MiB", (unsigned long long)(v >> 20));
	else if (v && !(v & 1023))
		snprintf(buf, len, "%llu KiB", (unsigned long long)(v >> 10));
	else
		snprintf(buf, len, "%llu bytes", (unsigned long long)v);
	return buf;
}

/*
 * The options with their defaults filled in, checked; on failure one
 * sentence in @err naming the option, its value and what is accepted.
 */
static int check_opts(const struct halite_writer_opts *o, uint32_t *page_size, uint32_t *mb_pages,
		      uint32_t *lb_size, int *codec, char *err, size_t errlen)
{
	char a[32], b[32], c[32];
	int lo, hi;

	*page_size = o->page_size ? o->page_size : HALITE_DEFAULT_PAGE_SIZE;
	*mb_pages = o->mb_pages ? o->mb_pages : HALITE_DEFAULT_MB_PAGES;
	*lb_size = o->lb_size ? o->lb_size : HALITE_DEFAULT_LB_SIZE;
	*codec = o->codec ? o->codec : HALITE_CODEC_LZ4;

	if (!halite_is_pow2(*page_size) || *page_size < 4096 || *page_size > HLT_MAX_PAGE_SIZE) {
		snprintf(err, errlen, "page size %s: a power of two from 4 KiB to %s",
			 size_words(*page_size, a, sizeof(a)), size_words(HLT_MAX_PAGE_SIZE, b, sizeof(b)));
		return -EINVAL;
	}
	if (*mb_pages > HLT_MAX_MB_PAGES) {
		snprintf(err, errlen, "%u pages per memory block: 1 to %u", *mb_pages, HLT_MAX_MB_PAGES);
		return -EINVAL;
	}
	if (!halite_is_pow2(*lb_size) || *lb_size < HALITE_MIN_LB_SIZE ||
	    *lb_size > HALITE_MAX_LB_SIZE) {
		snprintf(err, errlen, "locality-block size %s: a power of two from %s to %s",
			 size_words(*lb_size, a, sizeof(a)), size_words(HALITE_MIN_LB_SIZE, b, sizeof(b)),
			 size_words(HALITE_MAX_LB_SIZE, c, sizeof(c)));
		return -EINVAL;
	}
	if ((uint64_t)*page_size * *mb_pages > *lb_size) {
		snprintf(err, errlen, "a memory block of %s (%u pages of %s) does not fit a "
			 "locality block of %s", size_words((uint64_t)*page_size * *mb_pages, a, sizeof(a)),
			 *mb_pages, size_words(*page_size, b, sizeof(b)),
			 size_words(*lb_size, c, sizeof(c)));
		return -EINVAL;
	}
	if (*codec == HALITE_CODEC_DEFAULT || halite_codec_level_range(*codec, &lo, &hi)) {
		snprintf(err, errlen, "codec %d: not one of none, lz4, zlib, zstd", *codec);
		return -HALITE_E_NO_CODEC;
	}
	if (o->level < lo || o->level > hi) {
		snprintf(err, errlen, "%s level %d: %d to %d (0: the codec's default)",
			 halite_codec_name(*codec), o->level, lo, hi);
		return -EINVAL;
	}
	if (o->flags & ~HALITE_WRITER_FLAGS_ALL) {
		snprintf(err, errlen, "writer flags 0x%x: unknown bits 0x%x", o->flags,
			 o->flags & ~HALITE_WRITER_FLAGS_ALL);
		return -EINVAL;
	}
	if (o->io_backend < HALITE_IO_BACKEND_DEFAULT || o->io_backend > HALITE_IO_BACKEND_PSYNC) {
		snprintf(err, errlen, "I/O backend %d: 0 to %d", o->io_backend,
			 HALITE_IO_BACKEND_PSYNC);
		return -EINVAL;
	}
	if (o->queue_depth > HALITE_WRITER_MAX_QUEUE_DEPTH) {
		snprintf(err, errlen, "queue depth %u: 0 (the default, 8) to %u", o->queue_depth,
			 HALITE_WRITER_MAX_QUEUE_DEPTH);
		return -EINVAL;
	}
	return 0;
}

HALITE_EXPORT int halite_writer_opts_check(const struct halite_writer_opts *opts, char *err,
					   size_t errlen)
{
	struct halite_writer_opts o;
	uint32_t page_size, mb_pages, lb_size;
	char dummy[1];
	int codec, ret;

	if (!err || !errlen) {
		err = dummy;
		errlen = sizeof(dummy);
	}
	err[0] = '\0';
	ret = halite_opts_copy(&o, sizeof(o), opts);
	if (ret) {
		snprintf(err, errlen, "writer options of an unknown size");
		return ret;
	}
	return check_opts(&o, &page_size, &mb_pages, &lb_size, &codec, err, errlen);
}

static int copy_regions(struct halite_writer *w, const struct halite_region *regions, uint32_t n)
{
	uint64_t first = 0;

	if (!n || n > HLT_MAX_REGIONS)
		return wfail(w, -EINVAL, "%u regions (1 to %u allowed)", n, HLT_MAX_REGIONS);
	w->regions = calloc(n, sizeof(*w->regions));
	if (!w->regions)
		return -ENOMEM;
	w->nregions = n;
	for (uint32_t i = 0; i < n; i++) {
		const struct halite_region *r = &regions[i];
		size_t len = r->name ? strlen(r->name) : 0;

		if (!len || len > HALITE_MAX_REGION_NAME)
			return wfail(w, -EINVAL, "region %u: name must be 1 to %u bytes", i,
				     HALITE_MAX_REGION_NAME);
		for (uint32_t j = 0; j < i; j++)
			if (!strcmp(w->regions[j].name, r->name))
				return wfail(w, -EINVAL, "region name '%s' given twice", r->name);
		if (!r->length || r->length % w->page_size || r->gpa % w->page_size)
			return wfail(w, -EINVAL,
				     "region '%s': gpa and length must be page multiples, length > 0",
				     r->name);
		w->regions[i].name = strdup(r->name);
		if (!w->regions[i].name)
			return -ENOMEM;
		w->regions[i].gpa = r->gpa;
		w->regions[i].length = r->length;
		w->regions[i].first_mb = first;
		w->regions[i].mb_count = hlt_region_mbs(r->length, w->mb_size);
		if (first + w->regions[i].mb_count < first ||
		    first + w->regions[i].mb_count > (UINT64_MAX / 8) / 2)
			return wfail(w, -HALITE_E_LIMIT, "regions too large");
		first += w->regions[i].mb_count;
	}
	w->mb_count = first;
	return 0;
}

static int write_header(struct halite_writer *w, int level)
{
	uint8_t *h = halite_io_alloc(HLT_DATA_OFFSET);
	struct timespec ts;
	int ret;

	if (!h)
		return -ENOMEM;
	memset(h, 0, HLT_DATA_OFFSET);
	clock_gettime(CLOCK_REALTIME, &ts);
	memcpy(h, HLT_HDR_MAGIC, 8);
	halite_put_le16(h + HLT_HDR_VERSION_MAJOR, HALITE_FORMAT_MAJOR);
	halite_put_le16(h + HLT_HDR_VERSION_MINOR, v1_0(w) ? 0 : HALITE_FORMAT_MINOR);
	halite_put_le32(h + HLT_HDR_HEADER_SIZE, HLT_HDR_SIZE);
	halite_put_le64(h + HLT_HDR_INCOMPAT, v1_0(w) ? 0 : HLT_INCOMPAT_CHUNKED_INDEX);
	halite_put_le32(h + HLT_HDR_PAGE_SIZE, w->page_size);
	halite_put_le32(h + HLT_HDR_MB_PAGES, w->mb_pages);
	halite_put_le32(h + HLT_HDR_LB_SIZE, w->lb_size);
	h[HLT_HDR_CODEC] = (uint8_t)w->codec;
	h[HLT_HDR_CODEC_LEVEL] = (uint8_t)(int8_t)level;
	halite_put_le64(h + HLT_HDR_DATA_OFFSET, HLT_DATA_OFFSET);
	memcpy(h + HLT_HDR_UUID, w->uuid, 16);
	halite_put_le64(h + HLT_HDR_CREATED, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
	halite_put_le64(h + HLT_HDR_CHECKSUM, hlt_hash(h, HLT_HDR_CHECKSUM, 0));
	ret = halite_io_write(w->io, h, HLT_DATA_OFFSET, 0);
	halite_io_free(h);
	if (ret)
		return wfail_io(w, ret, "%s: writing the header", w->path);
	return 0;
}

__attribute__((format(printf, 4, 5)))
static int path_err(char *err, size_t len, int ret, const char *fmt, ...)
{
	va_list ap;

	if (err && len) {
		va_start(ap, fmt);
		vsnprintf(err, len, fmt, ap);
		va_end(ap);
	}
	return ret;
}

/*
 * HALITE_LOCK_PROTOCOL (format.h): a restore reading the file at @path holds
 * LOCK_SH on it. Only a lock seen counts: a file this process cannot open is
 * left to the create or the rename to complain about.
 */
static bool target_busy(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	bool busy;

	if (fd < 0)
		return false;
	busy = flock(fd, LOCK_EX | LOCK_NB) && errno == EWOULDBLOCK;
	close(fd);
	return busy;
}

HALITE_EXPORT int halite_writer_check_path(const char *path, char *err, size_t errlen)
{
	char *copy, *dir;
	struct stat st;
	int ret = 0;

	if (!path || !*path)
		return path_err(err, errlen, -EINVAL, "no file name given");
	/* No name to build the temporary file's from, and open(2) would say EISDIR. */
	if (path[strlen(path) - 1] == '/')
		return path_err(err, errlen, -EISDIR, "%s names a directory, not a file", path);
	copy = strdup(path);
	if (!copy)
		return -ENOMEM;
	dir = dirname(copy);
	if (stat(dir, &st))
		ret = path_err(err, errlen, -errno, "%s: directory %s: %s", path, dir,
			       strerror(errno));
	else if (!S_ISDIR(st.st_mode))
		ret = path_err(err, errlen, -ENOTDIR, "%s: %s is not a directory", path, dir);
	else if (access(dir, W_OK | X_OK))
		ret = path_err(err, errlen, -errno, "%s: cannot create files in %s: %s", path,
			       dir, strerror(errno));
	free(copy);
	if (ret)
		return ret;
	if (stat(path, &st))
		return errno == ENOENT ? 0 : path_err(err, errlen, -errno, "%s: %s", path,
						      strerror(errno));
	if (S_ISDIR(st.st_mode))
		return path_err(err, errlen, -EISDIR, "%s is a directory", path);
	/*
	 * The new file is renamed over the target: a device or a FIFO would be
	 * replaced, not written to (saving to /dev/null as root would delete it).
	 */
	if (!S_ISREG(st.st_mode))
		return path_err(err, errlen, -EINVAL, "%s is not a regular file: a snapshot "
				"would replace it, save to a file", path);
	if (target_busy(path))
		return path_err(err, errlen, -EBUSY, "%s is being restored from (a running "
				"restore reads it): save to another path", path);
	return 0;
}

/* A temporary name's suffix: characters safe in any file name. */
static const char temp_chars[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
#define TEMP_SUFFIX_LEN 6
/* 62^6 names: a hundred taken in a row means something else answers EEXIST. */
#define TEMP_TRIES 100

static uint64_t temp_rand(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/*
 * Create the temporary file for @target: ".NAME.XXXXXX" in its directory, so
 * that the final rename() stays within one file system and one directory.
 * O_EXCL: a name already taken (another save's temporary file, anything) is
 * never opened, and the next name is tried. 0600: the file holds guest RAM;
 * the umask can only take more away. Returns the descriptor, with the name in
 * *tmpp (the caller frees it), or -errno.
 */
static int open_temp(const char *target, uint64_t seed, char **tmpp)
{
	const char *slash = strrchr(target, '/');
	size_t dlen = slash ? (size_t)(slash - target) + 1 : 0;
	size_t blen = strlen(target + dlen);
	char *tmp, *suffix;
	int fd = -EEXIST;

	/* The dot and the suffix must still fit NAME_MAX: the name's end is not needed. */
	blen = HALITE_MIN(blen, (size_t)NAME_MAX - TEMP_SUFFIX_LEN - 2);
	tmp = malloc(dlen + blen + TEMP_SUFFIX_LEN + 3);
	if (!tmp)
		return -ENOMEM;
	memcpy(tmp, target, dlen);
	tmp[dlen] = '.';
	memcpy(tmp + dlen + 1, target + dlen, blen);
	tmp[dlen + 1 + blen] = '.';
	suffix = tmp + dlen + blen + 2;
	suffix[TEMP_SUFFIX_LEN] = '\0';
	for (int i = 0; i < TEMP_TRIES && fd == -EEXIST; i++) {
		uint64_t r = temp_rand(&seed);

		for (int k = 0; k < TEMP_SUFFIX_LEN; k++, r /= sizeof(temp_chars) - 1)
			suffix[k] = temp_chars[r % (sizeof(temp_chars) - 1)];
		fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0)
			fd = -errno;
	}
	if (fd < 0) {
		free(tmp);
		return fd;
	}
	*tmpp = tmp;
	return fd;
}

static int open_output(struct halite_writer *w, int backend)
{
	HALITE_OPTS(halite_io_opts, io_opts);
	char err[sizeof(w->errmsg)], *tmp;
	uint64_t seed;
	int fd, ret;

	ret = halite_writer_check_path(w->path, err, sizeof(err));
	if (ret) {
		/* Already one sentence that names the problem. */
		memcpy(w->errmsg, err, sizeof(err));
		halite_logf(&w->log, HALITE_LOG_ERROR, "%s", w->errmsg);
		return ret;
	}
	if (asprintf(&w->incomplete_path, "%s.incomplete", w->path) < 0) {
		w->incomplete_path = NULL;
		return -ENOMEM;
	}
	if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
		return wfail(w, -errno, "getrandom");
	fd = open_temp(w->path, seed, &tmp);
	if (fd < 0)
		return wfail(w, fd, "%s: cannot create a file beside it", w->path);
	/*
	 * O_DIRECT is set on the open descriptor, not at open(2): a file system
	 * that refuses it fails open(O_CREAT | O_DIRECT) only after creating the
	 * file, and this way there is only one path that removes it.
	 */
	io_opts.backend = backend;
	io_opts.queue_depth = w->qd;
	io_opts.flags = (w->flags & HALITE_WRITER_DIRECT) ? HALITE_IO_DIRECT : 0;
	ret = halite_io_from_fd(&w->io, fd, &io_opts);
	if (ret) {
		close(fd);
		unlink(tmp);
		free(tmp);
		return wfail(w, ret, "%s: cannot create", w->path);
	}
	w->tmp_path = tmp;
	return 0;
}

HALITE_EXPORT int halite_writer_create(struct halite_writer **wp, const char *path,
			 const struct halite_region *regions, uint32_t nregions,
			 const struct halite_writer_opts *opts)
{
	struct halite_writer_opts o;
	struct halite_writer *w;
	char why[160];
	int ret;

	if (!wp || !path || !regions)
		return -EINVAL;
	ret = halite_opts_copy(&o, sizeof(o), opts);
	if (ret)
		return ret;
	opts = &o;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->log = (struct halite_logger){ o.log, o.log_ctx, o.log_level };
	ret = check_opts(opts, &w->page_size, &w->mb_pages, &w->lb_size, &w->codec, why,
			 sizeof(why));
	if (ret) {
		wfail(w, ret, "%s", why);
		goto err;
	}
	w->flags = opts->flags;
	w->level = opts->level;
	w->vcpu_count = opts->vcpu_count;
	w->mb_size = w->page_size * w->mb_pages;
	w->lb_shift = (uint32_t)__builtin_ctz(w->lb_size);
	w->path = strdup(path);
	if (!w->path) {
		ret = -ENOMEM;
		goto err;
	}
	ret = copy_regions(w, regions, nregions);
	if (ret)
		goto err;
	if (getrandom(w->uuid, sizeof(w->uuid), 0) != sizeof(w->uuid)) {
		ret = wfail(w, -errno, "getrandom");
		goto err;
	}
	w->file_seed = hlt_file_seed(w->uuid);
	w->map = calloc(w->mb_count, sizeof(*w->map));
	w->scratch = malloc(w->mb_size);
	w->qd = o.queue_depth ? o.queue_depth : WRITER_QD_DEFAULT;
	w->flight = calloc(w->qd, sizeof(*w->flight));
	w->slot_free = malloc(w->qd * sizeof(*w->slot_free));
	w->lb_free = malloc(w->qd * sizeof(*w->lb_free));
	if (!w->map || !w->scratch || !w->flight || !w->slot_free || !w->lb_free) {
		ret = -ENOMEM;
		goto err;
	}
	/* Pop order 0, 1, 2...: with in-order completions, slot 0 is reused. */
	for (unsigned i = 0; i < w->qd; i++)
		w->slot_free[i] = w->qd - 1 - i;
	w->nslot_free = w->qd;
	ret = open_output(w, o.io_backend);
	if (ret)
		goto err;
	ret = write_header(w, opts->level);
	if (ret) {
		halite_writer_free(w, true);
		return ret;
	}
	*wp = w;
	return 0;
err:
	halite_writer_free(w, false);
	return ret;
}

HALITE_EXPORT uint32_t halite_writer_mb_size(const struct halite_writer *w)
{
	return w->mb_size;
}

HALITE_EXPORT uint64_t halite_writer_mb_count(const struct halite_writer *w)
{
	return w->mb_count;
}

HALITE_EXPORT int halite_writer_set_device_state(struct halite_writer *w, const void *data, uint64_t len)
{
	if (w->state != W_OPEN || w->has_device_state)
		return wfail(w, -HALITE_E_STATE, "device state already set or writer not open");
	w->device_state = malloc(len ? len : 1);
	if (!w->device_state)
		return -ENOMEM;
	memcpy(w->device_state, data, len);
	w->device_state_len = len;
	w->has_device_state = true;
	return 0;
}

HALITE_EXPORT int halite_writer_add_root(struct halite_writer *w, const struct halite_root *root)
{
	if (w->state != W_OPEN)
		return wfail(w, -HALITE_E_STATE, "writer is not open");
	if (root->mode != HALITE_PAGING_4LEVEL && root->mode != HALITE_PAGING_5LEVEL)
		return wfail(w, -EINVAL, "paging mode %u", root->mode);
	if (root->vcpu >= w->vcpu_count && root->vcpu != HALITE_VCPU_UNKNOWN)
		return wfail(w, -EINVAL, "root for vCPU %u of %u (set vcpu_count)", root->vcpu,
			     w->vcpu_count);
	if (grow32((void **)&w->roots, sizeof(*w->roots), &w->roots_cap, w->nroots + 1))
		return -ENOMEM;
	w->roots[w->nroots++] = *root;
	return 0;
}

static int kv_add(struct halite_writer *w, struct wkvs *kvs, const char *key, const void *value,
		  uint32_t len)
{
	size_t klen = key ? strlen(key) : 0;
	struct wkv *e;

	if (w->state != W_OPEN)
		return wfail(w, -HALITE_E_STATE, "writer is not open");
	if (!klen || klen > 255 || len > HLT_MAX_KV_VALUE || kvs->n >= HLT_MAX_KV)
		return wfail(w, -EINVAL, "key/value: key 1..255 bytes, value <= 1 MiB, <= %u entries",
			     HLT_MAX_KV);
	for (uint32_t i = 0; i < kvs->n; i++)
		if (!strcmp(kvs->v[i].key, key))
			return wfail(w, -EEXIST, "key '%s' set twice", key);
	if (grow32((void **)&kvs->v, sizeof(*kvs->v), &kvs->cap, kvs->n + 1))
		return -ENOMEM;
	e = &kvs->v[kvs->n];
	e->key = strdup(key);
	e->value = malloc(len ? len : 1);
	if (!e->key || !e->value) {
		free(e->key);
		free(e->value);
		return -ENOMEM;
	}
	memcpy(e->value, value, len);
	e->len = len;
	kvs->n++;
	return 0;
}

HALITE_EXPORT int halite_writer_set_meta(struct halite_writer *w, const char *key, const void *value,
			   uint32_t len)
{
	return kv_add(w, &w->meta, key, value, len);
}

HALITE_EXPORT int halite_writer_set_stat(struct halite_writer *w, const char *key, uint64_t value)
{
	uint8_t v[8];

	halite_put_le64(v, value);
	return kv_add(w, &w->stats, key, v, sizeof(v));
}

static void kvs_free(struct wkvs *kvs)
{
	for (uint32_t i = 0; i < kvs->n; i++) {
		free(kvs->v[i].key);
		free(kvs->v[i].value);
	}
	free(kvs->v);
}

/*
 * An unfinished file: removed, or kept under TARGET.incomplete, never the
 * target's own name (that would replace an older, good file with one that
 * every reader refuses). rename() replaces an older TARGET.incomplete.
 */
static void drop_temp(struct halite_writer *w, bool unlink_incomplete)
{
	if (unlink_incomplete)
		unlink(w->tmp_path);
	else if (rename(w->tmp_path, w->incomplete_path))
		halite_logf(&w->log, HALITE_LOG_WARN, "%s: the incomplete file is left as %s: "
			    "renaming it to %s: %s", w->path, w->tmp_path, w->incomplete_path,
			    strerror(errno));
	else
		halite_logf(&w->log, HALITE_LOG_INFO, "%s: the incomplete file is kept as %s",
			    w->path, w->incomplete_path);
}

HALITE_EXPORT void halite_writer_free(struct halite_writer *w, bool unlink_incomplete)
{
	if (!w)
		return;
	if (w->io) {
		/*
		 * The kernel reads the buffers of writes in flight: wait for
		 * them (close waits too, should reaping fail) before freeing.
		 */
		wr_lb_drain(w);
		halite_io_close(w->io);
	}
	if (w->tmp_path)
		drop_temp(w, unlink_incomplete);
	for (uint32_t i = 0; w->flight && i < w->qd; i++)
		halite_io_free(w->flight[i].buf);
	for (uint32_t i = 0; i < w->nlb_free; i++)
		halite_io_free(w->lb_free[i]);
	for (uint32_t i = 0; i < w->nstreams; i++) {
		halite_io_free(w->streams[i].buf);
		free(w->streams[i].memb);
	}
	free(w->flight);
	free(w->slot_free);
	free(w->lb_free);
	for (uint32_t i = 0; w->regions && i < w->nregions; i++)
		free(w->regions[i].name);
	free(w->streams);
	free(w->regions);
	free(w->map);
	free(w->lbs);
	free(w->scratch);
	free(w->device_state);
	free(w->roots);
	kvs_free(&w->meta);
	kvs_free(&w->stats);
	free(w->path);
	free(w->tmp_path);
	free(w->incomplete_path);
	free(w);
}

HALITE_EXPORT const char *halite_writer_errmsg(const struct halite_writer *w)
{
	return w->errmsg;
}

void halite_writer_test_fail_writes(struct halite_writer *w, uint64_t after, int err)
{
	halite_io_test_fail_writes(w->io, after, err);
}

int halite_writer_test_io_backend(const struct halite_writer *w)
{
	return halite_io_backend(w->io);
}

int halite_writer_test_open_temp(const char *target, uint64_t seed, char **tmp)
{
	return open_temp(target, seed, tmp);
}
