/* SPDX-License-Identifier: MIT */
/*
 * Format v1 writer (docs/format.md).
 *
 * One pass, front to back: the header at create, each stream's locality block
 * when it fills (so a stream's blocks land in the file in the order the guest
 * touched them, and blocks of different streams interleave in fill order),
 * then at finish the sections, the directory and the footer, which is written
 * last so that a file cut short anywhere is recognisably incomplete.
 *
 * An MB's map entry can only be written once its LB has an index, and LBs are
 * numbered in the order they are written; so members of an open LB are kept
 * beside it and their entries filled in when it is sealed. Until then the
 * entry holds the invalid state 3, which marks "put, pending" and is never
 * written to the file.
 *
 * Locality-block writes are asynchronous (io_uring, libaio, or pwrite done at
 * submit; halite/src/io.h). Sealing an LB checksums it, submits the write of
 * the stream's buffer, and hands the stream a fresh buffer; the written one
 * comes back to a free list when its write completes. LBs get their index and
 * file offset when sealed, so writes are submitted in ascending file order:
 * the file still grows front to back. Sealing waits for a completion only
 * when queue_depth writes are in flight, and collects whatever else has
 * completed without waiting, so a failed write is seen early. Everything is
 * collected before the sections and the footer are written: the footer is
 * still written only once every LB it vouches for has been written.
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

#define HLT_MB_PENDING HLT_MB_STATE_INVALID
#define TAIL_BUF_SIZE (1u << 20)
/*
 * LB writes in flight by default: 8 x 64 KiB keeps a disk busy while the
 * caller fills the next blocks, for 8 extra buffers.
 */
#define WRITER_QD_DEFAULT 8u
/* Completions collected per halite_io_reap() call. */
#define REAP_BATCH 16u

_Static_assert(HALITE_WRITER_MAX_QUEUE_DEPTH == HALITE_IO_QD_MAX,
	       "the writer's queue depth goes straight to halite_io_open()");

struct wmember {
	uint64_t mb;
	uint32_t offset;
	uint32_t length;
	bool compressed;
};

struct wstream {
	uint32_t id;
	uint32_t seq;	   /* seq of the open LB */
	uint8_t *buf;	   /* lb_size bytes, I/O aligned; owned by the stream */
	uint32_t used;
	struct wmember *memb;
	uint32_t nmemb, memb_cap;
};

struct wregion {
	char *name;
	uint64_t gpa, length, first_mb, mb_count;
};

struct wlb {
	uint32_t stream, seq, used, mb_count;
	uint64_t checksum;
};

/* An LB write in flight; its slot index is the request's tag. */
struct wflight {
	uint64_t lb;	   /* LB index: names it and its offset if the write fails */
	uint8_t *buf;	   /* owned by the kernel until the completion is reaped */
};

struct wkv {
	char *key;
	uint8_t *value;
	uint32_t len;
};

struct wkvs {
	struct wkv *v;
	uint32_t n, cap;
};

struct wdirent {
	uint32_t type;
	uint64_t offset, length, checksum;
};

enum { W_OPEN, W_FAILED, W_FINISHED };

struct halite_writer {
	char *path;		/* the target */
	char *tmp_path;		/* the file until finish renames it; NULL once it has */
	char *incomplete_path;	/* where an unfinished file is kept: TARGET.incomplete */
	struct halite_io *io;
	int state;
	unsigned flags;

	uint32_t page_size, mb_pages, mb_size, lb_size, lb_shift;
	int codec, level;
	uint8_t uuid[16];
	uint64_t file_seed;

	struct wregion *regions;
	uint32_t nregions;
	uint64_t mb_count;
	uint64_t *map;

	struct wstream *streams;
	uint32_t nstreams, streams_cap, last_stream;

	struct wlb *lbs;
	uint64_t lb_count, lbs_cap;

	/* Asynchronous LB writes: qd slots, and the LB buffers no one holds. */
	unsigned qd;
	struct wflight *flight;	/* qd; .buf == NULL when the slot is free */
	uint32_t *slot_free;	/* qd; a stack of free slot indices */
	uint32_t nslot_free;
	uint8_t **lb_free;	/* qd; a stack of idle lb_size buffers (lb_buf_get) */
	uint32_t nlb_free;

	uint8_t *scratch; /* compression output, mb_size */

	uint8_t *device_state;
	uint64_t device_state_len;
	bool has_device_state;
	uint32_t vcpu_count;
	struct halite_root *roots;
	uint32_t nroots, roots_cap;
	struct wkvs meta, stats;

	struct halite_logger log;
	char errmsg[256];
};

__attribute__((format(printf, 3, 4)))
static int wfail(struct halite_writer *w, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	halite_vformat_error(w->errmsg, sizeof(w->errmsg), err, fmt, ap);
	va_end(ap);
	halite_logf(&w->log, HALITE_LOG_ERROR, "%s", w->errmsg);
	return err < 0 ? err : -err;
}

/* An I/O failure leaves the file inconsistent: no further writes. */
#define wfail_io(w, err, ...) ((w)->state = W_FAILED, wfail((w), (err), __VA_ARGS__))

static int grow(void **p, size_t elem, uint64_t *cap, uint64_t need)
{
	uint64_t ncap = *cap ? *cap : 16;
	void *np;

	if (need <= *cap)
		return 0;
	while (ncap < need)
		ncap *= 2;
	np = realloc(*p, ncap * elem);
	if (!np)
		return -ENOMEM;
	*p = np;
	*cap = ncap;
	return 0;
}

static int grow32(void **p, size_t elem, uint32_t *cap, uint32_t need)
{
	uint64_t c = *cap;
	int ret = grow(p, elem, &c, need);

	if (!ret)
		*cap = (uint32_t)c;
	return ret;
}

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

/* Format 1.0 asked for: no chunked index, minor 0, no incompat flag. */
static bool v1_0(const struct halite_writer *w)
{
	return w->flags & HALITE_WRITER_V1_0;
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

static const struct wregion *region_of(const struct wregion *r, uint32_t n, uint64_t mb)
{
	return &r[halite_find_first_mb(r, n, sizeof(*r), offsetof(struct wregion, first_mb), mb)];
}

HALITE_EXPORT uint32_t halite_writer_mb_bytes(const struct halite_writer *w, uint64_t mb)
{
	const struct wregion *r;
	uint64_t off;

	if (mb >= w->mb_count)
		return 0;
	r = region_of(w->regions, w->nregions, mb);
	off = (mb - r->first_mb) * w->mb_size;
	return (uint32_t)HALITE_MIN((uint64_t)w->mb_size, r->length - off);
}

static struct wstream *find_stream(struct halite_writer *w, uint32_t id, bool create)
{
	struct wstream *s;

	if (w->nstreams && w->streams[w->last_stream].id == id)
		return &w->streams[w->last_stream];
	for (uint32_t i = 0; i < w->nstreams; i++) {
		if (w->streams[i].id == id) {
			w->last_stream = i;
			return &w->streams[i];
		}
	}
	if (!create)
		return NULL;
	if (grow32((void **)&w->streams, sizeof(*w->streams), &w->streams_cap, w->nstreams + 1))
		return NULL;
	s = &w->streams[w->nstreams];
	*s = (struct wstream){ .id = id };
	s->buf = halite_io_alloc(w->lb_size);
	if (!s->buf)
		return NULL;
	w->last_stream = w->nstreams++;
	return s;
}

static uint64_t lb_offset(const struct halite_writer *w, uint64_t idx)
{
	return HLT_DATA_OFFSET + idx * w->lb_size;
}

/* The same failure, and words, whether the write failed at submit or at completion. */
static int lb_write_failed(struct halite_writer *w, int err, uint64_t idx)
{
	return wfail_io(w, err, "%s: writing locality block %llu at offset %llu", w->path,
			(unsigned long long)idx, (unsigned long long)lb_offset(w, idx));
}

/*
 * Collect completed LB writes, waiting until at least @min have completed
 * (min <= in flight): their buffers go back to the free list. Returns 0 or,
 * when a write failed, its error, and the writer is failed.
 *
 * Writes complete in any order: after a failure the rest are waited for, and
 * the one reported is the first failed LB in file order, the one a
 * synchronous writer would have stopped at. Only the first failure of a
 * writer is reported (logged, errmsg); later calls just return the error.
 */
static int lb_reap(struct halite_writer *w, unsigned min)
{
	struct halite_io_done done[REAP_BATCH];
	uint64_t bad_lb = UINT64_MAX;
	int bad_err = 0;

	while (halite_io_inflight(w->io)) {
		int n = halite_io_reap(w->io, done, REAP_BATCH, HALITE_MIN(min, REAP_BATCH));

		if (n < 0) {
			/* Cannot wait: the writes may still be running (close waits). */
			if (bad_err)
				break;
			if (w->state == W_FAILED)
				return n;
			return wfail_io(w, n, "%s: waiting for locality-block writes", w->path);
		}
		for (int i = 0; i < n; i++) {
			struct wflight *f = &w->flight[done[i].tag];
			int64_t res = done[i].res;

			/* The I/O layer continues short transfers: short is a failure. */
			if (res != (int64_t)w->lb_size && f->lb < bad_lb) {
				bad_lb = f->lb;
				bad_err = res < 0 ? (int)res : -EIO;
			}
			w->lb_free[w->nlb_free++] = f->buf;
			f->buf = NULL;
			w->slot_free[w->nslot_free++] = (uint32_t)done[i].tag;
		}
		min -= HALITE_MIN(min, (unsigned)n);
		if (bad_err)
			min = halite_io_inflight(w->io);
		if (!min && (unsigned)n < REAP_BATCH)
			break;
	}
	if (!bad_err)
		return 0;
	if (w->state == W_FAILED)
		return bad_err;
	return lb_write_failed(w, bad_err, bad_lb);
}

/* Wait for every LB write in flight. */
static int lb_drain(struct halite_writer *w)
{
	return lb_reap(w, halite_io_inflight(w->io));
}

/*
 * An idle LB buffer for a stream whose buffer is about to be submitted: from
 * the free list, else a new one. Each stream always holds one buffer (its
 * own, allocated with it), and a new one is made only when none is idle and
 * fewer than qd writes are in flight, so there are never more than qd
 * buffers in flight or idle: qd + nstreams in all, and the free list (qd
 * entries) cannot overflow.
 */
static uint8_t *lb_buf_get(struct halite_writer *w)
{
	if (w->nlb_free)
		return w->lb_free[--w->nlb_free];
	return halite_io_alloc(w->lb_size);
}

static int seal(struct halite_writer *w, struct wstream *s)
{
	uint64_t idx = w->lb_count;
	uint32_t slot;
	uint8_t *next;
	struct wlb *lb;
	int ret;

	if (!s->used)
		return 0;
	if (idx >= hlt_mb_max_lbs(w->lb_shift))
		return wfail_io(w, -HALITE_E_LIMIT, "more than %llu locality blocks of %u bytes",
				(unsigned long long)hlt_mb_max_lbs(w->lb_shift), w->lb_size);
	if (grow((void **)&w->lbs, sizeof(*w->lbs), &w->lbs_cap, idx + 1))
		return wfail_io(w, -ENOMEM, "LB table");
	/* Wait for a slot only when all are taken; collect what is done either way. */
	ret = lb_reap(w, halite_io_inflight(w->io) >= w->qd ? 1 : 0);
	if (ret)
		return ret;
	next = lb_buf_get(w);
	if (!next)
		return wfail_io(w, -ENOMEM, "locality block buffer");
	memset(s->buf + s->used, 0, w->lb_size - s->used);
	lb = &w->lbs[idx];
	*lb = (struct wlb){
		.stream = s->id,
		.seq = s->seq,
		.used = s->used,
		.mb_count = s->nmemb,
		.checksum = hlt_hash(s->buf, w->lb_size, w->file_seed + idx),
	};
	slot = w->slot_free[--w->nslot_free];
	ret = halite_io_submit_write(w->io, s->buf, w->lb_size, lb_offset(w, idx), slot);
	if (ret) {
		w->slot_free[w->nslot_free++] = slot;
		w->lb_free[w->nlb_free++] = next;
		return lb_write_failed(w, ret, idx);
	}
	/* The buffer is the kernel's until its completion is reaped. */
	w->flight[slot] = (struct wflight){ .lb = idx, .buf = s->buf };
	s->buf = next;
	for (uint32_t i = 0; i < s->nmemb; i++) {
		const struct wmember *m = &s->memb[i];

		w->map[m->mb] = hlt_mb_encode_stored(w->lb_shift, idx, m->offset, m->length,
						     m->compressed);
	}
	w->lb_count++;
	s->seq++;
	s->used = 0;
	s->nmemb = 0;
	return 0;
}

static int check_put(struct halite_writer *w, uint64_t mb)
{
	if (w->state != W_OPEN)
		return wfail(w, -HALITE_E_STATE, "writer is %s",
			     w->state == W_FAILED ? "failed" : "finished");
	if (mb >= w->mb_count)
		return wfail(w, -ERANGE, "memory block %llu of %llu", (unsigned long long)mb,
			     (unsigned long long)w->mb_count);
	if (w->map[mb])
		return wfail(w, -HALITE_E_STATE, "memory block %llu saved twice",
			     (unsigned long long)mb);
	return 0;
}

HALITE_EXPORT int halite_writer_put_encoded(struct halite_writer *w, uint32_t stream, uint64_t mb,
			      const void *payload, uint32_t len, bool compressed)
{
	struct wstream *s;
	uint32_t bytes;
	int ret;

	ret = check_put(w, mb);
	if (ret)
		return ret;
	bytes = halite_writer_mb_bytes(w, mb);
	if (!len || (compressed ? len >= bytes : len != bytes) ||
	    (compressed && w->codec == HALITE_CODEC_NONE))
		return wfail(w, -EINVAL, "memory block %llu: %s length %u for %u bytes",
			     (unsigned long long)mb, compressed ? "compressed" : "raw", len, bytes);
	s = find_stream(w, stream, true);
	if (!s)
		return wfail(w, -ENOMEM, "stream");
	if (s->used + len > w->lb_size) {
		ret = seal(w, s);
		if (ret)
			return ret;
	}
	if (grow32((void **)&s->memb, sizeof(*s->memb), &s->memb_cap, s->nmemb + 1))
		return wfail(w, -ENOMEM, "stream members");
	memcpy(s->buf + s->used, payload, len);
	s->memb[s->nmemb++] = (struct wmember){ mb, s->used, len, compressed };
	s->used += len;
	w->map[mb] = HLT_MB_PENDING;
	return 0;
}

HALITE_EXPORT int halite_writer_put(struct halite_writer *w, uint32_t stream, uint64_t mb, const void *data)
{
	uint32_t bytes;
	int ret, clen;

	ret = check_put(w, mb);
	if (ret)
		return ret;
	bytes = halite_writer_mb_bytes(w, mb);
	if (halite_all_zero(data, bytes)) {
		w->map[mb] = HALITE_MB_ZERO;
		return 0;
	}
	clen = halite_compress(w->codec, w->level, data, bytes, w->scratch, bytes - 1);
	if (clen > 0)
		return halite_writer_put_encoded(w, stream, mb, w->scratch, (uint32_t)clen, true);
	if (clen != -HALITE_E_LIMIT)
		return wfail(w, clen, "compressing memory block %llu", (unsigned long long)mb);
	return halite_writer_put_encoded(w, stream, mb, data, bytes, false);
}

HALITE_EXPORT int halite_writer_put_zero(struct halite_writer *w, uint64_t mb)
{
	int ret = check_put(w, mb);

	if (!ret)
		w->map[mb] = HALITE_MB_ZERO;
	return ret;
}

HALITE_EXPORT int halite_writer_flush_stream(struct halite_writer *w, uint32_t stream)
{
	struct wstream *s;
	int ret;

	if (w->state != W_OPEN)
		return wfail(w, -HALITE_E_STATE, "writer is not open");
	s = find_stream(w, stream, false);
	ret = s ? seal(w, s) : 0;
	return ret ? ret : lb_drain(w);
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

/* ---- tail: sections, directory, footer, through one buffer ---- */

struct tail {
	struct halite_writer *w;
	uint8_t *buf;
	size_t len;
	uint64_t off; /* file offset of buf[0] */
	XXH3_state_t hash;
	uint64_t sec_start;
	struct wdirent dir[HLT_MAX_SECTIONS];
	uint32_t ndir;
	/* 1.1: the chunk checksums of the section being written, for the index. */
	struct wchunks *ck;
};

/*
 * Format 1.1's chunked index (docs/format.md 5.7): what the index section
 * says of the mb-map, lb-table and lb-members sections, gathered as they
 * are written.
 */
struct wchunks {
	XXH3_state_t h;
	uint32_t type, esize;
	uint64_t per, in, c; /* entries per chunk, entries in chunk c so far */
	uint64_t *sum;
};

struct windex {
	struct wchunks map, lbt, mem;
	uint64_t *lbt_first; /* first member of each lb-table chunk */
	uint64_t *members;   /* stored MBs by LB, each LB's in offset order */
	uint64_t stored, zero, compressed, bytes;
};

static uint64_t tail_pos(const struct tail *t)
{
	return t->off + t->len;
}

static int tail_flush(struct tail *t)
{
	int ret;

	if (!t->len)
		return 0;
	ret = halite_io_write(t->w->io, t->buf, t->len, t->off);
	if (ret)
		return wfail_io(t->w, ret, "%s: writing sections at offset %llu", t->w->path,
				(unsigned long long)t->off);
	t->off += t->len;
	t->len = 0;
	return 0;
}

static int tail_raw(struct tail *t, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n) {
		size_t chunk = HALITE_MIN(n, TAIL_BUF_SIZE - t->len);
		int ret;

		memcpy(t->buf + t->len, b, chunk);
		t->len += chunk;
		b += chunk;
		n -= chunk;
		if (t->len == TAIL_BUF_SIZE) {
			ret = tail_flush(t);
			if (ret)
				return ret;
		}
	}
	return 0;
}

static int tail_put(struct tail *t, const void *p, size_t n)
{
	XXH3_64bits_update(&t->hash, p, n);
	return tail_raw(t, p, n);
}

/*
 * @n whole entries of @esize bytes: tail_put, and with a 1.1 index being
 * gathered (t->ck), into the checksums of the chunks they fall in.
 */
static int tail_entries(struct tail *t, const uint8_t *p, uint64_t n, uint32_t esize)
{
	struct wchunks *k = t->ck;
	int ret = tail_put(t, p, n * esize);

	while (!ret && k && n) {
		uint64_t take = HALITE_MIN(n, k->per - k->in);

		if (!k->in)
			XXH3_64bits_reset_withSeed(&k->h, hlt_chunk_seed(t->w->file_seed, k->type, k->c));
		XXH3_64bits_update(&k->h, p, take * esize);
		k->in += take;
		if (k->in == k->per) {
			k->sum[k->c++] = XXH3_64bits_digest(&k->h);
			k->in = 0;
		}
		n -= take;
		p += take * esize;
	}
	return ret;
}

/* The last, partial chunk's checksum. */
static void chunks_end(struct wchunks *k)
{
	if (k && k->in) {
		k->sum[k->c++] = XXH3_64bits_digest(&k->h);
		k->in = 0;
	}
}

static int tail_zeros(struct tail *t, size_t n, bool hashed)
{
	static const uint8_t zeros[8];

	while (n) {
		size_t c = HALITE_MIN(n, sizeof(zeros));
		int ret = hashed ? tail_put(t, zeros, c) : tail_raw(t, zeros, c);

		if (ret)
			return ret;
		n -= c;
	}
	return 0;
}

static int tail_begin(struct tail *t)
{
	int ret = tail_zeros(t, hlt_pad8(tail_pos(t)) - tail_pos(t), false);

	t->sec_start = tail_pos(t);
	XXH3_64bits_reset_withSeed(&t->hash, t->w->file_seed);
	return ret;
}

static void tail_end(struct tail *t, uint32_t type)
{
	t->dir[t->ndir++] = (struct wdirent){
		.type = type,
		.offset = t->sec_start,
		.length = tail_pos(t) - t->sec_start,
		.checksum = XXH3_64bits_digest(&t->hash),
	};
}

static int put_regions(struct tail *t)
{
	struct halite_writer *w = t->w;
	uint8_t e[HLT_REG_ENTRY_SIZE] = { 0 };
	int ret;

	halite_put_le32(e, w->nregions);
	ret = tail_put(t, e, HLT_REG_HDR_SIZE);
	for (uint32_t i = 0; !ret && i < w->nregions; i++) {
		const struct wregion *r = &w->regions[i];
		size_t nlen = strlen(r->name);

		memset(e, 0, sizeof(e));
		halite_put_le64(e + HLT_REG_GPA, r->gpa);
		halite_put_le64(e + HLT_REG_LENGTH, r->length);
		halite_put_le64(e + HLT_REG_FIRST_MB, r->first_mb);
		halite_put_le16(e + HLT_REG_NAME_LEN, (uint16_t)nlen);
		ret = tail_put(t, e, sizeof(e));
		if (!ret)
			ret = tail_put(t, r->name, nlen);
		if (!ret)
			ret = tail_zeros(t, hlt_pad8(nlen) - nlen, true);
	}
	return ret;
}

/* @n u64 entries (the mb-map, lb-members), little-endian, into the chunks being gathered. */
static int put_u64s(struct tail *t, const uint64_t *v, uint64_t n)
{
	uint8_t chunk[4096];
	int ret = 0;

	for (uint64_t i = 0; !ret && i < n; i += sizeof(chunk) / 8) {
		uint64_t k = HALITE_MIN((uint64_t)sizeof(chunk) / 8, n - i);

		for (uint64_t j = 0; j < k; j++)
			halite_put_le64(chunk + 8 * j, v[i + j]);
		ret = tail_entries(t, chunk, k, 8);
	}
	chunks_end(t->ck);
	return ret;
}

static int put_map(struct tail *t)
{
	return put_u64s(t, t->w->map, t->w->mb_count);
}

static int put_lb_table(struct tail *t)
{
	struct halite_writer *w = t->w;
	uint8_t e[HLT_LBT_ENTRY_SIZE];
	int ret = 0;

	for (uint64_t i = 0; !ret && i < w->lb_count; i++) {
		halite_put_le32(e + HLT_LBT_STREAM, w->lbs[i].stream);
		halite_put_le32(e + HLT_LBT_SEQ, w->lbs[i].seq);
		halite_put_le32(e + HLT_LBT_USED, w->lbs[i].used);
		halite_put_le32(e + HLT_LBT_MB_COUNT, w->lbs[i].mb_count);
		halite_put_le64(e + HLT_LBT_CHECKSUM, w->lbs[i].checksum);
		ret = tail_entries(t, e, 1, sizeof(e));
	}
	chunks_end(t->ck);
	return ret;
}

static int chunks_alloc(struct wchunks *k, uint32_t type, uint64_t per, uint64_t entries)
{
	k->type = type;
	k->per = per;
	k->sum = calloc((entries + per - 1) / per + 1, sizeof(*k->sum));
	return k->sum ? 0 : -ENOMEM;
}

static void index_free(struct windex *x)
{
	free(x->map.sum);
	free(x->lbt.sum);
	free(x->mem.sum);
	free(x->lbt_first);
	free(x->members);
}

/*
 * What a 1.1 index needs beyond the map and LB table: the totals, and each
 * LB's members in offset order (the seal that packed them is long gone).
 */
static int index_build(struct halite_writer *w, struct windex *x)
{
	uint64_t *fill, nlbt = (w->lb_count + HLT_LBT_CHUNK - 1) / HLT_LBT_CHUNK, at = 0;
	struct hlt_offset_key key = { w->map, w->lb_shift };

	for (uint64_t m = 0; m < w->mb_count; m++) {
		struct halite_mb_loc loc;

		hlt_mb_decode(w->map[m], w->lb_shift, &loc);
		x->zero += loc.state == HALITE_MB_ZERO;
		if (loc.state != HALITE_MB_STORED)
			continue;
		x->stored++;
		x->compressed += loc.compressed;
		x->bytes += loc.length;
	}
	x->members = malloc((x->stored + 1) * sizeof(*x->members));
	x->lbt_first = calloc(nlbt + 1, sizeof(*x->lbt_first));
	fill = malloc((w->lb_count + 1) * sizeof(*fill));
	if (!x->members || !x->lbt_first || !fill ||
	    chunks_alloc(&x->map, HALITE_SECTION_MB_MAP, HLT_MAP_CHUNK, w->mb_count) ||
	    chunks_alloc(&x->lbt, HALITE_SECTION_LB_TABLE, HLT_LBT_CHUNK, w->lb_count) ||
	    chunks_alloc(&x->mem, HALITE_SECTION_LB_MEMBERS, HLT_MEM_CHUNK, x->stored)) {
		free(fill);
		return wfail_io(w, -ENOMEM, "chunked index of %llu memory blocks",
				(unsigned long long)w->mb_count);
	}
	for (uint64_t i = 0; i < w->lb_count; i++) {
		if (i % HLT_LBT_CHUNK == 0)
			x->lbt_first[i / HLT_LBT_CHUNK] = at;
		fill[i] = at;
		at += w->lbs[i].mb_count;
	}
	for (uint64_t m = 0; m < w->mb_count; m++)
		if ((w->map[m] & HLT_MB_STATE_MASK) == HALITE_MB_STORED)
			x->members[fill[w->map[m] >> (3 + 2 * w->lb_shift)]++] = m;
	for (uint64_t i = 0; i < w->lb_count; i++)
		qsort_r(x->members + fill[i] - w->lbs[i].mb_count, w->lbs[i].mb_count,
			sizeof(*x->members), hlt_cmp_offset, &key);
	free(fill);
	return 0;
}

static int put_members(struct tail *t, const struct windex *x)
{
	return put_u64s(t, x->members, x->stored);
}

static int put_index(struct tail *t, const struct windex *x)
{
	uint8_t h[HLT_IDX_HDR_SIZE] = { 0 }, e[HLT_IDX_LBT_ENTRY];
	int ret;

	halite_put_le32(h + HLT_IDX_MAP_CHUNK, HLT_MAP_CHUNK);
	halite_put_le32(h + HLT_IDX_LBT_CHUNK, HLT_LBT_CHUNK);
	halite_put_le32(h + HLT_IDX_MEM_CHUNK, HLT_MEM_CHUNK);
	halite_put_le64(h + HLT_IDX_MB_STORED, x->stored);
	halite_put_le64(h + HLT_IDX_MB_ZERO, x->zero);
	halite_put_le64(h + HLT_IDX_MB_COMPRESSED, x->compressed);
	halite_put_le64(h + HLT_IDX_STORED_BYTES, x->bytes);
	ret = tail_put(t, h, sizeof(h));
	for (uint64_t c = 0; !ret && c < x->map.c; c++) {
		halite_put_le64(e, x->map.sum[c]);
		ret = tail_put(t, e, HLT_IDX_MAP_ENTRY);
	}
	for (uint64_t c = 0; !ret && c < x->lbt.c; c++) {
		halite_put_le64(e, x->lbt_first[c]);
		halite_put_le64(e + 8, x->lbt.sum[c]);
		ret = tail_put(t, e, HLT_IDX_LBT_ENTRY);
	}
	for (uint64_t c = 0; !ret && c < x->mem.c; c++) {
		halite_put_le64(e, x->mem.sum[c]);
		ret = tail_put(t, e, HLT_IDX_MEM_ENTRY);
	}
	return ret;
}

static int put_vcpus(struct tail *t)
{
	struct halite_writer *w = t->w;
	uint8_t e[HLT_VCPU_ROOT_SIZE];
	int ret;

	halite_put_le32(e, w->vcpu_count);
	halite_put_le32(e + 4, w->nroots);
	ret = tail_put(t, e, HLT_VCPU_HDR_SIZE);
	for (uint32_t i = 0; !ret && i < w->nroots; i++) {
		halite_put_le32(e, w->roots[i].vcpu);
		halite_put_le32(e + 4, w->roots[i].mode);
		halite_put_le64(e + 8, w->roots[i].cr3);
		ret = tail_put(t, e, sizeof(e));
	}
	return ret;
}

static int put_kvs(struct tail *t, const struct wkvs *kvs)
{
	uint8_t e[HLT_KV_ENTRY_HDR] = { 0 };
	int ret;

	halite_put_le32(e, kvs->n);
	ret = tail_put(t, e, HLT_KV_HDR_SIZE);
	for (uint32_t i = 0; !ret && i < kvs->n; i++) {
		size_t klen = strlen(kvs->v[i].key);
		size_t n = klen + kvs->v[i].len;

		memset(e, 0, sizeof(e));
		halite_put_le16(e, (uint16_t)klen);
		halite_put_le32(e + 4, kvs->v[i].len);
		ret = tail_put(t, e, sizeof(e));
		if (!ret)
			ret = tail_put(t, kvs->v[i].key, klen);
		if (!ret)
			ret = tail_put(t, kvs->v[i].value, kvs->v[i].len);
		if (!ret)
			ret = tail_zeros(t, hlt_pad8(n) - n, true);
	}
	return ret;
}

static int put_section(struct tail *t, uint32_t type, int (*fn)(struct tail *t, const void *arg),
		       const void *arg)
{
	int ret = tail_begin(t);

	if (!ret)
		ret = fn(t, arg);
	if (!ret)
		tail_end(t, type);
	return ret;
}

static int fn_regions(struct tail *t, const void *arg) { return put_regions(t); }
static int fn_map(struct tail *t, const void *arg) { return put_map(t); }
static int fn_lbt(struct tail *t, const void *arg) { return put_lb_table(t); }
static int fn_vcpus(struct tail *t, const void *arg) { return put_vcpus(t); }
static int fn_kvs(struct tail *t, const void *arg) { return put_kvs(t, arg); }
static int fn_members(struct tail *t, const void *arg) { return put_members(t, arg); }
static int fn_index(struct tail *t, const void *arg) { return put_index(t, arg); }

static int fn_device(struct tail *t, const void *arg)
{
	return tail_put(t, t->w->device_state, t->w->device_state_len);
}

static int put_dir_footer(struct tail *t)
{
	struct halite_writer *w = t->w;
	uint8_t e[HLT_DIR_ENTRY_SIZE], f[HLT_FTR_SIZE] = { 0 };
	uint64_t dir_off;
	int ret;

	ret = tail_begin(t);
	dir_off = tail_pos(t);
	for (uint32_t i = 0; !ret && i < t->ndir; i++) {
		memset(e, 0, sizeof(e));
		halite_put_le32(e + HLT_DIR_TYPE, t->dir[i].type);
		halite_put_le64(e + HLT_DIR_OFFSET, t->dir[i].offset);
		halite_put_le64(e + HLT_DIR_LENGTH, t->dir[i].length);
		halite_put_le64(e + HLT_DIR_CHECKSUM, t->dir[i].checksum);
		ret = tail_put(t, e, sizeof(e));
	}
	if (ret)
		return ret;
	memcpy(f, HLT_FTR_MAGIC, 8);
	memcpy(f + HLT_FTR_UUID, w->uuid, 16);
	halite_put_le64(f + HLT_FTR_LB_COUNT, w->lb_count);
	halite_put_le64(f + HLT_FTR_DIR_OFFSET, dir_off);
	halite_put_le32(f + HLT_FTR_SECTION_COUNT, t->ndir);
	halite_put_le64(f + HLT_FTR_DIR_CHECKSUM, XXH3_64bits_digest(&t->hash));
	halite_put_le64(f + HLT_FTR_CHECKSUM, hlt_hash(f, HLT_FTR_CHECKSUM, 0));
	/* The footer goes out in its own write, after everything it vouches for. */
	ret = tail_flush(t);
	if (!ret)
		ret = tail_raw(t, f, sizeof(f));
	if (!ret)
		ret = tail_flush(t);
	return ret;
}

/*
 * The new name must survive a crash too. Past the rename the file is
 * complete and in place, so a failure here is a warning, not a failed save
 * (a caller would remove or report a snapshot that is there); EINVAL is a
 * file system that has nothing to sync for directories.
 */
static void sync_dir(struct halite_writer *w)
{
	char *copy = strdup(w->path);
	int fd, err = ENOMEM;

	if (copy) {
		fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		err = fd < 0 ? errno : fsync(fd) ? errno : 0;
		if (fd >= 0)
			close(fd);
		free(copy);
	}
	if (err && err != EINVAL)
		halite_logf(&w->log, HALITE_LOG_WARN, "%s: syncing its directory: %s (the file "
			    "is complete; a crash now could lose its new name)", w->path,
			    strerror(err));
}

/*
 * Put the complete file in the target's place. fdatasync comes first: after
 * a crash the target's name must never point at a file whose blocks did not
 * reach the disk. Until the rename, every failure leaves the target as it was.
 */
static int commit(struct halite_writer *w)
{
	int ret;

	if (!(w->flags & HALITE_WRITER_NO_SYNC)) {
		ret = halite_io_sync(w->io);
		if (ret)
			return wfail_io(w, ret, "%s: fdatasync", w->path);
	}
	/*
	 * A restore that opened the older file since create checked keeps
	 * reading it (its inode): the complete new snapshot is not given up.
	 */
	if (rename(w->tmp_path, w->path))
		return wfail_io(w, -errno, "%s: renaming the new file over it", w->path);
	free(w->tmp_path);
	w->tmp_path = NULL;
	w->state = W_FINISHED;
	if (!(w->flags & HALITE_WRITER_NO_SYNC))
		sync_dir(w);
	return 0;
}

HALITE_EXPORT int halite_writer_finish(struct halite_writer *w)
{
	struct tail t = { .w = w };
	struct windex x = { 0 };
	int ret = 0, fd;

	if (w->state != W_OPEN)
		return wfail(w, -HALITE_E_STATE, "writer is not open");
	for (uint32_t i = 0; !ret && i < w->nstreams; i++)
		ret = seal(w, &w->streams[i]);
	/* The tail goes after the LBs, and the footer after all it vouches for. */
	if (!ret)
		ret = lb_drain(w);
	if (ret)
		return ret;
	/* Sections are not block sized: leave O_DIRECT for the tail. */
	fd = halite_io_fd(w->io);
	if ((w->flags & HALITE_WRITER_DIRECT) &&
	    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT))
		return wfail_io(w, -errno, "%s: clearing O_DIRECT", w->path);
	t.buf = malloc(TAIL_BUF_SIZE);
	if (!t.buf)
		return wfail_io(w, -ENOMEM, "section buffer");
	t.off = HLT_DATA_OFFSET + w->lb_count * w->lb_size;

	if (!v1_0(w))
		ret = index_build(w, &x);
	if (!ret)
		ret = put_section(&t, HALITE_SECTION_REGIONS, fn_regions, NULL);
	t.ck = v1_0(w) ? NULL : &x.map;
	if (!ret)
		ret = put_section(&t, HALITE_SECTION_MB_MAP, fn_map, NULL);
	t.ck = v1_0(w) ? NULL : &x.lbt;
	if (!ret)
		ret = put_section(&t, HALITE_SECTION_LB_TABLE, fn_lbt, NULL);
	t.ck = &x.mem;
	if (!ret && !v1_0(w))
		ret = put_section(&t, HALITE_SECTION_LB_MEMBERS, fn_members, &x);
	t.ck = NULL;
	if (!ret && !v1_0(w))
		ret = put_section(&t, HALITE_SECTION_INDEX, fn_index, &x);
	if (!ret && (w->vcpu_count || w->nroots))
		ret = put_section(&t, HALITE_SECTION_VCPUS, fn_vcpus, NULL);
	if (!ret && w->has_device_state)
		ret = put_section(&t, HALITE_SECTION_DEVICE_STATE, fn_device, NULL);
	if (!ret && w->meta.n)
		ret = put_section(&t, HALITE_SECTION_METADATA, fn_kvs, &w->meta);
	if (!ret && w->stats.n)
		ret = put_section(&t, HALITE_SECTION_SAVE_STATS, fn_kvs, &w->stats);
	if (!ret)
		ret = put_dir_footer(&t);
	free(t.buf);
	index_free(&x);
	return ret ? ret : commit(w);
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
		lb_drain(w);
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
