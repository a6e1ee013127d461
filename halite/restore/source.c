/* SPDX-License-Identifier: MIT */
/*
 * A snapshot source's reading (source.h): its LB states, the demand queue
 * and its reader threads, stream readahead (ra_next), a read straight from
 * the page cache (src_read_cached), an LB's read again after a failure,
 * and the message that names a failed LB.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/uio.h>

#include <halite/errors.h>

#include "endian_util.h"
#include "pool.h"
#include "reader_io.h"
#include "source.h"
#include "zalloc.h"

#define ULL(x) ((unsigned long long)(x))

/*
 * An object's reads (read_span()) cover this many bytes of LBs at most: at
 * tens of milliseconds a round trip, 512 KiB is a small part of one at a
 * store's usual bandwidth per connection, and the prefetcher's GETs stay
 * the larger ones (S3_COALESCE_MAX).
 */
#define SRC_OBJECT_SPAN (512u << 10)
/*
 * An object's prefetcher keeps this many bytes of LBs queued at least: the
 * S3 backend's workers coalesce queued LBs that follow each other into
 * GETs of up to 1 MiB, 8 in flight (io_s3.c), so a queue of 8 LBs of
 * 64 KiB would make one GET at a time.
 */
#define SRC_OBJECT_QUEUED (8u << 20)

int src_read_lb(struct halite_reader *rd, uint64_t lb, void *buf, _Atomic uint64_t *bytes_read)
{
	int ret = halite_reader_read_lb(rd, lb, buf);

	/* A checksum mismatch read the bytes too: they count as read. */
	if (!ret || ret == -HALITE_E_LB_CHECKSUM)
		atomic_fetch_add(bytes_read, halite_reader_info(rd)->lb_size);
	return ret;
}

void src_lb_errmsg(struct halite_reader *rd, uint64_t lb, const char *why, char *buf, size_t len)
{
	struct halite_lb_info li = { 0 };
	/* An object's reads fail for reasons of the store: say which object. */
	const char *url = halite_io_url(halite_reader_io(rd));
	const char *sep = url ? ": " : "";

	if (!url)
		url = "";
	if (halite_reader_lb_info(rd, lb, &li))
		snprintf(buf, len, "%s%slocality block %llu: %s", url, sep, ULL(lb), why);
	else
		snprintf(buf, len, "%s%slocality block %llu at offset %llu: %s", url, sep, ULL(lb),
			 ULL(li.offset), why);
}

void src_error(struct src *s, int err, const char *msg)
{
	if (s->ops->error)
		s->ops->error(s->ctx, err, msg);
}

/*
 * Before reading an LB again: drop its page-cache copy (clean pages only),
 * so the retry reaches the device rather than the same cached bytes.
 */
void src_lb_retrying(struct src *s, uint64_t lb, int err, unsigned reads)
{
	struct halite_lb_info li = { 0 };
	char why[128], msg[256];

	halite_reader_lb_info(s->rd, lb, &li);
	atomic_fetch_add(&s->n_retries, 1);
	snprintf(why, sizeof(why), "%s; reading it again (%u of %u)", halite_strerror(err),
		 reads + 1, s->o.read_retries + 1);
	src_lb_errmsg(s->rd, lb, why, msg, sizeof(msg));
	halite_logf(s->log, HALITE_LOG_WARN, "%s", msg);
	/* An object (fd -1) has no page cache, but the host's LB cache may hold it. */
	if (s->fd >= 0)
		posix_fadvise(s->fd, (off_t)li.offset, s->lb_size, POSIX_FADV_DONTNEED);
	else
		halite_io_cache_drop(halite_reader_io(s->rd), li.offset);
}

/*
 * One LB into @buf, verified, read again up to read_retries times if it
 * fails (each time from the device: src_lb_retrying()). 0, or the last
 * failure, with *@reads saying how many reads it took.
 */
int src_read_lb_retrying(struct src *s, uint64_t lb, uint8_t *buf, unsigned *reads)
{
	int ret;

	for (*reads = 1;; (*reads)++) {
		ret = src_read_lb(s->rd, lb, buf, &s->n_bytes);
		if (!ret || *reads > s->o.read_retries || atomic_load(&s->failed) ||
		    src_read_final(ret))
			return ret;
		src_lb_retrying(s, lb, ret, *reads);
	}
}

void src_lb_failed(struct src *s, uint64_t lb, int err, unsigned reads)
{
	char why[448], msg[512];
	const char *what = err == -HALITE_E_LB_CHECKSUM ? "checksum mismatch" :
			   err == -HALITE_E_CHECKSUM || err == -HALITE_E_CORRUPT ?
			   halite_reader_errmsg(s->rd) : halite_strerror(err);

	char req[256];

	/* An object's failed request says what the store did, and for how long. */
	halite_io_errmsg(halite_reader_io(s->rd), req, sizeof(req));
	if (err <= -HALITE_S3_E_BASE && req[0])
		snprintf(why, sizeof(why), "%s after %u read%s (%s)", what, reads,
			 reads == 1 ? "" : "s", req);
	else
		snprintf(why, sizeof(why), "%s after %u read%s", what, reads, reads == 1 ? "" : "s");
	src_lb_errmsg(s->rd, lb, why, msg, sizeof(msg));
	src_lb_fail(s, lb, err, msg);
}

void src_lb_fail(struct src *s, uint64_t lb, int err, const char *msg)
{
	pthread_mutex_lock(&s->lk);
	atomic_store(&s->st[lb], LB_FAILED);
	pthread_mutex_unlock(&s->lk);
	s->ops->failed(s->ctx, lb, err, msg);
}

void src_land(struct src *s, uint64_t lb, uint8_t *buf, int how, uint8_t *tmp)
{
	/* After a failure nothing more is handed on. */
	if (atomic_load(&s->failed)) {
		halite_reader_free_lb(buf);
		return;
	}
	atomic_fetch_add(how == SRC_DEMAND ? &s->n_demand : &s->n_prefetch, 1);
	s->ops->landed(s->ctx, lb, buf, how, tmp);
}

/*
 * Under lk. The caller signals q_cond after unlocking: a reader woken under
 * the lock would run, find lk held and sleep again, two context switches
 * on the fault's path (on 2 cores, measured by halite-bench fault).
 */
int src_queue_push(struct src *s, uint64_t lb)
{
	if (s->q_len == s->q_cap) {
		size_t cap = s->q_cap ? 2 * s->q_cap : 64;
		uint64_t *q = malloc(cap * sizeof(*q));

		if (!q)
			return -ENOMEM;
		for (size_t i = 0; i < s->q_len; i++)
			q[i] = s->q[(s->q_head + i) % s->q_cap];
		free(s->q);
		s->q = q;
		s->q_cap = cap;
		s->q_head = 0;
	}
	s->q[(s->q_head + s->q_len++) % s->q_cap] = lb;
	return 0;
}

/*
 * Under lk, after a demand read of @lb: the next LBs of its stream, those
 * nobody has read, to be read ahead. They are claimed only when a reader
 * takes them (ra_take), so dropping the oldest of a full queue loses
 * nothing but the hint. Returns how many readers may start on them now: the
 * caller signals q_cond that often once it has unlocked.
 */
size_t src_ra_push(struct src *s, uint64_t lb)
{
	if (!s->ra_next || (s->ops->ra_ok && !s->ops->ra_ok(s->ctx)))
		return 0;
	for (unsigned i = 0; i < s->o.readahead; i++) {
		lb = src_ra_next(s, lb);
		if (lb == UINT64_MAX)
			break;
		if (atomic_load(&s->st[lb]) != LB_IDLE)
			continue;
		if (s->raq_len == SRC_RA_QUEUE) {
			s->raq_head = (s->raq_head + 1) % SRC_RA_QUEUE;
			s->raq_len--;
		}
		s->raq[(s->raq_head + s->raq_len++) % SRC_RA_QUEUE] = lb;
	}
	return HALITE_MIN(s->raq_len, (size_t)(s->o.ra_readers - s->ra_busy));
}

/* A reader is through with its readahead read: another may take one. */
static void ra_done(struct src *s, bool ahead)
{
	bool more;

	if (!ahead)
		return;
	pthread_mutex_lock(&s->lk);
	s->ra_busy--;
	more = s->raq_len > 0;
	pthread_mutex_unlock(&s->lk);
	if (more)
		pthread_cond_signal(&s->q_cond);
}

/*
 * Under lk: an LB to read ahead, now READING, or UINT64_MAX. Readahead
 * takes at most ra_readers readers at a time, so the others stay free for
 * demand reads, which a consumer is waiting for.
 */
static uint64_t ra_take(struct src *s)
{
	while (s->raq_len && s->ra_busy < s->o.ra_readers) {
		uint64_t lb = s->raq[s->raq_head];

		s->raq_head = (s->raq_head + 1) % SRC_RA_QUEUE;
		s->raq_len--;
		if (atomic_load(&s->st[lb]) == LB_IDLE) {
			atomic_store(&s->st[lb], LB_READING);
			s->ra_busy++;
			return lb;
		}
	}
	return UINT64_MAX;
}

uint64_t src_read_run(struct src *s, uint64_t lb, unsigned n, uint8_t *const *bufs)
{
	uint64_t bad;

	/* Bytes that came back count as read, verified or not (src_read_lb()). */
	if (!halite_reader_read_lb_run(s->rd, lb, n, bufs, &bad))
		atomic_fetch_add(&s->n_bytes, (uint64_t)n * s->lb_size);
	return bad;
}

/* @lb (READING, ours) read alone, again on failure: landed as @how, or FAILED. */
static void read_one(struct src *s, uint64_t lb, uint8_t *buf, int how, uint8_t *tmp)
{
	unsigned reads;
	int ret = src_read_lb_retrying(s, lb, buf, &reads);

	if (ret) {
		halite_reader_free_lb(buf);
		src_lb_failed(s, lb, ret, reads);
		return;
	}
	src_land(s, lb, buf, how, tmp);
}

/*
 * Under lk, for a read of @lb from an object: @lb, then the LBs that follow
 * it in the file while nobody reads them (now READING, ours), at most
 * s->span in all, into @lbs. How many.
 */
static unsigned span_claim(struct src *s, uint64_t lb, uint64_t *lbs)
{
	unsigned n = 1;

	lbs[0] = lb;
	while (n < s->span && lb + n < s->lb_total && atomic_load(&s->st[lb + n]) == LB_IDLE) {
		atomic_store(&s->st[lb + n], LB_READING);
		lbs[n] = lb + n;
		n++;
	}
	return n;
}

/* LBs of a span read that did not come in: to the demand queue, read alone by any reader. */
static void span_requeue(struct src *s, const uint64_t *lbs, unsigned n, uint8_t *tmp)
{
	unsigned queued = 0;

	for (unsigned i = 0; i < n; i++) {
		uint8_t *buf;
		int ret;

		pthread_mutex_lock(&s->lk);
		ret = src_queue_push(s, lbs[i]);
		pthread_mutex_unlock(&s->lk);
		if (!ret) {
			queued++;
			continue;
		}
		/* No room to queue it: read it here. */
		buf = halite_reader_alloc_lb(s->rd);
		if (buf)
			read_one(s, lbs[i], buf, SRC_PREFETCH, tmp);
		else
			src_error(s, -ENOMEM, "a read buffer");
	}
	src_wake(s, queued);
}

/*
 * @lb (READING, ours) from an object, with the LBs after it that nobody
 * reads yet, in one request (halite_io_read_run()): a store's round trip
 * costs what tens of LBs' bytes do, and the LBs beside one in the file
 * were saved at the same time, so the guest wants them next (the
 * locality the file is laid out for). @lb lands as @how, first; the others
 * as prefetched (so not while ops.ra_ok says no: a restore learning wants
 * only what the guest asks for). Any that does not verify, and all after a failed request,
 * are read alone (@lb here, the others queued), as any LB is.
 */
static void read_span(struct src *s, uint64_t lb, uint8_t *buf, int how, uint8_t *tmp)
{
	uint64_t lbs[SRC_SPAN_MAX], bad;
	uint8_t *bufs[SRC_SPAN_MAX];
	unsigned n, got;

	/* Nothing comes in unasked while the consumer says so (a restore learning). */
	if (s->ops->ra_ok && !s->ops->ra_ok(s->ctx)) {
		read_one(s, lb, buf, how, tmp);
		return;
	}
	pthread_mutex_lock(&s->lk);
	n = span_claim(s, lb, lbs);
	pthread_mutex_unlock(&s->lk);
	bufs[0] = buf;
	for (got = 1; got < n && (bufs[got] = halite_reader_alloc_lb(s->rd)); got++)
		;
	/* Those without a buffer are read alone. */
	span_requeue(s, lbs + got, n - got, tmp);
	n = got;
	bad = src_read_run(s, lb, n, bufs);
	for (unsigned i = 0; i < n; i++) {
		if (!(bad & (1ull << i))) {
			src_land(s, lbs[i], bufs[i], i ? SRC_PREFETCH : how, tmp);
		} else if (!i) {
			read_one(s, lb, buf, how, tmp);
		} else {
			/* Did not come in: read alone by any reader. */
			halite_reader_free_lb(bufs[i]);
			span_requeue(s, lbs + i, 1, tmp);
		}
	}
}

static void *reader_main(void *arg)
{
	struct src *s = arg;
	uint8_t *tmp = halite_io_alloc(s->mb_size);

	pthread_setname_np(pthread_self(), s->o.thread_name);
	for (;;) {
		uint64_t lb = UINT64_MAX;
		bool ahead = false;
		uint8_t *buf;
		int how;

		pthread_mutex_lock(&s->lk);
		/* Demand first: a consumer waits for it. */
		while (!atomic_load(&s->stopping) && !s->q_len &&
		       (lb = ra_take(s)) == UINT64_MAX)
			pthread_cond_wait(&s->q_cond, &s->lk);
		if (atomic_load(&s->stopping)) {
			if (lb != UINT64_MAX)
				s->ra_busy--; /* left READING: nothing is read any more */
			pthread_mutex_unlock(&s->lk);
			break;
		}
		if (lb != UINT64_MAX) {
			ahead = true;
		} else {
			lb = s->q[s->q_head];
			s->q_head = (s->q_head + 1) % s->q_cap;
			s->q_len--;
		}
		pthread_mutex_unlock(&s->lk);
		if (atomic_load(&s->failed)) {
			ra_done(s, ahead);
			continue;
		}
		buf = tmp ? halite_reader_alloc_lb(s->rd) : NULL;
		if (!buf) {
			char msg[64];

			ra_done(s, ahead);
			snprintf(msg, sizeof(msg), "locality block %llu: read buffer", ULL(lb));
			src_error(s, -ENOMEM, msg);
			continue;
		}
		/* Read ahead, it is prefetched: nobody asked for it. */
		how = ahead ? SRC_PREFETCH : SRC_DEMAND;
		if (s->span > 1)
			read_span(s, lb, buf, how, tmp);
		else
			read_one(s, lb, buf, how, tmp);
		ra_done(s, ahead);
	}
	halite_io_free(tmp);
	return NULL;
}

/*
 * preadv2(RWF_NOWAIT) copies the whole LB from the page cache or fails at
 * once, never waiting for a device. That saves handing a fault to a reader
 * thread and back, the largest cost of a fault on cached data after the
 * copy itself (halite-bench fault). Verified like any read, then landed as
 * a demand read, with readahead queued as the readers' path does. A miss
 * or a bad copy is not counted: the readers read it as usual, retries
 * included.
 */
bool src_read_cached(struct src *s, uint64_t lb, uint8_t *tmp)
{
	struct halite_lb_info li;
	struct iovec iov;
	size_t wake;
	uint8_t *buf;
	ssize_t n;

	/* An object (fd -1) has no page cache to look in. */
	if (s->fd < 0)
		return false;
	buf = halite_reader_alloc_lb(s->rd);
	if (!buf)
		return false;
	halite_reader_lb_info(s->rd, lb, &li);
	iov = (struct iovec){ buf, s->lb_size };
	n = preadv2(s->fd, &iov, 1, (off_t)li.offset, RWF_NOWAIT);
	if (n != (ssize_t)s->lb_size || halite_reader_verify_lb(s->rd, lb, buf)) {
		halite_reader_free_lb(buf);
		return false;
	}
	atomic_fetch_add(&s->n_bytes, s->lb_size);
	pthread_mutex_lock(&s->lk);
	wake = src_ra_push(s, lb);
	pthread_mutex_unlock(&s->lk);
	src_wake(s, wake);
	src_land(s, lb, buf, SRC_DEMAND, tmp);
	return true;
}

/*
 * ra_next: each LB's successor in its stream. The writer fills a stream's
 * LBs in order, so in file order each stream's LBs come by rising seq, and
 * a file has a few streams (one per vCPU, virtual, physical, other) that
 * interleave: the successor is a few LBs on. It is looked up when first
 * needed, scanning at most RA_SCAN entries (none found: no readahead, a
 * hint), and kept. Open only allocates (zalloc: pages appear as used), so
 * it does not read the whole LB table (a 1.1 file's chunks come in on use).
 */
#define RA_SCAN 256u

uint64_t src_ra_next(struct src *s, uint64_t lb)
{
	struct halite_lb_info li, ln;
	uint64_t next = UINT64_MAX;

	if (s->ra_next[lb])
		return s->ra_next[lb] == UINT64_MAX ? UINT64_MAX : s->ra_next[lb] - 1;
	if (!halite_reader_lb_info(s->rd, lb, &li))
		for (uint64_t k = lb + 1; k < s->lb_total && k <= lb + RA_SCAN; k++)
			if (!halite_reader_lb_info(s->rd, k, &ln) && ln.stream == li.stream) {
				next = k;
				break;
			}
	s->ra_next[lb] = next == UINT64_MAX ? UINT64_MAX : next + 1;
	return next;
}

int src_init(struct src *s, struct halite_reader *rd, const char *path, int fd,
	     const struct src_opts *o, const struct src_ops *ops, void *ctx,
	     struct halite_logger *log)
{
	const struct halite_file_info *fi = halite_reader_info(rd);
	struct halite_io_opts io = { .sz = sizeof(io) };
	char msg[512];
	int ret;

	*s = (struct src){ .o = *o, .ops = ops, .ctx = ctx, .rd = rd, .path = path, .fd = fd,
			   .lb_size = fi->lb_size, .mb_size = fi->mb_size,
			   .lb_total = fi->lb_count, .log = log };
	if (!s->o.ra_readers)
		s->o.ra_readers = 1;
	s->span = 1;
	if (halite_io_url(halite_reader_io(rd))) {
		s->span = HALITE_MAX(1u, HALITE_MIN(SRC_SPAN_MAX, SRC_OBJECT_SPAN / s->lb_size));
		s->o.queue_depth = HALITE_MAX(s->o.queue_depth, SRC_OBJECT_QUEUED / s->lb_size);
	}
	pthread_mutex_init(&s->lk, NULL);
	pthread_cond_init(&s->q_cond, NULL);
	pthread_cond_init(&s->pf_cond, NULL);
	/* O(1) whatever the file's size (zalloc.h). */
	s->st = halite_zalloc(s->lb_total ? s->lb_total : 1);
	s->thr = calloc(s->o.readers ? s->o.readers : 1, sizeof(*s->thr));
	if (s->o.readahead && s->lb_total)
		s->ra_next = halite_zalloc(s->lb_total * sizeof(*s->ra_next));
	if (!s->st || !s->thr || (s->o.readahead && s->lb_total && !s->ra_next)) {
		src_error(s, -ENOMEM, "the source's LB states");
		return -ENOMEM;
	}
	if (!s->o.prefetch)
		return 0;
	io.backend = s->o.io_backend;
	io.queue_depth = s->o.queue_depth;
	io.flags = s->o.io_flags;
	io.read_latency_us = s->o.read_latency_us;
	/* The reader's file again, or for an object the same version (reader_io.h). */
	ret = halite_io_reopen(&s->io, halite_reader_io(rd), path, O_RDONLY | O_CLOEXEC, &io);
	if (ret) {
		snprintf(msg, sizeof(msg), "%s: opening for prefetch reads (%s%s)", path,
			 s->o.io_backend ? halite_io_backend_name(s->o.io_backend) :
			 "default backend", io.flags ? ", O_DIRECT" : "");
		src_error(s, ret, msg);
		return ret;
	}
	return 0;
}

/* Library threads take no signals meant for the application. */
int src_start(struct src *s)
{
	int ret = 0;

	for (; s->nthr < s->o.readers && !ret; s->nthr++) {
		ret = halite_thread_start(&s->thr[s->nthr], reader_main, s);
		if (ret)
			break;
	}
	if (!ret && s->io) {
		ret = halite_thread_start(&s->pf_thr, src_prefetch_main, s);
		s->pf_started = !ret;
	}
	return ret;
}

void src_stop(struct src *s)
{
	if (!s->ops)
		return; /* never initialised: no thread, and its lock is not yet one */
	atomic_store(&s->stopping, true);
	pthread_mutex_lock(&s->lk);
	pthread_cond_broadcast(&s->q_cond);
	pthread_cond_broadcast(&s->pf_cond);
	pthread_mutex_unlock(&s->lk);
}

void src_join(struct src *s)
{
	src_stop(s);
	if (s->pf_started)
		pthread_join(s->pf_thr, NULL);
	s->pf_started = false;
	for (unsigned i = 0; i < s->nthr; i++)
		pthread_join(s->thr[i], NULL);
	s->nthr = 0;
}

void src_destroy(struct src *s)
{
	if (!s->ops)
		return; /* never initialised */
	halite_io_close(s->io);
	halite_zfree((void *)s->st);
	halite_zfree(s->ra_next);
	free(s->q);
	free(s->thr);
	pthread_mutex_destroy(&s->lk);
	pthread_cond_destroy(&s->q_cond);
	pthread_cond_destroy(&s->pf_cond);
	s->ops = NULL;
}
