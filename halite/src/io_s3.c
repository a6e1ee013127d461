// SPDX-License-Identifier: MIT
/*
 * The S3 backend: a snapshot at s3://BUCKET/KEY read with ranged GETs, so
 * that every reader of a snapshot (the format reader, the restore's
 * readers and prefetcher) reads an object as it reads a file.
 *
 * One object version. Open sends a HEAD for the size and the ETag, and
 * every read after it is a GET conditional on that ETag (If-Match): an
 * object replaced while it is read fails the read with
 * -HALITE_S3_E_CHANGED instead of handing back bytes of two snapshots.
 * halite_io_reopen() gives another handle on the same version (the
 * reader's LB handle, the restore's prefetch handle) without a new HEAD,
 * so all of them read the one the first HEAD saw.
 *
 * Clients. A halite_s3 handle is one thread's at a time, so the object
 * keeps a pool of them, opened as concurrent callers need them (at most
 * S3_POOL_MAX) and kept, each with its connections kept alive: a
 * synchronous read takes one for the length of its GET.
 *
 * Asynchronous reads. Submit queues the request to the handle's workers
 * (min(queue_depth, S3_WORKERS_MAX) threads, started at the first
 * submit), each of which runs one GET at a time on a pooled client, for
 * the request it takes and the queued ones that continue it in the file
 * (up to S3_COALESCE_MAX: the prefetcher's LBs, several per round trip); wait
 * hands their completions to halite_io_req_complete() on the owner's
 * thread, as the kernel backends do.
 *
 * Kept ranges. halite_io_readahead() fetches a range in one GET and keeps
 * it: the reader asks for the head and the tail of the file (footer,
 * directory, sections) so that opening costs a few GETs, not one per
 * structure. A read wholly inside a kept range is answered from memory.
 *
 * Retries (network errors, 5xx, throttling) are the S3 client's, with
 * backoff and jitter (docs/object-store.md); what reaches a caller here
 * is final.
 *
 * The host's LB cache (lbcache.h, HALITE_CACHE_DIR): every read of an
 * object's data asks it first and keeps a whole answer there (io_s3_get(),
 * run_get()), keyed by the snapshot's uuid once the reader has named it
 * (halite_io_cache_key()) and the offset. The reads at open come before
 * the uuid is known and always go to the store.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <halite/format.h>

#include "cli.h"
#include "endian_util.h"
#include "io_internal.h"
#include "lbcache.h"
#include "pool.h"
#include "s3.h"

/* Clients per object at most: the restore's readers plus its prefetch workers. */
#define S3_POOL_MAX 24u
/* Asynchronous GETs in flight per handle at most, whatever the queue depth. */
#define S3_WORKERS_MAX 8u
/*
 * Once open, how long a read waits for a store that does not answer (or
 * answers 5xx) before it fails, unless HALITE_S3_RETRY_FOR says: a restore's
 * guest waits on its pages meanwhile, and runs on when the store is back.
 */
#define S3_READ_RETRY_FOR_MS 60000u
/*
 * ... retrying at least every second (full jitter under that ceiling): the
 * guest runs on at most about a second after the store is back. The open
 * keeps the configuration's (5 s).
 */
#define S3_READ_BACKOFF_CAP_MS 1000u
/* Bytes one GET of the asynchronous reads covers at most (several LBs in a run). */
#define S3_COALESCE_MAX (1u << 20)
/* Kept ranges per handle. */
#define S3_KEPT_MAX 4u

struct s3_obj {
	_Atomic unsigned refs;
	struct halite_s3_config cfg;
	char *bucket, *key, *url;
	struct halite_s3_object head;

	pthread_mutex_t lk;
	pthread_cond_t cv;
	struct halite_s3 *all[S3_POOL_MAX]; /* every client opened, for the counts */
	struct halite_s3 *idle[S3_POOL_MAX];
	unsigned nall, nidle;
	char errmsg[512]; /* the last failure's sentence */

	/* The clients' retries: the open's (HEAD) until it is done, then the reads'. */
	unsigned retry_for_ms, backoff_cap_ms;

	/* The host's LB cache (HALITE_CACHE_DIR), once the reader has named the snapshot. */
	struct halite_lbcache *cache;
	uint8_t uuid[16];
	_Atomic bool keyed;
	_Atomic uint64_t put_errors; /* puts the cache refused (a full disk, ...) */
};

struct s3_kept {
	uint64_t off;
	size_t len;
	uint8_t *buf;
};

struct io_s3 {
	struct s3_obj *obj;
	struct s3_kept kept[S3_KEPT_MAX];
	unsigned nkept;

	/* Asynchronous requests: queued, then done; both lists by req->next. */
	pthread_mutex_t lk;
	pthread_cond_t work_cv, done_cv;
	struct io_req *queue_head, *queue_tail;
	struct io_req *done_head, *done_tail;
	pthread_t workers[S3_WORKERS_MAX];
	unsigned nworkers, want_workers;
	bool stop;
};

bool halite_io_is_s3_path(const char *path)
{
	return path && !strncmp(path, "s3://", 5);
}

static void obj_put(struct s3_obj *o)
{
	if (!o || atomic_fetch_sub(&o->refs, 1) != 1)
		return;
	for (unsigned i = 0; i < S3_POOL_MAX; i++)
		halite_s3_close(o->all[i]);
	halite_lbcache_close(o->cache);
	pthread_mutex_destroy(&o->lk);
	pthread_cond_destroy(&o->cv);
	halite_s3_config_clear(&o->cfg);
	free(o->bucket);
	free(o->key);
	free(o->url);
	free(o);
}

/* A client of the pool, opened if none is idle and the pool has room. */
static int obj_client_get(struct s3_obj *o, struct halite_s3 **sp)
{
	struct halite_s3 *s;
	int ret;

	pthread_mutex_lock(&o->lk);
	while (!o->nidle && o->nall == S3_POOL_MAX)
		pthread_cond_wait(&o->cv, &o->lk);
	if (o->nidle) {
		*sp = o->idle[--o->nidle];
		halite_s3_set_retry(*sp, o->retry_for_ms, o->backoff_cap_ms);
		pthread_mutex_unlock(&o->lk);
		return 0;
	}
	/* Taken before opening, so the pool never grows past its bound. */
	o->nall++;
	pthread_mutex_unlock(&o->lk);
	ret = halite_s3_open(&s, &o->cfg, o->bucket);
	pthread_mutex_lock(&o->lk);
	if (ret) {
		o->nall--;
		pthread_cond_signal(&o->cv);
	} else {
		/* Clients are kept until the object goes: the first free slot is this one's. */
		for (unsigned i = 0; i < S3_POOL_MAX; i++)
			if (!o->all[i]) {
				o->all[i] = s;
				break;
			}
		halite_s3_set_retry(s, o->retry_for_ms, o->backoff_cap_ms);
		*sp = s;
	}
	pthread_mutex_unlock(&o->lk);
	return ret;
}

static void obj_client_put(struct s3_obj *o, struct halite_s3 *s, int err)
{
	pthread_mutex_lock(&o->lk);
	if (err)
		snprintf(o->errmsg, sizeof(o->errmsg), "%s", halite_s3_errmsg(s));
	o->idle[o->nidle++] = s;
	pthread_cond_signal(&o->cv);
	pthread_mutex_unlock(&o->lk);
}

/*
 * The host's LB cache, if HALITE_CACHE_DIR names one (the tools'
 * --cache-dir sets it): opened by every object, so every restore, clone
 * and inspection on the host shares it. A cache named but unusable fails
 * the open: a host meant to read each LB from the store once should not
 * quietly read them all again.
 */
static int obj_cache_open(struct s3_obj *o)
{
	const char *dir = getenv("HALITE_CACHE_DIR"), *size = getenv("HALITE_CACHE_SIZE");
	uint64_t max = HALITE_CACHE_SIZE_DEFAULT;
	char why[384];
	int ret;

	if (!dir || !*dir)
		return 0;
	if (size && *size && (halite_parse_size(size, &max) || !max)) {
		snprintf(o->errmsg, sizeof(o->errmsg), "HALITE_CACHE_SIZE=%s: not a size "
			 "(bytes, or with K, M, G)", size);
		return -EINVAL;
	}
	ret = halite_lbcache_open(&o->cache, dir, max, why, sizeof(why));
	if (ret)
		snprintf(o->errmsg, sizeof(o->errmsg), "%s: the host's LB cache: %s", o->url, why);
	return ret;
}

static int obj_open(struct s3_obj **op, const char *url, char *err, size_t errlen)
{
	char why[256];
	struct s3_obj *o;
	struct halite_s3 *s;
	int ret;

	o = calloc(1, sizeof(*o));
	if (!o)
		return -ENOMEM;
	atomic_init(&o->refs, 1);
	pthread_mutex_init(&o->lk, NULL);
	pthread_cond_init(&o->cv, NULL);
	o->url = strdup(url);
	if (!o->url) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = halite_s3_parse_url(url, &o->bucket, &o->key, why, sizeof(why));
	if (ret) {
		snprintf(o->errmsg, sizeof(o->errmsg), "%s: %s", url, why);
		goto fail;
	}
	ret = halite_s3_config_load(&o->cfg, why, sizeof(why));
	if (ret) {
		snprintf(o->errmsg, sizeof(o->errmsg), "%s: %s", url, why);
		goto fail;
	}
	o->retry_for_ms = o->cfg.retry_for_ms;
	o->backoff_cap_ms = o->cfg.backoff_cap_ms;
	ret = obj_cache_open(o);
	if (ret)
		goto fail;
	ret = obj_client_get(o, &s);
	if (ret)
		goto fail;
	ret = halite_s3_head(s, o->key, &o->head);
	obj_client_put(o, s, ret);
	if (!ret && !o->head.etag[0]) {
		/* Without an ETag no read could be pinned to this version. */
		snprintf(o->errmsg, sizeof(o->errmsg), "HEAD %s: the store sent no ETag", url);
		ret = -HALITE_S3_E_PROTOCOL;
	}
	if (ret)
		goto fail;
	/* A wrong endpoint fails the open at once; a store gone later is waited for. */
	o->retry_for_ms = o->cfg.retry_for_set ? o->cfg.retry_for_ms : S3_READ_RETRY_FOR_MS;
	o->backoff_cap_ms = HALITE_MIN(o->cfg.backoff_cap_ms, S3_READ_BACKOFF_CAP_MS);
	*op = o;
	return 0;
fail:
	snprintf(err, errlen, "%s", o->errmsg);
	obj_put(o);
	return ret;
}

static const struct s3_kept *s3_kept_find(const struct io_s3 *x, uint64_t off, size_t len)
{
	for (unsigned i = 0; i < x->nkept; i++) {
		const struct s3_kept *k = &x->kept[i];

		if (off >= k->off && off - k->off <= k->len && len <= k->len - (off - k->off))
			return k;
	}
	return NULL;
}

/* One ranged GET of the pinned version: the bytes read (fewer only at the end) or < 0. */
static int64_t io_s3_fetch(struct s3_obj *o, void *buf, size_t len, uint64_t off)
{
	struct halite_s3 *s;
	int64_t n;
	int ret;

	ret = obj_client_get(o, &s);
	if (ret)
		return ret;
	n = halite_s3_get_range(s, o->key, off, len, buf, o->head.etag);
	obj_client_put(o, s, n < 0 ? (int)n : 0);
	return n;
}

/* Whether the cache may answer and keep reads now: one is named and keyed. */
static bool cache_on(struct s3_obj *o)
{
	return o->cache && atomic_load(&o->keyed);
}

/* @len bytes at @off from the cache: true on a hit. */
static bool cache_hit(struct s3_obj *o, void *buf, size_t len, uint64_t off)
{
	return cache_on(o) && off + len <= o->head.size &&
	       halite_lbcache_get(o->cache, o->uuid, off, buf, len) == 1;
}

/* A whole answer into the cache. The read stands whatever the cache says. */
static void cache_keep(struct s3_obj *o, uint64_t off, const void *buf, size_t len)
{
	int ret = halite_lbcache_put(o->cache, o->uuid, off, buf, len);

	/* A cache that cannot keep it costs a later read, not this one. */
	if (ret && ret != -HALITE_E_LIMIT)
		atomic_fetch_add(&o->put_errors, 1);
}

/*
 * @len bytes at @off of the pinned version: from the host's LB cache when
 * it has them, else one ranged GET, whose bytes the cache then keeps. The
 * bytes read (fewer only at the end) or < 0. Only whole answers are kept,
 * and only once the reader has named the snapshot (its uuid is the key):
 * what a snapshot's bytes are never depends on which object they came from.
 */
static int64_t io_s3_get(struct s3_obj *o, void *buf, size_t len, uint64_t off)
{
	int64_t n;

	if (off >= o->head.size)
		return 0;
	if (cache_hit(o, buf, len, off))
		return (int64_t)len;
	n = io_s3_fetch(o, buf, len, off);
	if (cache_on(o) && n == (int64_t)len)
		cache_keep(o, off, buf, len);
	return n;
}

int halite_io_s3_read(struct halite_io *io, void *buf, size_t len, uint64_t off)
{
	struct io_s3 *x = io->s3;
	const struct s3_kept *k = s3_kept_find(x, off, len);
	int64_t n;

	if (k) {
		memcpy(buf, k->buf + (off - k->off), len);
		return 0;
	}
	if (!len)
		return 0;
	n = io_s3_get(x->obj, buf, len, off);
	if (n < 0)
		return (int)n;
	return (size_t)n < len ? -HALITE_E_TRUNCATED : 0;
}

/*
 * A new range that ends where a kept one starts (the reader's sections
 * below its tail) joins it, so that a read across the seam is still
 * answered from memory.
 */
int halite_io_readahead(struct halite_io *io, uint64_t off, uint64_t len)
{
	struct io_s3 *x = io->s3;
	struct s3_kept *k, *next = NULL;
	size_t total;
	uint8_t *buf;
	int64_t n;

	if (!x || !len || s3_kept_find(x, off, (size_t)len))
		return 0;
	if (len > SIZE_MAX / 2)
		return -ENOMEM;
	for (unsigned i = 0; i < x->nkept; i++)
		if (x->kept[i].off == off + len && x->kept[i].len <= SIZE_MAX / 2)
			next = &x->kept[i];
	if (!next && x->nkept == S3_KEPT_MAX)
		return -ENOSPC;
	total = (size_t)len + (next ? next->len : 0);
	buf = malloc(total);
	if (!buf)
		return -ENOMEM;
	n = io_s3_get(x->obj, buf, (size_t)len, off);
	if (n < 0 || (uint64_t)n != len) {
		free(buf);
		return n < 0 ? (int)n : -HALITE_E_TRUNCATED;
	}
	if (next) {
		memcpy(buf + len, next->buf, next->len);
		free(next->buf);
		k = next;
	} else {
		k = &x->kept[x->nkept++];
	}
	*k = (struct s3_kept){ .off = off, .len = total, .buf = buf };
	return 0;
}

int halite_io_share_kept(struct halite_io *io, const struct halite_io *from)
{
	struct io_s3 *x = io->s3;
	const struct io_s3 *f = from->s3;

	if (!x || !f || x->obj != f->obj)
		return 0;
	for (unsigned i = 0; i < f->nkept && x->nkept < S3_KEPT_MAX; i++) {
		const struct s3_kept *k = &f->kept[i];
		uint8_t *buf;

		if (s3_kept_find(x, k->off, k->len))
			continue;
		buf = malloc(k->len);
		if (!buf)
			return -ENOMEM;
		memcpy(buf, k->buf, k->len);
		x->kept[x->nkept++] = (struct s3_kept){ .off = k->off, .len = k->len, .buf = buf };
	}
	return 0;
}

/* ---- asynchronous reads ------------------------------------------------- */

/*
 * The queued requests that continue @first's range in the file, taken off
 * the queue (under x->lk) and chained behind it by req->next: one GET for
 * all, up to S3_COALESCE_MAX bytes. The prefetcher submits LBs in the
 * order it wants them, which is mostly the file's: several LBs then cost
 * one round trip, not one each.
 */
static void take_run(struct io_s3 *x, struct io_req *first)
{
	struct io_req *last = first, *r;
	uint64_t end = first->off + first->len;
	size_t total = first->len - first->done;

	first->next = NULL;
	if (first->done)
		return; /* a short answer's rest: alone */
	while ((r = x->queue_head) && !r->done && r->off == end &&
	       total + r->len <= S3_COALESCE_MAX) {
		x->queue_head = r->next;
		if (!x->queue_head)
			x->queue_tail = NULL;
		r->next = NULL;
		last->next = r;
		last = r;
		end += r->len;
		total += r->len;
	}
}

/*
 * The requests chained at @run, each one's result set: one GET over their
 * whole span into a buffer, split out; each piece offered to the cache as
 * if read alone (its key is its offset). A piece the cache has is served
 * from it, and the GET covers only the span from the first piece it lacks
 * to the last.
 */
static void run_get(struct s3_obj *o, struct io_req *run)
{
	struct io_req *r, *lo = NULL, *hi = NULL;
	uint64_t span;
	uint8_t *buf;
	int64_t n;

	if (!run->next) {
		run->res = io_s3_get(o, run->buf + run->done, run->len - run->done,
				     run->off + run->done);
		return;
	}
	for (r = run; r; r = r->next) {
		r->res = -1;
		if (cache_hit(o, r->buf, r->len, r->off)) {
			r->res = (int64_t)r->len;
			continue;
		}
		if (!lo)
			lo = r;
		hi = r;
	}
	if (!lo)
		return;
	span = HALITE_MIN(hi->off + hi->len, o->head.size);
	span = span > lo->off ? span - lo->off : 0;
	buf = span ? malloc(span) : NULL;
	n = !span ? 0 : buf ? io_s3_fetch(o, buf, span, lo->off) : -ENOMEM;
	for (r = lo; r != hi->next; r = r->next) {
		uint64_t at = r->off - lo->off;

		if (r->res >= 0)
			continue;
		if (n < 0) {
			r->res = n;
		} else if ((uint64_t)n <= at) {
			r->res = 0; /* past the object's end */
		} else {
			r->res = (int64_t)HALITE_MIN((uint64_t)n - at, r->len);
			memcpy(r->buf, buf + at, (size_t)r->res);
			if (cache_on(o) && (size_t)r->res == r->len)
				cache_keep(o, r->off, r->buf, r->len);
		}
	}
	free(buf);
}

/*
 * halite_io_read_run(): the pieces as a run of requests for run_get(), one
 * GET for those neither a kept range nor the cache answers.
 */
int halite_io_s3_read_run(struct halite_io *io, uint8_t *const *bufs, unsigned n, size_t len,
			  uint64_t off)
{
	struct io_s3 *x = io->s3;
	struct io_req *reqs, *head = NULL, **link = &head;
	int ret = 0;

	reqs = calloc(n, sizeof(*reqs));
	if (!reqs)
		return -ENOMEM;
	for (unsigned i = 0; i < n; i++) {
		uint64_t at = off + (uint64_t)i * len;
		const struct s3_kept *k = s3_kept_find(x, at, len);

		reqs[i] = (struct io_req){ .buf = (char *)bufs[i], .len = len, .off = at,
					   .res = (int64_t)len };
		if (k) {
			memcpy(bufs[i], k->buf + (at - k->off), len);
			continue;
		}
		*link = &reqs[i];
		link = &reqs[i].next;
	}
	if (head)
		run_get(x->obj, head);
	for (unsigned i = 0; i < n && !ret; i++)
		if (reqs[i].res < 0)
			ret = (int)reqs[i].res;
		else if ((size_t)reqs[i].res < len)
			ret = -HALITE_E_TRUNCATED;
	free(reqs);
	return ret;
}

static void *s3_worker(void *arg)
{
	struct halite_io *io = arg;
	struct io_s3 *x = io->s3;
	struct io_req *req;

	pthread_mutex_lock(&x->lk);
	for (;;) {
		while (!x->stop && !x->queue_head)
			pthread_cond_wait(&x->work_cv, &x->lk);
		if (!x->queue_head)
			break;
		req = x->queue_head;
		x->queue_head = req->next;
		if (!x->queue_head)
			x->queue_tail = NULL;
		take_run(x, req);
		pthread_mutex_unlock(&x->lk);

		run_get(x->obj, req);

		pthread_mutex_lock(&x->lk);
		/* The run joins the done list whole, in order. */
		if (x->done_tail)
			x->done_tail->next = req;
		else
			x->done_head = req;
		while (req->next)
			req = req->next;
		x->done_tail = req;
		pthread_cond_signal(&x->done_cv);
	}
	pthread_mutex_unlock(&x->lk);
	return NULL;
}

static int s3_init(struct halite_io *io)
{
	struct io_s3 *x = io->s3;

	x->want_workers = io->qd < S3_WORKERS_MAX ? io->qd : S3_WORKERS_MAX;
	return 0;
}

static int s3_submit(struct halite_io *io, struct io_req *req)
{
	struct io_s3 *x = io->s3;
	int ret = 0;

	if (req->write)
		return -EROFS;
	pthread_mutex_lock(&x->lk);
	/* One more worker per request in flight, up to the bound: none idle for nothing. */
	if (x->nworkers < x->want_workers && x->nworkers < io->active + 1) {
		ret = halite_thread_start(&x->workers[x->nworkers], s3_worker, io);
		if (!ret)
			x->nworkers++;
		else if (x->nworkers)
			ret = 0; /* the others carry it */
	}
	if (!ret) {
		req->next = NULL;
		if (x->queue_tail)
			x->queue_tail->next = req;
		else
			x->queue_head = req;
		x->queue_tail = req;
		io->active++;
		pthread_cond_signal(&x->work_cv);
	}
	pthread_mutex_unlock(&x->lk);
	return ret;
}

static int s3_wait(struct halite_io *io, unsigned min, uint64_t timeout_ns)
{
	struct io_s3 *x = io->s3;
	struct io_req *list, *req;
	struct timespec ts;
	int n = 0;

	pthread_mutex_lock(&x->lk);
	if (min && !x->done_head && timeout_ns != UINT64_MAX) {
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += (time_t)(timeout_ns / 1000000000u);
		ts.tv_nsec += (long)(timeout_ns % 1000000000u);
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		while (!x->done_head)
			if (pthread_cond_timedwait(&x->done_cv, &x->lk, &ts) == ETIMEDOUT)
				break;
	} else if (min) {
		while (!x->done_head)
			pthread_cond_wait(&x->done_cv, &x->lk);
	}
	list = x->done_head;
	x->done_head = x->done_tail = NULL;
	pthread_mutex_unlock(&x->lk);

	/* Completed on the owner's thread: the done list and free slots are its own. */
	while ((req = list)) {
		list = req->next;
		io->active--;
		halite_io_req_complete(io, req, req->res);
		n++;
	}
	return n;
}

void halite_io_s3_free(struct io_s3 *x)
{
	if (!x)
		return;
	pthread_mutex_lock(&x->lk);
	x->stop = true;
	pthread_cond_broadcast(&x->work_cv);
	pthread_mutex_unlock(&x->lk);
	for (unsigned i = 0; i < x->nworkers; i++)
		pthread_join(x->workers[i], NULL);
	for (unsigned i = 0; i < x->nkept; i++)
		free(x->kept[i].buf);
	pthread_mutex_destroy(&x->lk);
	pthread_cond_destroy(&x->work_cv);
	pthread_cond_destroy(&x->done_cv);
	obj_put(x->obj);
	free(x);
}

static void s3_exit(struct halite_io *io)
{
	halite_io_s3_free(io->s3);
	io->s3 = NULL;
}

const struct io_backend_ops halite_io_s3_ops = {
	.id = HALITE_IO_S3,
	.init = s3_init,
	.submit = s3_submit,
	.wait = s3_wait,
	.exit = s3_exit,
};

/* ---- open, the object's facts ------------------------------------------- */

static struct io_s3 *io_s3_new(struct s3_obj *obj)
{
	struct io_s3 *x = calloc(1, sizeof(*x));

	if (!x)
		return NULL;
	x->obj = obj;
	pthread_mutex_init(&x->lk, NULL);
	pthread_cond_init(&x->work_cv, NULL);
	pthread_cond_init(&x->done_cv, NULL);
	return x;
}

/* Why this thread's last open of an object failed: the object is gone by then. */
static _Thread_local char open_err[512];

const char *halite_io_open_errmsg(void)
{
	return open_err;
}

int halite_io_s3_open(struct io_s3 **xp, const char *url, const struct halite_io *from)
{
	struct s3_obj *obj;
	int ret;

	open_err[0] = 0;
	if (from) {
		obj = from->s3->obj;
		atomic_fetch_add(&obj->refs, 1);
	} else {
		ret = obj_open(&obj, url, open_err, sizeof(open_err));
		if (ret)
			return ret;
	}
	*xp = io_s3_new(obj);
	if (!*xp) {
		obj_put(obj);
		return -ENOMEM;
	}
	return 0;
}

int halite_io_size(const struct halite_io *io, uint64_t *size)
{
	struct stat st;

	if (io->s3) {
		*size = io->s3->obj->head.size;
		return 0;
	}
	if (fstat(io->fd, &st))
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	*size = (uint64_t)st.st_size;
	return 0;
}

void halite_io_errmsg(const struct halite_io *io, char *buf, size_t len)
{
	struct s3_obj *o = io->s3 ? io->s3->obj : NULL;

	if (!len)
		return;
	buf[0] = 0;
	if (!o)
		return;
	/* Under the pool's lock: a failing request writes it there (obj_client_put()). */
	pthread_mutex_lock(&o->lk);
	snprintf(buf, len, "%s", o->errmsg);
	pthread_mutex_unlock(&o->lk);
}

const char *halite_io_url(const struct halite_io *io)
{
	return io->s3 ? io->s3->obj->url : NULL;
}

const char *halite_io_etag(const struct halite_io *io)
{
	return io->s3 ? io->s3->obj->head.etag : NULL;
}

void halite_io_cache_key(struct halite_io *io, const uint8_t uuid[16])
{
	struct s3_obj *o = io->s3 ? io->s3->obj : NULL;

	if (!o || atomic_load(&o->keyed))
		return;
	/* Before keyed is seen set: readers load keyed first, then uuid. */
	memcpy(o->uuid, uuid, sizeof(o->uuid));
	atomic_store(&o->keyed, true);
}

void halite_io_cache_drop(struct halite_io *io, uint64_t off)
{
	struct s3_obj *o = io->s3 ? io->s3->obj : NULL;

	if (o && o->cache && atomic_load(&o->keyed))
		halite_lbcache_drop(o->cache, o->uuid, off);
}

void halite_io_store_stats(const struct halite_io *io, struct halite_store_stats *st)
{
	struct halite_s3_stats s3;
	struct halite_lbcache_stats c;
	struct s3_obj *o = io->s3 ? io->s3->obj : NULL;

	memset(st, 0, sizeof(*st));
	if (!o)
		return;
	halite_io_s3_stats(io, &s3);
	st->requests = s3.requests;
	st->retries = s3.retries;
	st->bytes = s3.bytes_down;
	st->connects = s3.connects;
	if (!o->cache)
		return;
	halite_lbcache_stats(o->cache, &c);
	st->cached = true;
	st->cache_hits = c.hits;
	st->cache_misses = c.misses;
	st->cache_bytes_hit = c.bytes_hit;
	st->cache_puts = c.puts;
	st->cache_put_errors = atomic_load(&o->put_errors);
	st->cache_evictions = c.evictions;
}

/*
 * Plain reads of counters a client in use may be adding to (halite_s3 has
 * no lock for them): aligned 64-bit words, each read whole, perhaps a
 * request behind, which is all a report needs. Tests read them at rest.
 */
void halite_io_s3_stats(const struct halite_io *io, struct halite_s3_stats *st)
{
	struct s3_obj *o;

	memset(st, 0, sizeof(*st));
	if (!io->s3)
		return;
	o = io->s3->obj;
	pthread_mutex_lock(&o->lk);
	for (unsigned i = 0; i < S3_POOL_MAX; i++) {
		struct halite_s3_stats one;

		if (!o->all[i])
			continue;
		halite_s3_get_stats(o->all[i], &one);
		st->requests += one.requests;
		st->retries += one.retries;
		st->bytes_up += one.bytes_up;
		st->bytes_down += one.bytes_down;
		st->connects += one.connects;
	}
	pthread_mutex_unlock(&o->lk);
}
