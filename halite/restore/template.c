// SPDX-License-Identifier: MIT
/*
 * The template source (template.h): one snapshot, read and decoded once for
 * every clone, into the template memory file. This file: open, the
 * sessions' requests, reading and decoding, stats, free; the files below
 * are template_files.c's, the hot set hotset.c's, its error template_err.c's
 * (template_src.h).
 *
 * Files, both on tmpfs, beside each other:
 *   MEM_PATH       the snapshot's memory: region i at offset[i] (each region
 *                  starts 2 MiB aligned), length[i] bytes; zero and
 *                  never-touched blocks stay holes.
 *   MEM_PATH.fill  the fill map: a 64-byte header, then one byte per memory
 *                  block, 1 once the block's bytes are all in MEM_PATH.
 *
 *   fill header    off  size  field
 *                    0     8  magic "HLTFILL1"
 *                    8    16  snapshot uuid
 *                   24     8  memory blocks (u64 LE)
 *                   32     8  MEM_PATH size (u64 LE)
 *                   40     4  memory block size (u32 LE)
 *                   44    20  zero
 *
 * Both are created O_EXCL 0600 and never opened through a symbolic link; an
 * existing pair is used only if both are regular files of our uid that no
 * one else may write (clones map MEM_PATH: its bytes are their memory).
 * Open reserves (fallocate) the ranges of every stored block in MEM_PATH and
 * the whole fill map, so that a full tmpfs fails the open with -ENOSPC
 * rather than a decode later; blocks are written with pwrite(), so a write
 * that still fails is an LB's error, never SIGBUS.
 *
 * The fill map is a shared mapping, so its bytes outlive this process: a
 * block's byte is set (release) only after the block is written, and a
 * template reopened over the same files keeps every block whose byte is
 * set. A block half written when the process died has no byte: it is
 * decoded again, and no session ever mapped it (sessions map only blocks
 * whose byte is set).
 *
 * Reading is the snapshot source's (source.h). Locality blocks move IDLE
 * -> READING (a session waits on one of its blocks: the demand queue; or
 * the prefetcher took it) -> DONE or FAILED. The readers serve the demand
 * queue; the prefetcher reads the hot set's LBs, then file order, only when
 * no fault came for prefetch_idle_us or the prefetch has fallen below
 * prefetch_min_rate. An LB is read and verified (re-read read_retries
 * times, each from the device); here the blocks sessions wait for are
 * decoded first and their sessions called back, then the rest, on the
 * reader for a demand read, on the decode pool for a prefetched one. A
 * failed LB is never decoded; its waiting sessions get the failure, later
 * requests too.
 *
 * The hot set: the stored blocks sessions faulted on in their first
 * hot_window_ms, in first-fault order (learned), then, for a relayouted
 * snapshot, the stored blocks of its hot prefix (LBs 0..hot-lbs-1 of
 * metadata halite.relayout, in file order) that were not learned. Learned
 * first: it is what clones of this very file touched, the prefix what
 * restores of the file it was relayouted from touched. Only the learned part
 * is saved: the prefix is the file's already.
 *
 * The hot set file (hotset_path) is a restore trace of version 2 without
 * stat and lb lines (docs/restore-trace.md, "written by a template"), so
 * that `halite-inspect relayout SNAPSHOT --trace HOTSET` takes it: a touch
 * line per learned block, t_ns counted from the start of the first session
 * that added one (after the last t_ns read at open, for a reopened
 * template), the session's vCPU index or '-', kind stored. At open any
 * version 2 trace of this snapshot is read (a learning restore's too: its
 * stored blocks' touches). A file of the format before it,
 *   "HLTHOT01" | uuid (16) | count (u64) | count x memory block (u64) |
 *   XXH3-64 of everything before it (u64); all little-endian,
 * is still read (a daemon's state directory from before; its blocks get
 * t_ns 0 and vCPU '-'), and the next save writes it as a trace.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <halite/errors.h>
#include <halite/template.h>

#include "endian_util.h"
#include "io.h"
#include "log_internal.h"
#include "opts.h"
#include "pool.h"
#include "source.h"
#include "stats.h"
#include "template_int.h"
#include "template_src.h"
#include "zalloc.h"

/* ---- geometry ---------------------------------------------------------- */

uint32_t tpl_mb_size(const struct halite_template *t)
{
	return t->fi->mb_size;
}

uint32_t tpl_lb_size(const struct halite_template *t)
{
	return t->fi->lb_size;
}

uint32_t tpl_region_count(const struct halite_template *t)
{
	return t->nregions;
}

const struct tpl_region *tpl_region_at(const struct halite_template *t, uint32_t i)
{
	return i < t->nregions ? &t->regions[i] : NULL;
}

int tpl_find_region(const struct halite_template *t, const char *name)
{
	for (uint32_t i = 0; i < t->nregions; i++)
		if (!strcmp(t->regions[i].name, name))
			return (int)i;
	return -HALITE_E_NOT_FOUND;
}

static const struct tpl_region *mb_region(const struct halite_template *t, uint64_t mb)
{
	for (uint32_t i = 0; i < t->nregions; i++)
		if (mb >= t->regions[i].first_mb && mb - t->regions[i].first_mb < t->regions[i].mb_count)
			return &t->regions[i];
	return NULL;
}

int tpl_mb_state(struct halite_template *t, uint64_t mb)
{
	struct halite_mb_loc loc;
	int ret;

	if (atomic_load_explicit(&t->fill[mb], memory_order_acquire))
		return TPL_MB_IN;
	ret = tpl_mb_lookup(t, mb, &loc);
	if (ret)
		return ret;
	return loc.state == HALITE_MB_STORED ? TPL_MB_OUT : TPL_MB_EMPTY;
}

int tpl_lb_members(struct halite_template *t, uint64_t mb, const uint64_t **mbs, uint32_t *n)
{
	struct halite_mb_loc loc;
	int ret = tpl_mb_lookup(t, mb, &loc);

	if (ret)
		return ret;
	if (loc.state != HALITE_MB_STORED)
		return -HALITE_E_NOT_FOUND;
	ret = halite_reader_lb_members(t->rd, loc.lb, mbs, n);
	if (ret) {
		char msg[512];

		snprintf(msg, sizeof(msg), "locality block %llu's member list: %s", ULL(loc.lb),
			 halite_reader_errmsg(t->rd));
		tpl_error(t, ret, msg);
	}
	return ret;
}

bool tpl_complete(struct halite_template *t)
{
	return atomic_load(&t->mb_in) == t->mb_stored;
}

uint32_t tpl_hot_window_ms(const struct halite_template *t)
{
	return t->o.hot_window_ms;
}

void tpl_fault_seen(struct halite_template *t)
{
	atomic_store_explicit(&t->src.last_fault_ns, halite_now_ns(), memory_order_relaxed);
}

/* ---- requests and callbacks -------------------------------------------- */

/* "locality block 3 at offset 65536: <why>", or without the offset if its entry fails too. */
void tpl_errmsg_mb(struct halite_template *t, uint64_t mb, char *buf, size_t len)
{
	struct halite_mb_loc loc;

	if (halite_reader_mb_lookup(t->rd, mb, &loc)) {
		snprintf(buf, len, "memory block %llu: %s", ULL(mb), halite_reader_errmsg(t->rd));
		return;
	}
	if (loc.state != HALITE_MB_STORED) {
		snprintf(buf, len, "memory block %llu", ULL(mb));
		return;
	}
	pthread_mutex_lock(&t->src.lk);
	if (t->lbs[loc.lb].msg)
		snprintf(buf, len, "%s", t->lbs[loc.lb].msg);
	else
		src_lb_errmsg(t->rd, loc.lb, halite_strerror(t->lbs[loc.lb].err ? t->lbs[loc.lb].err :
						     -EIO), buf, len);
	pthread_mutex_unlock(&t->src.lk);
}

int tpl_request(struct halite_template *t, struct tpl_client *c, uint64_t mb, uint64_t tag)
{
	struct halite_mb_loc loc;
	struct lbstate *l;
	struct session_waiter *w = NULL;
	bool wake = false;
	uint8_t st;
	int ret = 0;

	atomic_fetch_add(&t->requests, 1);
	if (atomic_load_explicit(&t->fill[mb], memory_order_acquire)) {
		atomic_fetch_add(&t->hits, 1);
		return 1;
	}
	ret = tpl_mb_lookup(t, mb, &loc);
	if (ret)
		return ret; /* the index's failure: never a zero block */
	if (loc.state != HALITE_MB_STORED)
		return -EINVAL;
	if (c && !(w = malloc(sizeof(*w))))
		return -ENOMEM;
	pthread_mutex_lock(&t->src.lk);
	l = &t->lbs[loc.lb];
	st = atomic_load(&t->src.st[loc.lb]);
	if (atomic_load_explicit(&t->fill[mb], memory_order_acquire)) {
		atomic_fetch_add(&t->hits, 1);
		ret = 1;
	} else if (st == LB_FAILED && l->err) {
		ret = l->err;
	} else if (st == LB_IDLE && (ret = src_queue_push(&t->src, loc.lb))) {
		/* No room to queue it: nothing was promised. */
	} else {
		/* FAILED without its error yet: tpl_lb_failed() is about to take the waiters. */
		if (w) {
			*w = (struct session_waiter){ .next = l->waiters, .c = c, .mb = mb, .tag = tag };
			l->waiters = w;
			c->pending++;
			w = NULL;
		}
		if (st == LB_IDLE) {
			atomic_store(&t->src.st[loc.lb], LB_READING);
			l->demand = true;
			if (c)
				c->lb_asked++;
			wake = true;
		} else {
			atomic_fetch_add(&t->joined, 1);
		}
	}
	pthread_mutex_unlock(&t->src.lk);
	/* After unlocking: a reader woken under the lock would only wait for it. */
	if (wake)
		src_wake(&t->src, 1);
	free(w);
	return ret;
}

/*
 * Take the waiters of @l whose block is in (all of them if @all): under the
 * lock, each client's callback count is raised so tpl_detach() waits for it.
 */
static struct session_waiter *take_waiters(struct halite_template *t, struct lbstate *l, bool all)
{
	struct session_waiter *out = NULL, **pp = &l->waiters;

	while (*pp) {
		struct session_waiter *w = *pp;

		if (all || atomic_load_explicit(&t->fill[w->mb], memory_order_relaxed)) {
			*pp = w->next;
			w->next = out;
			out = w;
			w->c->pending--;
			w->c->callbacks++;
		} else {
			pp = &w->next;
		}
	}
	return out;
}

static void call_waiters(struct halite_template *t, struct session_waiter *w, int err)
{
	while (w) {
		struct session_waiter *next = w->next;
		struct tpl_client *c = w->c;

		c->block_in(c, w->mb, w->tag, err);
		pthread_mutex_lock(&t->src.lk);
		if (!--c->callbacks)
			pthread_cond_broadcast(&t->state_cv);
		pthread_mutex_unlock(&t->src.lk);
		free(w);
		w = next;
	}
}

uint64_t tpl_lb_asked(struct halite_template *t, const struct tpl_client *c)
{
	uint64_t n;

	pthread_mutex_lock(&t->src.lk);
	n = c->lb_asked;
	pthread_mutex_unlock(&t->src.lk);
	return n;
}

uint64_t tpl_pending(struct halite_template *t, const struct tpl_client *c)
{
	uint64_t n;

	pthread_mutex_lock(&t->src.lk);
	n = c->pending + c->callbacks;
	pthread_mutex_unlock(&t->src.lk);
	return n;
}

void tpl_detach(struct halite_template *t, struct tpl_client *c)
{
	pthread_mutex_lock(&t->src.lk);
	for (uint64_t lb = 0; c->pending && lb < t->fi->lb_count; lb++) {
		struct session_waiter **pp = &t->lbs[lb].waiters;

		while (*pp) {
			struct session_waiter *w = *pp;

			if (w->c == c) {
				*pp = w->next;
				c->pending--;
				free(w);
			} else {
				pp = &w->next;
			}
		}
	}
	while (c->callbacks)
		pthread_cond_wait(&t->state_cv, &t->src.lk);
	pthread_mutex_unlock(&t->src.lk);
}

/* ---- reading and decoding ---------------------------------------------- */

/*
 * Block @mb of the verified LB @lbbuf into the memory file, through @mbbuf
 * (mb_size bytes): 0, or < 0 and @why says what. Written with pwrite(), not
 * through a shared mapping: a failing write is an error to report, where a
 * store into a mapping that cannot get a page is SIGBUS.
 */
static int decode_mb(struct halite_template *t, uint64_t mb, const void *lbbuf, uint8_t *mbbuf,
		     char *why, size_t whylen)
{
	const struct tpl_region *g = mb_region(t, mb);
	uint32_t len = halite_reader_mb_bytes(t->rd, mb);
	uint64_t off;
	int ret;

	if (!g)
		return -HALITE_E_INTERNAL;
	if (atomic_load_explicit(&t->fill[mb], memory_order_acquire))
		return 0; /* in already (a reopened template) */
	ret = halite_reader_decode_mb(t->rd, mb, lbbuf, mbbuf);
	if (ret) {
		snprintf(why, whylen, "decoding memory block %llu: %s", ULL(mb),
			 ret == -HALITE_E_CHECKSUM || ret == -HALITE_E_CORRUPT ?
			 halite_reader_errmsg(t->rd) : halite_strerror(ret));
		return ret;
	}
	off = g->offset + (mb - g->first_mb) * t->fi->mb_size;
	for (uint32_t done = 0; done < len;) {
		ssize_t n = pwrite(t->memfd, mbbuf + done, len - done, (off_t)(off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			snprintf(why, whylen, "writing memory block %llu to %s: %s", ULL(mb),
				 t->mem_path, strerror(-ret));
			return ret;
		}
		done += (uint32_t)n;
	}
	atomic_store_explicit(&t->fill[mb], 1, memory_order_release);
	atomic_fetch_add(&t->mb_in, 1);
	atomic_fetch_add(&t->mb_decoded, 1);
	return 0;
}

/*
 * Under src.lk: a failed LB's error and message, counted (@read: no read
 * of it verified, so the source did not count it read); its waiters, all
 * of them.
 */
static struct session_waiter *lb_failed_locked(struct halite_template *t, uint64_t lb, int err,
					       const char *msg, bool read)
{
	struct lbstate *l = &t->lbs[lb];

	atomic_store(&t->src.st[lb], LB_FAILED);
	l->err = err;
	l->msg = strdup(msg);
	atomic_fetch_add(&t->lb_failed, 1);
	if (read)
		atomic_fetch_add(l->demand ? &t->lb_demand_failed : &t->lb_prefetch_failed, 1);
	if (!t->error)
		t->error = err;
	tpl_fail(t, err, "%s", msg);
	return take_waiters(t, l, true);
}

/*
 * A verified LB into the memory file: the blocks sessions wait for first,
 * their sessions called back, then the rest; DONE, or FAILED when a block
 * does not decode or write. Frees @buf; @mbbuf: mb_size bytes of scratch.
 */
static void decode_lb(struct halite_template *t, uint64_t lb, uint8_t *buf, uint8_t *mbbuf)
{
	struct lbstate *l = &t->lbs[lb];
	const uint64_t *mbs;
	uint32_t n = 0;
	struct session_waiter *w;
	uint64_t *want = NULL;
	size_t nwant = 0;
	char why[448] = "";
	int ret;

	ret = halite_reader_lb_members(t->rd, lb, &mbs, &n);
	if (ret)
		snprintf(why, sizeof(why), "its member list: %s", halite_reader_errmsg(t->rd));
	if (!ret) {
		/* The blocks sessions wait for first. */
		pthread_mutex_lock(&t->src.lk);
		for (w = l->waiters; w; w = w->next)
			nwant++;
		want = nwant ? malloc(nwant * sizeof(*want)) : NULL;
		nwant = 0;
		for (w = l->waiters; want && w; w = w->next)
			want[nwant++] = w->mb;
		pthread_mutex_unlock(&t->src.lk);
		for (size_t i = 0; !ret && i < nwant; i++)
			ret = decode_mb(t, want[i], buf, mbbuf, why, sizeof(why));
		free(want);
		if (!ret) {
			pthread_mutex_lock(&t->src.lk);
			w = take_waiters(t, l, false);
			pthread_mutex_unlock(&t->src.lk);
			call_waiters(t, w, 0);
		}
		for (uint32_t i = 0; !ret && i < n; i++) {
			struct halite_mb_loc loc;

			/*
			 * A member whose own map entry fails (its index chunk
			 * damaged) stays out, never marked in; that is the
			 * template's error, and the sessions that need it fail
			 * on their lookup. The LB's other blocks are good.
			 */
			if (tpl_mb_lookup(t, mbs[i], &loc))
				continue;
			ret = decode_mb(t, mbs[i], buf, mbbuf, why, sizeof(why));
		}
	}
	halite_reader_free_lb(buf);

	pthread_mutex_lock(&t->src.lk);
	if (ret) {
		char msg[512];

		src_lb_errmsg(t->rd, lb, why[0] ? why : halite_strerror(ret), msg, sizeof(msg));
		w = lb_failed_locked(t, lb, ret, msg, false);
	} else {
		atomic_store(&t->src.st[lb], LB_DONE);
		w = take_waiters(t, l, true);
	}
	pthread_cond_broadcast(&t->state_cv);
	pthread_mutex_unlock(&t->src.lk);
	/* A failure fails those still waiting; done, every block is in. */
	call_waiters(t, w, ret);
}

/* A prefetched LB, decoded on the pool. */
struct decode_task {
	struct halite_template *t;
	uint64_t lb;
	uint8_t *buf;
};

/* @lb failed (lb_failed_locked(), @read as there): its waiters are told. */
static void lb_fail(struct halite_template *t, uint64_t lb, int err, const char *msg, bool read)
{
	struct session_waiter *w;

	pthread_mutex_lock(&t->src.lk);
	w = lb_failed_locked(t, lb, err, msg, read);
	pthread_cond_broadcast(&t->state_cv);
	pthread_mutex_unlock(&t->src.lk);
	call_waiters(t, w, err);
}

static void decode_task(void *arg)
{
	struct decode_task *d = arg;
	struct halite_template *t = d->t;
	uint8_t *mbbuf = malloc(t->fi->mb_size);

	if (mbbuf) {
		decode_lb(t, d->lb, d->buf, mbbuf);
	} else {
		char msg[512];

		halite_reader_free_lb(d->buf);
		src_lb_errmsg(t->rd, d->lb, "decode buffer", msg, sizeof(msg));
		lb_fail(t, d->lb, -ENOMEM, msg, false);
	}
	free(mbbuf);
	atomic_fetch_sub(&t->backlog, 1);
	free(d);
}

/*
 * The source's callbacks. A demand LB is decoded on the reader that read
 * it, its sessions waiting; a prefetched one goes to the decode pool, so
 * that the prefetcher keeps reading while the pool's threads decode.
 */
static void tpl_landed(void *ctx, uint64_t lb, uint8_t *buf, int how, uint8_t *tmp)
{
	struct halite_template *t = ctx;
	struct decode_task *d;

	if (how == SRC_PREFETCH && t->pool && (d = malloc(sizeof(*d)))) {
		*d = (struct decode_task){ t, lb, buf };
		atomic_fetch_add(&t->backlog, 1);
		if (!halite_pool_submit(t->pool, decode_task, d))
			return;
		atomic_fetch_sub(&t->backlog, 1);
		free(d);
	}
	decode_lb(t, lb, buf, tmp);
}

static void tpl_lb_failed(void *ctx, uint64_t lb, int err, const char *msg)
{
	lb_fail(ctx, lb, err, msg, true);
}

/*
 * Prefetched LBs waiting for the pool, at most this many per read in
 * flight: bounds the memory held when reads outrun decoding (as the
 * restore's backlog does).
 */
#define BACKLOG_PER_QD 4u
#define BACKLOG_NAP_US 200u

static uint32_t tpl_hold(void *ctx)
{
	struct halite_template *t = ctx;

	return atomic_load(&t->backlog) >= BACKLOG_PER_QD * t->src.o.queue_depth ?
	       BACKLOG_NAP_US : 0;
}

static void tpl_src_error(void *ctx, int err, const char *msg)
{
	tpl_error(ctx, err, msg);
}

static const struct src_ops tpl_src_ops = {
	.landed = tpl_landed,
	.failed = tpl_lb_failed,
	.hold = tpl_hold,
	.error = tpl_src_error,
};

/* Prefetch reads in flight (the restore's default queue depth). */
#define TPL_QUEUE_DEPTH 8u

/* At open, after the reader: the source over @snapshot (threads later). 0 or < 0. */
static int tpl_source_init(struct halite_template *t, const char *snapshot)
{
	struct src_opts so = {
		.readers = t->o.readers,
		.ra_readers = 1,
		.read_retries = t->o.read_retries,
		.prefetch = !(t->o.flags & HALITE_TEMPLATE_NO_PREFETCH),
		.queue_depth = TPL_QUEUE_DEPTH,
		.prefetch_idle_us = t->o.prefetch_idle_us,
		.prefetch_min_rate = t->o.prefetch_min_rate,
		.read_latency_us = t->o.read_latency_us,
		.thread_name = "halite-tread",
	};

	/* An object of an S3 store has no descriptor (the source reads it through its reader's I/O). */
	t->snap_fd = halite_io_is_s3_path(snapshot) ? -1 : open(snapshot, O_RDONLY | O_CLOEXEC);
	if (t->snap_fd < 0 && !halite_io_is_s3_path(snapshot))
		return tpl_fail(t, -errno, "%s: cannot open", snapshot);
	/* The source's own from here on. */
	pthread_mutex_destroy(&t->src.lk);
	return src_init(&t->src, t->rd, snapshot, t->snap_fd, &so, &tpl_src_ops, t, &t->log);
}

/* ---- open, wait, stats, free ------------------------------------------- */

static int layout_regions(struct halite_template *t)
{
	uint64_t off = 0;

	t->nregions = t->fi->region_count;
	t->regions = calloc(t->nregions ? t->nregions : 1, sizeof(*t->regions));
	if (!t->regions)
		return -ENOMEM;
	for (uint32_t i = 0; i < t->nregions; i++) {
		const struct halite_region_info *ri = halite_reader_region(t->rd, i);
		struct tpl_region *g = &t->regions[i];

		snprintf(g->name, sizeof(g->name), "%s", ri->name);
		g->offset = off;
		g->length = ri->length;
		g->first_mb = ri->first_mb;
		g->mb_count = ri->mb_count;
		off += (ri->length + REGION_ALIGN - 1) & ~(REGION_ALIGN - 1);
	}
	t->mem_size = off ? off : REGION_ALIGN;
	return 0;
}

static char *suffixed(const char *path, const char *suffix)
{
	char *s;

	return asprintf(&s, "%s%s", path, suffix) < 0 ? NULL : s;
}

int halite_template_open(struct halite_template **tp, const char *snapshot, const char *mem_path,
			 const struct halite_template_opts *opts)
{
	struct halite_reader_opts ro = { .sz = sizeof(ro) };
	struct halite_template *t;
	char rerr[256] = "";
	int ret;

	if (!tp || !snapshot || !mem_path)
		return -EINVAL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->memfd = t->ro_fd = t->fillfd = t->snap_fd = -1;
	/* Errors before the source is (src_init()) take its lock already. */
	pthread_mutex_init(&t->src.lk, NULL);
	halite_cond_init_mono(&t->state_cv);
	ret = halite_opts_copy(&t->o, sizeof(t->o), opts);
	if (ret || (t->o.flags & ~HALITE_TEMPLATE_FLAGS_ALL) || t->o.readers > 64) {
		ret = ret ? ret : -EINVAL;
		goto err;
	}
	t->log = (struct halite_logger){ t->o.log, t->o.log_ctx, t->o.log_level };
	if (!t->o.readers)
		t->o.readers = 4;
	if (!t->o.read_retries)
		t->o.read_retries = 2;
	if (!t->o.prefetch_idle_us)
		t->o.prefetch_idle_us = 2000;
	if (!t->o.prefetch_min_rate)
		t->o.prefetch_min_rate = 64ull << 20;
	if (!t->o.hot_window_ms)
		t->o.hot_window_ms = 2000;
	t->mem_path = strdup(mem_path);
	t->fill_path = suffixed(mem_path, ".fill");
	t->hot_path = t->o.hotset_path ? strdup(t->o.hotset_path) : NULL;
	t->o.hotset_path = NULL;
	if (!t->mem_path || !t->fill_path || (opts && opts->hotset_path && !t->hot_path)) {
		ret = -ENOMEM;
		goto err;
	}

	ro.read_latency_us = t->o.read_latency_us;
	ro.errbuf = rerr;
	ro.errbuf_len = sizeof(rerr);
	ro.same_as = t->o.same_as;
	t->o.same_as = NULL; /* the caller's, for this call only */
	ret = halite_reader_open(&t->rd, snapshot, &ro);
	if (ret) {
		if (rerr[0])
			snprintf(t->errmsg, sizeof(t->errmsg), "%s", rerr);
		goto err;
	}
	t->fi = halite_reader_info(t->rd);
	t->mb_stored = t->fi->mb_stored;
	ret = layout_regions(t);
	if (!ret)
		ret = tpl_source_init(t, snapshot);
	if (ret)
		goto err;
	/* O(1) whatever the memory size (zalloc.h). */
	t->lbs = halite_zalloc(t->fi->lb_count * sizeof(*t->lbs));
	t->hot_bit = halite_zalloc(t->fi->mb_count);
	if (!t->lbs || !t->hot_bit) {
		ret = -ENOMEM;
		goto err;
	}
	ret = tpl_open_files(t);
	if (ret < 0)
		goto err;
	if (ret == 1)
		tpl_count_in(t);
	tpl_hot_load(t);
	ret = tpl_hot_prefix(t);
	if (!ret)
		ret = tpl_build_porder(t);
	if (ret)
		goto err;
	t->src.first = t->porder;
	t->src.nfirst = t->nhot;
	atomic_store(&t->src.last_fault_ns, halite_now_ns());
	/* Prefetched LBs are decoded there, as many threads as readers. */
	if (t->src.o.prefetch) {
		ret = halite_pool_create(&t->pool, t->o.readers, "halite-tdecode");
		if (ret)
			goto err;
	}
	ret = src_start(&t->src);
	if (ret)
		goto err;
	halite_logf(&t->log, HALITE_LOG_INFO, "template %s: %llu of %llu stored blocks in %s "
		    "at open", snapshot, ULL(t->mb_in_at_open), ULL(t->mb_stored), t->mem_path);
	*tp = t;
	return 0;
err:
	if (!t->errmsg[0] && ret)
		tpl_fail(t, ret, "template %s", snapshot);
	halite_logf(&t->log, HALITE_LOG_ERROR, "%s", t->errmsg);
	tpl_remove_created(t);
	halite_template_free(t);
	return ret;
}

int halite_template_memfd(const struct halite_template *t)
{
	return t ? t->ro_fd : -EINVAL;
}

int halite_template_region(const struct halite_template *t, const char *name, uint64_t *offset,
			   uint64_t *length)
{
	int i;

	if (!t || !name)
		return -EINVAL;
	i = tpl_find_region(t, name);
	if (i < 0)
		return i;
	if (offset)
		*offset = t->regions[i].offset;
	if (length)
		*length = t->regions[i].length;
	return 0;
}

struct halite_reader *halite_template_reader(struct halite_template *t)
{
	return t ? t->rd : NULL;
}

int halite_template_wait(struct halite_template *t, int timeout_ms)
{
	struct timespec ts;
	int ret = 0;

	if (!t)
		return -EINVAL;
	halite_deadline(&ts, timeout_ms > 0 ? (uint64_t)timeout_ms * 1000000 : 0);
	pthread_mutex_lock(&t->src.lk);
	while (!tpl_complete(t) && !t->error) {
		if (timeout_ms < 0) {
			pthread_cond_wait(&t->state_cv, &t->src.lk);
		} else if (pthread_cond_timedwait(&t->state_cv, &t->src.lk, &ts) == ETIMEDOUT) {
			ret = -ETIMEDOUT;
			break;
		}
	}
	if (!ret && !tpl_complete(t))
		ret = t->error;
	pthread_mutex_unlock(&t->src.lk);
	return ret;
}

void halite_template_stats(struct halite_template *t, struct halite_template_stats *st)
{
	struct stat sb;

	memset(st, 0, sizeof(*st));
	if (!t)
		return;
	st->mb_total = t->fi->mb_count;
	st->mb_stored = t->mb_stored;
	st->mb_in = atomic_load(&t->mb_in);
	st->mb_in_at_open = t->mb_in_at_open;
	st->lb_in_at_open = t->lb_in_at_open;
	st->lb_total = t->fi->lb_count;
	/* As before the source: an LB counts as read once taken, whether it verified or not. */
	st->lb_demand = atomic_load(&t->src.n_demand) + atomic_load(&t->lb_demand_failed);
	st->lb_prefetch = atomic_load(&t->src.n_prefetch) + atomic_load(&t->lb_prefetch_failed);
	st->lb_failed = atomic_load(&t->lb_failed);
	st->lb_retries = atomic_load(&t->src.n_retries);
	st->bytes_read = atomic_load(&t->src.n_bytes);
	st->mb_decoded = atomic_load(&t->mb_decoded);
	st->requests = atomic_load(&t->requests);
	st->hits = atomic_load(&t->hits);
	st->joined = atomic_load(&t->joined);
	if (!fstat(t->memfd, &sb))
		st->mem_bytes = (uint64_t)sb.st_blocks * 512;
	pthread_mutex_lock(&t->src.lk);
	st->hot_mb = tpl_hot_count_locked(t, &st->hot_mb_prefix);
	st->error = t->error;
	pthread_mutex_unlock(&t->src.lk);
	st->complete = st->mb_in == st->mb_stored;
}

const char *halite_template_errmsg(const struct halite_template *t)
{
	return t ? t->errmsg : "";
}

void halite_template_free(struct halite_template *t)
{
	if (!t)
		return;
	/* The readers and prefetcher first: they hand the pool its tasks. */
	src_join(&t->src);
	halite_pool_free(t->pool);
	if (t->lbs)
		for (uint64_t lb = 0; lb < t->fi->lb_count; lb++) {
			while (t->lbs[lb].waiters) {
				struct session_waiter *w = t->lbs[lb].waiters;

				t->lbs[lb].waiters = w->next;
				free(w);
			}
			free(t->lbs[lb].msg);
		}
	if (t->fillmap)
		munmap(t->fillmap, FILL_HDR + t->fi->mb_count);
	if (t->memfd >= 0)
		close(t->memfd);
	if (t->ro_fd >= 0)
		close(t->ro_fd);
	if (t->fillfd >= 0)
		close(t->fillfd);
	if (t->src.ops)
		src_destroy(&t->src);
	else
		pthread_mutex_destroy(&t->src.lk);
	if (t->snap_fd >= 0)
		close(t->snap_fd);
	halite_reader_free(t->rd);
	halite_zfree(t->lbs);
	free(t->porder);
	free(t->hot);
	free(t->pre);
	halite_zfree(t->hot_bit);
	free(t->regions);
	free(t->mem_path);
	free(t->fill_path);
	free(t->hot_path);
	pthread_cond_destroy(&t->state_cv);
	free(t);
}
