// SPDX-License-Identifier: MIT
/*
 * halite-inspect import: make a snapshot file from raw memory images.
 *
 * Holes in a sparse image (SEEK_DATA/SEEK_HOLE) become never-touched memory
 * blocks, all-zero blocks become zero blocks, the rest is compressed and
 * stored in one stream: physical order, or a seeded shuffle that stands in
 * for the scattered order of a real save.
 *
 * Compression runs in the thread pool over batches of memory blocks; the
 * main thread puts each batch's results to the writer in list order while the
 * pool compresses the next batch. Since the writer packs locality blocks only
 * from the order of the puts, the same images, options and seed give the same
 * bytes whatever the thread count or timing (the uuid, creation time and the
 * checksums seeded by the uuid aside).
 */
#define _GNU_SOURCE /* mkostemp, SEEK_DATA/SEEK_HOLE */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "endian_util.h"
#include "inspect.h"
#include "pool.h"

void help_import(FILE *f)
{
	int zlo = 0, zhi = 0, llo = 0, lhi = 0, glo = 0, ghi = 0;

	halite_codec_level_range(HALITE_CODEC_ZSTD, &zlo, &zhi);
	halite_codec_level_range(HALITE_CODEC_LZ4, &llo, &lhi);
	halite_codec_level_range(HALITE_CODEC_ZLIB, &glo, &ghi);
	fprintf(f,
		"Usage: " PROG " import IMAGE --region NAME -o FILE [OPTIONS]\n"
		"       " PROG
		" import --region NAME=IMAGE[@GPA] [--region ...] -o FILE [OPTIONS]\n\n"
		"Make the snapshot FILE from raw memory images, one per region. Holes in a\n"
		"sparse image become never-touched memory blocks, all-zero blocks become\n"
		"zero blocks, and the rest is compressed in parallel. An image's length\n"
		"must be a multiple of the page size; regions must not overlap.\n\n"
		"  -r, --region NAME[=IMAGE[@GPA]]  a region (repeat for several)\n"
		"  -o, --output FILE       the snapshot to write (never an IMAGE; replaced\n"
		"                          only once complete; mode 0600: it holds guest\n"
		"                          memory)\n"
		"  --gpa ADDR              guest-physical base of the single region, a page\n"
		"                          multiple (0)\n"
		"  --order physical|random memory-block order in the file (physical)\n"
		"  --seed N                seed of the random order, 0 to 2^64-1 (default:\n"
		"                          from the clock, printed on stderr; unused by\n"
		"                          --order physical)\n"
		"  --codec none|lz4|zlib|zstd   (lz4)\n"
		"  --level N               codec level, 0 the codec's default: lz4 %d to %d,\n"
		"                          zlib %d to %d, zstd %d to %d (none: 0)\n"
		"  --page-size BYTES       a power of two, 4K to 4M (4K)\n"
		"  --mb-pages N            pages per memory block, 1 to 1024 (%u)\n"
		"  --lb-size BYTES         locality-block size, a power of two, 4K to 4M and\n"
		"                          at least one memory block (64K)\n"
		"  --meta KEY=VALUE        a metadata entry (repeatable)\n"
		"  -j, --jobs N            compression threads, 1 to 256 (default: online\n"
		"                          CPUs)\n"
		"  --no-sync               do not fdatasync the file at the end\n",
		llo, lhi, glo, ghi, zlo, zhi, HALITE_DEFAULT_MB_PAGES);
	help_image_options(f, 24);
	fputs("\nSizes take K, M and G suffixes (powers of 1024). Regions without @GPA\n"
	      "follow the previous one (the first starts at --gpa). Metadata\n"
	      "source=import, import.order and (random order) import.seed are recorded.\n\n"
	      "Exit status: 0 ok, 1 the import failed (an image that does not open or\n"
	      "read, the output not written), 2 usage: a bad option, an image that\n"
	      "cannot be a region, overlapping regions (nothing is written).\n",
	      f);
}

struct source {
	const char *name;
	const char *path;
	uint64_t gpa;
	bool has_gpa;
	int fd;
	uint64_t length;
	uint64_t first_mb, mb_count;
};

struct options {
	struct source *src;
	uint32_t nsrc;
	const char *out;
	bool random;
	bool has_seed;
	uint64_t seed;
	int codec;
	int level;
	bool has_level;
	const char *level_arg;
	int progress;
	uint32_t page_size, mb_pages, lb_size;
	uint64_t gpa;		/* --gpa */
	bool has_gpa;
	const char **meta;
	uint32_t nmeta;
	unsigned jobs;
	bool no_sync;
	bool json;
};

enum item_state { IT_ZERO, IT_RAW, IT_COMPRESSED };

struct item {
	uint64_t mb;
	uint32_t len;		/* raw length */
	uint32_t out_len;	/* compressed length */
	int state;		/* enum item_state */
	int err;		/* read or compress failure, -errno */
};

struct batch {
	struct item *items;
	uint8_t *raw, *out;	/* mb_size per item each */
	uint32_t n;
	/* Completion: the pool's wait is global, we need to wait for one batch. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint32_t pending;
};

struct task {
	struct batch *b;
	uint32_t from, to;
	const struct import *im;
};

struct import {
	const struct options *o;
	uint32_t mb_size;
	uint64_t mb_count;
	struct halite_writer *w;
	/* results */
	uint64_t stored, zero, compressed, raw_bytes, stored_bytes;
	char log[512];
	struct progress progress;
};

/* ---------------------------------------------------------------------- */
/* Deterministic shuffle: xoshiro256** seeded through splitmix64, so that a
 * seed means the same order on every platform and libc. */

struct rng {
	uint64_t s[4];
};

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void rng_seed(struct rng *r, uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(struct rng *r)
{
	uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return res;
}

/* Uniform in [0, n): rejection of the short top range, no modulo bias. */
static uint64_t rng_below(struct rng *r, uint64_t n)
{
	uint64_t limit = UINT64_MAX - UINT64_MAX % n, v;

	do
		v = rng_next(r);
	while (v >= limit);
	return v % n;
}

static void shuffle(uint64_t *v, uint64_t n, uint64_t seed)
{
	struct rng r;

	rng_seed(&r, seed);
	for (uint64_t i = n; i > 1; i--) {
		uint64_t j = rng_below(&r, i);
		uint64_t t = v[i - 1];

		v[i - 1] = v[j];
		v[j] = t;
	}
}

/* ---------------------------------------------------------------------- */

static void capture_log(void *ctx, int level, const char *msg)
{
	struct import *im = ctx;

	/* The writer is used from this thread only; keep its latest complaint. */
	if (level <= HALITE_LOG_ERROR)
		snprintf(im->log, sizeof(im->log), "%s", msg);
}

/*
 * Opens @s's image and takes its length. 0, or the exit code having said
 * why: EXIT_FAIL if it does not open, EXIT_USAGE if it cannot be a region.
 */
static int open_source(struct source *s, uint32_t page_size)
{
	struct stat st;

	s->fd = open(s->path, O_RDONLY | O_CLOEXEC);
	if (s->fd < 0 || fstat(s->fd, &st) < 0) {
		errorf("%s: cannot open: %s", s->path, strerror(errno));
		return EXIT_FAIL;
	}
	if (S_ISREG(st.st_mode)) {
		s->length = (uint64_t)st.st_size;
	} else if (S_ISBLK(st.st_mode)) {
		off_t end = lseek(s->fd, 0, SEEK_END);

		if (end < 0) {
			errorf("%s: %s", s->path, strerror(errno));
			return EXIT_FAIL;
		}
		s->length = (uint64_t)end;
	} else {
		return usage_error("%s: not a regular file or block device%s", s->path,
				   S_ISDIR(st.st_mode) ? " (a directory)" : "");
	}
	if (s->length == 0)
		return usage_error("%s: empty image: a region has at least one page", s->path);
	if (s->length % page_size) {
		uint64_t up = (s->length / page_size + 1) * page_size;

		/* The user can act: say exactly how (zeros at the end, as a hole). */
		return usage_error("%s: length %" PRIu64 " is not a multiple of the page size %u; "
				   "pad it with zeros to %" PRIu64 " bytes: truncate -s %" PRIu64
				   " %s", s->path, s->length, page_size, up, up, s->path);
	}
	return 0;
}

/*
 * Mark the memory blocks of @s that hold any data extent. Filesystems
 * without SEEK_DATA report the whole file as data (or EINVAL), which then
 * imports every block as touched: correct, only less sparse.
 */
static int mark_touched(const struct source *s, uint32_t mb_size, uint8_t *touched)
{
	uint64_t pos = 0;

	while (pos < s->length) {
		off_t d = lseek(s->fd, (off_t)pos, SEEK_DATA), h;
		uint64_t a, b;

		if (d < 0) {
			if (errno == ENXIO)
				return 0;	/* a hole up to the end */
			if (errno != EINVAL && errno != EOPNOTSUPP) {
				errorf("%s: SEEK_DATA: %s", s->path, strerror(errno));
				return -1;
			}
			d = (off_t)pos;
			h = (off_t)s->length;
		} else {
			h = lseek(s->fd, d, SEEK_HOLE);
			if (h < 0)
				h = (off_t)s->length;
		}
		if ((uint64_t)d >= s->length)
			break;
		if ((uint64_t)h > s->length)
			h = (off_t)s->length;
		if (h <= d)
			break;
		a = (uint64_t)d / mb_size;
		b = ((uint64_t)h - 1) / mb_size;
		for (uint64_t m = a; m <= b; m++) {
			uint64_t g = s->first_mb + m;

			touched[g / 8] |= (uint8_t)(1u << (g % 8));
		}
		pos = (uint64_t)h;
	}
	return 0;
}

static const struct source *source_of(const struct options *o, uint64_t mb)
{
	return &o->src[halite_find_first_mb(o->src, o->nsrc, sizeof(o->src[0]),
					    offsetof(struct source, first_mb), mb)];
}

static int read_full(int fd, void *buf, size_t len, uint64_t off)
{
	char *p = buf;

	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;	/* the image shrank under us */
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

static void encode_items(void *arg)
{
	struct task *t = arg;
	struct batch *b = t->b;
	const struct import *im = t->im;
	const struct options *o = im->o;

	for (uint32_t i = t->from; i < t->to; i++) {
		struct item *it = &b->items[i];
		const struct source *s = source_of(o, it->mb);
		uint8_t *raw = b->raw + (size_t)i * im->mb_size;
		uint8_t *out = b->out + (size_t)i * im->mb_size;
		int ret;

		it->err = read_full(s->fd, raw, it->len, (it->mb - s->first_mb) * im->mb_size);
		if (it->err)
			continue;
		if (halite_all_zero(raw, it->len)) {
			it->state = IT_ZERO;
			continue;
		}
		it->state = IT_RAW;
		if (o->codec == HALITE_CODEC_NONE)
			continue;
		/* Capacity len - 1: only a strictly smaller result is worth storing. */
		ret = halite_compress(o->codec, o->level, raw, it->len, out, it->len - 1);
		if (ret > 0) {
			it->state = IT_COMPRESSED;
			it->out_len = (uint32_t)ret;
		} else if (ret != -HALITE_E_LIMIT) {
			it->err = ret < 0 ? ret : -HALITE_E_CODEC;
		}
	}

	pthread_mutex_lock(&b->lock);
	if (--b->pending == 0)
		pthread_cond_signal(&b->cond);
	pthread_mutex_unlock(&b->lock);
}

static int batch_init(struct batch *b, uint32_t cap, uint32_t mb_size)
{
	memset(b, 0, sizeof(*b));
	b->items = calloc(cap, sizeof(*b->items));
	b->raw = malloc((size_t)cap * mb_size);
	b->out = malloc((size_t)cap * mb_size);
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->cond, NULL);
	return b->items && b->raw && b->out ? 0 : -ENOMEM;
}

static void batch_destroy(struct batch *b)
{
	free(b->items);
	free(b->raw);
	free(b->out);
	pthread_mutex_destroy(&b->lock);
	pthread_cond_destroy(&b->cond);
}

/* Queue @b's items as tasks of @per items; runs them here without a pool. */
static void batch_start(struct import *im, struct halite_pool *pool, struct batch *b,
			struct task *tasks, uint32_t per)
{
	uint32_t nt = (b->n + per - 1) / per;

	b->pending = nt;
	for (uint32_t k = 0; k < nt; k++) {
		tasks[k] = (struct task){ .b = b, .from = k * per,
					  .to = HALITE_MIN(b->n, (k + 1) * per), .im = im };
		if (!pool || halite_pool_submit(pool, encode_items, &tasks[k]) < 0)
			encode_items(&tasks[k]);
	}
}

static void batch_wait(struct batch *b)
{
	pthread_mutex_lock(&b->lock);
	while (b->pending)
		pthread_cond_wait(&b->cond, &b->lock);
	pthread_mutex_unlock(&b->lock);
}

static int batch_put(struct import *im, struct batch *b, uint32_t stream)
{
	for (uint32_t i = 0; i < b->n; i++) {
		const struct item *it = &b->items[i];
		char desc[64];
		int ret;

		if (it->err) {
			const struct source *s = source_of(im->o, it->mb);

			snprintf(desc, sizeof(desc), "offset %" PRIu64,
				 (it->mb - s->first_mb) * im->mb_size);
			errorf("%s: reading at %s: %s", s->path, desc, halite_strerror(it->err));
			return it->err;
		}
		switch (it->state) {
		case IT_ZERO:
			ret = halite_writer_put_zero(im->w, it->mb);
			im->zero++;
			break;
		case IT_RAW:
			ret = halite_writer_put_encoded(im->w, stream, it->mb,
							b->raw + (size_t)i * im->mb_size, it->len,
							false);
			im->stored++;
			im->raw_bytes += it->len;
			im->stored_bytes += it->len;
			break;
		default:
			ret = halite_writer_put_encoded(im->w, stream, it->mb,
							b->out + (size_t)i * im->mb_size,
							it->out_len, true);
			im->stored++;
			im->compressed++;
			im->raw_bytes += it->len;
			im->stored_bytes += it->out_len;
			break;
		}
		if (ret < 0) {
			snprintf(desc, sizeof(desc), "MB %" PRIu64, it->mb);
			report_error(im->o->out, desc, ret, halite_writer_errmsg(im->w));
			return ret;
		}
	}
	return 0;
}

/* Loads @b with up to @cap blocks of @list from @next; returns the new @next. */
static uint64_t batch_fill(const struct import *im, struct batch *b, const uint64_t *list,
			   uint64_t next, uint64_t n, uint32_t cap)
{
	b->n = (uint32_t)HALITE_MIN(cap, n - next);
	for (uint32_t i = 0; i < b->n; i++) {
		b->items[i] = (struct item){ .mb = list[next + i] };
		b->items[i].len = halite_writer_mb_bytes(im->w, list[next + i]);
	}
	return next + b->n;
}

/* Compress and put the memory blocks of @list, in its order. */
static int pump(struct import *im, const uint64_t *list, uint64_t n, uint32_t stream)
{
	const struct options *o = im->o;
	struct halite_pool *pool = NULL;
	struct batch b[2];
	struct task *tasks[2] = { NULL, NULL };
	uint32_t cap, per;
	uint64_t next = 0, done = 0;
	int cur = 0, ret;

	/* ~16 MiB of input per batch: large enough to feed every thread, two in memory. */
	cap = (uint32_t)HALITE_MAX(1u, (16u << 20) / im->mb_size);
	if (cap < 4 * o->jobs)
		cap = 4 * o->jobs;
	if (cap > n)
		cap = n ? (uint32_t)n : 1;
	per = HALITE_MAX(1u, cap / (4 * o->jobs));

	/* Both, always: the exit path destroys both. */
	ret = batch_init(&b[0], cap, im->mb_size);
	ret |= batch_init(&b[1], cap, im->mb_size);
	tasks[0] = calloc(cap / per + 1, sizeof(struct task));
	tasks[1] = calloc(cap / per + 1, sizeof(struct task));
	if (ret || !tasks[0] || !tasks[1]) {
		errorf("out of memory");
		ret = -ENOMEM;
		goto out;
	}
	if (o->jobs > 1) {
		ret = halite_pool_create(&pool, o->jobs, "hi-import");
		if (ret < 0) {
			errorf("thread pool: %s", halite_strerror(ret));
			goto out;
		}
	}

	/* Prime one batch; then always start the next before putting the current one. */
	next = batch_fill(im, &b[cur], list, next, n, cap);
	if (b[cur].n)
		batch_start(im, pool, &b[cur], tasks[cur], per);
	while (b[cur].n) {
		struct batch *nb = &b[!cur];

		next = batch_fill(im, nb, list, next, n, cap);
		if (nb->n)
			batch_start(im, pool, nb, tasks[!cur], per);

		batch_wait(&b[cur]);
		ret = batch_put(im, &b[cur], stream);
		if (ret < 0) {
			batch_wait(nb);
			goto out;
		}
		done += b[cur].n;
		progress_update(&im->progress, (int64_t)(done * im->mb_size), false);
		b[cur].n = 0;
		cur = !cur;
	}
	ret = 0;
out:
	halite_pool_free(pool);
	batch_destroy(&b[0]);
	batch_destroy(&b[1]);
	free(tasks[0]);
	free(tasks[1]);
	return ret;
}

/* NAME=IMAGE[@GPA]: the last '@' starts a GPA only if what follows is a number. */
static int parse_region_spec(char *spec, struct source *s)
{
	char *eq = strchr(spec, '='), *at;

	memset(s, 0, sizeof(*s));
	s->fd = -1;
	s->name = spec;
	if (!eq)
		return 0;
	*eq = '\0';
	s->path = eq + 1;
	at = strrchr(s->path, '@');
	if (at && halite_parse_u64(at + 1, &s->gpa) == 0) {
		*at = '\0';
		s->has_gpa = true;
	}
	if (!*s->name || !*s->path)
		return -EINVAL;
	return 0;
}

enum {
	O_ORDER = 0x200,
	O_SEED,
	O_CODEC,
	O_LEVEL,
	O_MB_PAGES,
	O_LB_SIZE,
	O_PAGE_SIZE,
	O_GPA,
	O_META,
	O_NO_SYNC,
	O_PROGRESS,
};

/* One option of parse_options(): 0, EXIT_USAGE (said why), or -1 after --help. */
static int parse_option(struct options *o, int c, char *arg, char **argv)
{
	uint64_t v;
	long l;

	switch (c) {
	case 'r':
		if (parse_region_spec(arg, &o->src[o->nsrc]) < 0)
			return usage_error("--region '%s': expected NAME or NAME=IMAGE[@GPA]", arg);
		o->nsrc++;
		return 0;
	case 'o':
		o->out = arg;
		return 0;
	case O_ORDER:
		if (strcmp(arg, "physical") && strcmp(arg, "random"))
			return usage_error("--order: physical or random, not '%s'", arg);
		o->random = strcmp(arg, "random") == 0;
		return 0;
	case O_SEED:
		if (halite_parse_u64(arg, &o->seed) < 0)
			return usage_error("--seed: a number from 0 to 2^64-1, not '%s'", arg);
		o->has_seed = true;
		return 0;
	case O_CODEC:
		o->codec = halite_codec_parse(arg);
		if (o->codec <= 0)
			return usage_error("--codec: none, lz4, zlib or zstd, not '%s'", arg);
		return 0;
	case O_LEVEL:
		/* Its range depends on --codec, which may come later: check_options(). */
		if (parse_int(arg, INT8_MIN, INT8_MAX, &l) < 0)
			return usage_error("--level: a number from -128 to 127, not '%s'", arg);
		o->level = (int)l;
		o->has_level = true;
		o->level_arg = arg;
		return 0;
	case O_MB_PAGES:
		if (parse_int(arg, 1, 1024, &l) < 0)
			return usage_error("--mb-pages: 1 to 1024, not '%s'", arg);
		o->mb_pages = (uint32_t)l;
		return 0;
	case O_LB_SIZE:
		if (halite_parse_size(arg, &v) < 0 || !halite_is_pow2(v) || v < HALITE_MIN_LB_SIZE ||
		    v > HALITE_MAX_LB_SIZE)
			return usage_error("--lb-size: a power of two from 4K to 4M, not '%s'",
					   arg);
		o->lb_size = (uint32_t)v;
		return 0;
	case O_PAGE_SIZE:
		if (halite_parse_size(arg, &v) < 0 || !halite_is_pow2(v) || v < 4096 || v > (4u << 20))
			return usage_error("--page-size: a power of two from 4K to 4M, not '%s'",
					   arg);
		o->page_size = (uint32_t)v;
		return 0;
	case O_GPA:
		if (halite_parse_u64(arg, &o->gpa) < 0)
			return usage_error("--gpa: not an address: '%s'", arg);
		o->has_gpa = true;
		return 0;
	case O_META:
		if (!strchr(arg, '=') || arg[0] == '=')
			return usage_error("--meta '%s': expected KEY=VALUE", arg);
		o->meta[o->nmeta++] = arg;
		return 0;
	case 'j':
		if (parse_int(arg, 1, 256, &l) < 0)
			return usage_error("--jobs: 1 to 256, not '%s'", arg);
		o->jobs = (unsigned)l;
		return 0;
	case O_NO_SYNC:
		o->no_sync = true;
		return 0;
	case O_PROGRESS:
		return progress_parse(arg, &o->progress) ? EXIT_USAGE : 0;
	case OPT_JSON:
		run_set_json();
		return 0;
	}
	/* -1: done, exit 0 (help, version); else the exit code. */
	c = common_option(c, argv, help_import);
	return c == EXIT_OK ? -1 : c;
}

/*
 * The options together, as the writer will take them: the level against the
 * codec's range, the memory block against the locality block. Same limits,
 * same words as halite_writer_create(), before any file is opened.
 */
static int check_writer_opts(const struct options *o)
{
	HALITE_OPTS(halite_writer_opts, wo);
	char err[256];
	int lo = 0, hi = 0;

	if (o->has_level && halite_codec_level_range(o->codec, &lo, &hi) == 0 &&
	    (o->level < lo || o->level > hi))
		return usage_error("--level %s: %s levels are %d to %d (0: the codec's default)",
				   o->level_arg, halite_codec_name(o->codec), lo, hi);
	wo.page_size = o->page_size;
	wo.mb_pages = o->mb_pages;
	wo.lb_size = o->lb_size;
	wo.codec = o->codec;
	wo.level = o->level;
	if (halite_writer_opts_check(&wo, err, sizeof(err)) < 0)
		return usage_error("%s", err);
	return 0;
}

/* Checks the regions given against the IMAGE argument, and the metadata keys. */
static int check_options(struct options *o, int nargs, char **args)
{
	uint32_t page_size = o->page_size ? o->page_size : HALITE_DEFAULT_PAGE_SIZE;
	int ret;

	if (!o->out)
		return usage_hint("-o FILE is required");
	if (!o->nsrc)
		return usage_hint("--region is required");
	if (nargs > 1)
		return usage_hint("more than one IMAGE: give --region NAME=IMAGE for each");
	if (nargs == 1) {
		if (o->nsrc != 1 || o->src[0].path)
			return usage_hint("with IMAGE, one --region NAME; else NAME=IMAGE");
		o->src[0].path = args[0];
	} else {
		for (uint32_t i = 0; i < o->nsrc; i++)
			if (!o->src[i].path)
				return usage_hint("--region %s: no IMAGE (NAME=IMAGE)",
						  o->src[i].name);
		if (o->has_gpa && o->nsrc > 1)
			return usage_error("--gpa is for one region; use NAME=IMAGE@GPA");
	}
	if (o->has_gpa) {
		if (o->src[0].has_gpa)
			return usage_error("--gpa and NAME=IMAGE@GPA both given");
		o->src[0].gpa = o->gpa;
		o->src[0].has_gpa = true;
	}
	for (uint32_t i = 0; i < o->nsrc; i++) {
		for (uint32_t j = 0; j < i; j++)
			if (!strcmp(o->src[i].name, o->src[j].name))
				return usage_error("--region %s given twice", o->src[i].name);
		if (o->src[i].has_gpa && o->src[i].gpa % page_size)
			return usage_error("region %s: GPA 0x%" PRIx64 " is not a multiple of the "
					   "page size %u", o->src[i].name, o->src[i].gpa,
					   page_size);
	}
	ret = check_writer_opts(o);
	if (ret)
		return ret;
	for (uint32_t i = 0; i < o->nmeta; i++) {
		size_t kl = (size_t)(strchr(o->meta[i], '=') - o->meta[i]);

		/* Our own keys must say what import did, not what the caller claims. */
		if ((kl == 6 && !strncmp(o->meta[i], "source", 6)) ||
		    (kl > 7 && !strncmp(o->meta[i], "import.", 7)))
			return usage_error("--meta %.*s: import records that key itself",
					   (int)kl, o->meta[i]);
		if (kl > 255)
			return usage_error("--meta: a key is at most 255 bytes");
	}
	return 0;
}

static int parse_options(int argc, char **argv, struct options *o)
{
	static const struct option lo[] = {
		LONGOPTS_COMMON,
		{ "region", required_argument, NULL, 'r' },
		{ "output", required_argument, NULL, 'o' },
		{ "order", required_argument, NULL, O_ORDER },
		{ "seed", required_argument, NULL, O_SEED },
		{ "codec", required_argument, NULL, O_CODEC },
		{ "level", required_argument, NULL, O_LEVEL },
		{ "mb-pages", required_argument, NULL, O_MB_PAGES },
		{ "lb-size", required_argument, NULL, O_LB_SIZE },
		{ "page-size", required_argument, NULL, O_PAGE_SIZE },
		{ "gpa", required_argument, NULL, O_GPA },
		{ "meta", required_argument, NULL, O_META },
		{ "jobs", required_argument, NULL, 'j' },
		{ "no-sync", no_argument, NULL, O_NO_SYNC },
		{ "progress", optional_argument, NULL, O_PROGRESS },
		{ NULL, 0, NULL, 0 },
	};
	int c, ret;

	o->codec = HALITE_CODEC_LZ4;
	o->jobs = default_jobs();
	o->progress = HALITE_PROGRESS_NONE;
	/* Each argument holds at most one region or one metadata entry. */
	o->src = calloc((size_t)argc, sizeof(*o->src));
	o->meta = calloc((size_t)argc, sizeof(*o->meta));
	if (!o->src || !o->meta) {
		errorf("out of memory");
		return EXIT_FAIL;
	}
	optind = 1;
	while ((c = getopt_long(argc, argv, ":hr:o:j:", lo, NULL)) != -1) {
		ret = parse_option(o, c, optarg, argv);
		if (ret)
			return ret;
	}
	o->json = run_json();
	return check_options(o, argc - optind, argv + optind);
}

/* The writer replaces its output: make sure that is not one of our inputs. */
static int check_not_input(const struct options *o)
{
	for (uint32_t i = 0; i < o->nsrc; i++) {
		char what[HALITE_MAX_REGION_NAME + 32];
		int ret;

		snprintf(what, sizeof(what), "the image of region %s", o->src[i].name);
		ret = refuse_input_as_output(o->out, o->src[i].path, what);
		if (ret)
			return ret;
	}
	return 0;
}

static uint64_t clock_seed(void)
{
	struct timespec ts;
	uint64_t x;

	clock_gettime(CLOCK_REALTIME, &ts);
	x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	x ^= (uint64_t)getpid() << 32;
	/* Small, readable seeds are easier to pass back on a command line. */
	return splitmix64(&x) >> 32;
}

static int set_meta(struct import *im)
{
	const struct options *o = im->o;
	const char *order = o->random ? "random" : "physical";
	char buf[32];
	int ret;

	for (uint32_t i = 0; i < o->nmeta; i++) {
		const char *eq = strchr(o->meta[i], '=');
		char key[256];
		size_t kl = (size_t)(eq - o->meta[i]);

		if (kl >= sizeof(key))
			return -EINVAL;	/* check_options() refused it */
		memcpy(key, o->meta[i], kl);
		key[kl] = '\0';
		ret = halite_writer_set_meta(im->w, key, eq + 1, (uint32_t)strlen(eq + 1));
		if (ret < 0) {
			report_error(o->out, key, ret, halite_writer_errmsg(im->w));
			return ret;
		}
	}
	ret = halite_writer_set_meta(im->w, "source", "import", 6);
	if (!ret)
		ret = halite_writer_set_meta(im->w, "import.order", order,
					     (uint32_t)strlen(order));
	if (!ret && o->random) {
		snprintf(buf, sizeof(buf), "%" PRIu64, o->seed);
		ret = halite_writer_set_meta(im->w, "import.seed", buf, (uint32_t)strlen(buf));
	}
	if (ret < 0)
		report_error(o->out, "metadata", ret, halite_writer_errmsg(im->w));
	return ret;
}

static int overlap_error(const struct source *a, const struct source *b)
{
	return usage_error("regions %s (0x%" PRIx64 "-0x%" PRIx64 ") and %s (0x%" PRIx64
			   "-0x%" PRIx64 ") overlap in guest-physical memory: give each its own "
			   "@GPA", a->name, a->gpa, a->gpa + a->length - 1, b->name, b->gpa,
			   b->gpa + b->length - 1);
}

/*
 * Two regions at the same guest-physical addresses make no guest: refused
 * before the output is created, naming both ranges.
 */
static int check_overlap(const struct options *o)
{
	for (uint32_t i = 0; i < o->nsrc; i++) {
		const struct source *a = &o->src[i];

		if (a->gpa + a->length < a->gpa)
			return usage_error("region %s: GPA 0x%" PRIx64 " plus its %" PRIu64
					   " bytes is beyond 2^64", a->name, a->gpa, a->length);
		for (uint32_t j = 0; j < i; j++) {
			const struct source *b = &o->src[j];

			if (a->gpa < b->gpa + b->length && b->gpa < a->gpa + a->length)
				return overlap_error(b, a);
		}
	}
	return 0;
}

static int run(struct options *o)
{
	HALITE_OPTS(halite_writer_opts, wo);
	struct import im = { .o = o };
	struct halite_region *regions = NULL;
	uint8_t *touched = NULL;
	uint64_t *list = NULL, n = 0, gpa = 0;
	uint32_t page_size = o->page_size ? o->page_size : HALITE_DEFAULT_PAGE_SIZE;
	uint32_t stream;
	char b1[32], b2[32];
	int ret;

	ret = check_not_input(o);
	if (ret)
		goto out;
	/*
	 * Where it goes, before reading what: a typo in -o costs no image scan.
	 * A directory or a device there is a wrong argument; a missing
	 * directory or a read-only one, a failure as for any file.
	 */
	ret = halite_writer_check_path(o->out, im.log, sizeof(im.log));
	if (ret < 0) {
		errorf("%s", im.log);
		ret = ret == -EISDIR || ret == -EINVAL ? EXIT_USAGE : EXIT_FAIL;
		goto out;
	}
	for (uint32_t i = 0; i < o->nsrc; i++) {
		ret = open_source(&o->src[i], page_size);
		if (ret)
			goto out;
	}
	ret = EXIT_FAIL;

	regions = calloc(o->nsrc, sizeof(*regions));
	if (!regions)
		goto oom;
	for (uint32_t i = 0; i < o->nsrc; i++) {
		if (o->src[i].has_gpa)
			gpa = o->src[i].gpa;
		o->src[i].gpa = gpa;
		regions[i] = (struct halite_region){ o->src[i].name, gpa, o->src[i].length };
		gpa += o->src[i].length;
	}
	if (check_overlap(o)) {
		ret = EXIT_USAGE;
		goto out;
	}

	wo.page_size = o->page_size;
	wo.mb_pages = o->mb_pages;
	wo.lb_size = o->lb_size;
	wo.codec = o->codec;
	wo.level = o->level;
	wo.flags = o->no_sync ? HALITE_WRITER_NO_SYNC : 0;
	wo.log = capture_log;
	wo.log_ctx = &im;
	wo.log_level = HALITE_LOG_ERROR;
	ret = halite_writer_create(&im.w, o->out, regions, o->nsrc, &wo);
	if (ret < 0) {
		report_error(o->out, NULL, ret, im.log);
		ret = EXIT_FAIL;
		goto out;
	}
	ret = EXIT_FAIL;
	im.mb_size = halite_writer_mb_size(im.w);
	im.mb_count = halite_writer_mb_count(im.w);
	for (uint64_t i = 0, first = 0; i < o->nsrc; i++) {
		o->src[i].first_mb = first;
		o->src[i].mb_count = (o->src[i].length + im.mb_size - 1) / im.mb_size;
		first += o->src[i].mb_count;
	}

	touched = calloc(im.mb_count / 8 + 1, 1);
	list = malloc(im.mb_count * sizeof(*list) + 1);
	if (!touched || !list)
		goto oom;
	for (uint32_t i = 0; i < o->nsrc; i++)
		if (mark_touched(&o->src[i], im.mb_size, touched) < 0)
			goto out;
	for (uint64_t m = 0; m < im.mb_count; m++)
		if (touched[m / 8] & (1u << (m % 8)))
			list[n++] = m;

	if (o->random) {
		if (!o->has_seed) {
			o->seed = clock_seed();
			notef("random order with --seed %" PRIu64, o->seed);
		}
		shuffle(list, n, o->seed);
		stream = HALITE_STREAM(HALITE_STREAM_OTHER, 0);
	} else {
		stream = HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0);
	}

	if (set_meta(&im) < 0)
		goto out;
	progress_begin(&im.progress, o->progress, "import", o->out, (int64_t)(n * im.mb_size));
	ret = pump(&im, list, n, stream);
	progress_update(&im.progress, ret < 0 ? -1 : (int64_t)(n * im.mb_size), true);
	if (ret < 0) {
		ret = EXIT_FAIL;
		goto out;
	}
	ret = halite_writer_finish(im.w);
	if (ret < 0) {
		report_error(o->out, NULL, ret, halite_writer_errmsg(im.w));
		ret = EXIT_FAIL;
		goto out;
	}
	halite_writer_free(im.w, true);
	im.w = NULL;

	if (o->json) {
		cJSON *root = cJSON_CreateObject(), *m;

		cJSON_AddStringToObject(root, "file", o->out);
		cJSON_AddStringToObject(root, "order", o->random ? "random" : "physical");
		if (o->random)
			json_add_u64(root, "seed", o->seed);
		cJSON_AddStringToObject(root, "codec", halite_codec_name(o->codec));
		m = cJSON_AddObjectToObject(root, "mbs");
		json_add_u64(m, "count", im.mb_count);
		json_add_u64(m, "stored", im.stored);
		json_add_u64(m, "zero", im.zero);
		json_add_u64(m, "untouched", im.mb_count - n);
		json_add_u64(m, "compressed", im.compressed);
		json_add_u64(root, "raw_bytes", im.raw_bytes);
		json_add_u64(root, "stored_bytes", im.stored_bytes);
		if (im.stored_bytes)
			cJSON_AddNumberToObject(root, "compression_ratio",
						(double)im.raw_bytes / (double)im.stored_bytes);
		else
			cJSON_AddNullToObject(root, "compression_ratio");
		ret = json_emit(root, EXIT_OK);
	} else {
		notef("%s: %" PRIu64 " memory blocks (%" PRIu64 " stored, %" PRIu64
		      " zero, %" PRIu64 " never touched), %s stored in %s, ratio %.2f",
			o->out, im.mb_count, im.stored, im.zero, im.mb_count - n,
			human_bytes(im.raw_bytes, b1, sizeof(b1)),
			human_bytes(im.stored_bytes, b2, sizeof(b2)),
			im.stored_bytes ? (double)im.raw_bytes / (double)im.stored_bytes : 1.0);
		ret = EXIT_OK;
	}
	goto out;
oom:
	errorf("out of memory");
	ret = EXIT_FAIL;
out:
	/* Without finish the writer leaves no footer; remove the incomplete file. */
	halite_writer_free(im.w, true);
	for (uint32_t i = 0; i < o->nsrc; i++)
		if (o->src[i].fd >= 0)
			close(o->src[i].fd);
	free(regions);
	free(touched);
	free(list);
	return ret;
}

static const char *const import_keys[] = {
	"file", "order", "codec", "mbs", "raw_bytes", "stored_bytes", "compression_ratio", NULL,
};

int cmd_import(int argc, char **argv)
{
	struct options o = { 0 };
	int ret;

	run_keys(import_keys);
	ret = parse_options(argc, argv, &o);
	if (ret == 0) {
		cJSON *r = run_result();

		cJSON_AddStringToObject(r, "file", o.out);
		cJSON_AddStringToObject(r, "order", o.random ? "random" : "physical");
		if (o.random && o.has_seed)
			json_add_u64(r, "seed", o.seed);
		cJSON_AddStringToObject(r, "codec", halite_codec_name(o.codec));
		ret = run(&o);
	}
	else if (ret < 0)
		ret = EXIT_OK;
	free(o.src);
	free(o.meta);
	return ret;
}
