/* SPDX-License-Identifier: MIT */
/*
 * Reading LBs on demand: the demand queue and its reader threads, stream
 * readahead (ra_next), a fault's read straight from the page cache
 * (rs_read_cached), and an LB's read again after a failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/uio.h>

#include "endian_util.h"
#include "restore_int.h"
#include "zalloc.h"

/*
 * Before reading an LB again: drop its page-cache copy (clean pages only),
 * so the retry reaches the device rather than the same cached bytes.
 */
void rs_lb_retrying(struct halite_restore *r, uint64_t lb, int err, unsigned reads)
{
	struct halite_lb_info li = { 0 };
	char why[128], msg[sizeof(r->errmsg)];

	halite_reader_lb_info(r->rd, lb, &li);
	atomic_fetch_add(&r->n_lb_retries, 1);
	snprintf(why, sizeof(why), "%s; reading it again (%u of %u)", halite_strerror(err),
		 reads + 1, r->o.read_retries + 1);
	src_lb_errmsg(r->rd, lb, why, msg, sizeof(msg));
	halite_logf(&r->log, HALITE_LOG_WARN, "%s", msg);
	posix_fadvise(r->fd, (off_t)li.offset, r->lb_size, POSIX_FADV_DONTNEED);
}

/*
 * One LB into @buf, verified, read again up to read_retries times if it
 * fails (each time from the device: rs_lb_retrying()). 0, or the last
 * failure, with *@reads saying how many reads it took.
 */
int rs_read_lb_retrying(struct halite_restore *r, uint64_t lb, uint8_t *buf, unsigned *reads)
{
	int ret;

	for (*reads = 1;; (*reads)++) {
		ret = src_read_lb(r->rd, lb, buf, &r->n_bytes_read);
		if (!ret || *reads > r->o.read_retries || atomic_load(&r->failed))
			return ret;
		rs_lb_retrying(r, lb, ret, *reads);
	}
}

/*
 * Under lk. The caller signals q_cond after unlocking: a reader woken under
 * the lock would run, find lk held and sleep again, two context switches
 * on the fault's path (on 2 cores, measured by halite-bench fault).
 */
int rs_queue_push(struct halite_restore *r, uint64_t lb)
{
	if (r->q_len == r->q_cap) {
		size_t cap = r->q_cap ? 2 * r->q_cap : 64;
		uint64_t *q = malloc(cap * sizeof(*q));

		if (!q)
			return -ENOMEM;
		for (size_t i = 0; i < r->q_len; i++)
			q[i] = r->q[(r->q_head + i) % r->q_cap];
		free(r->q);
		r->q = q;
		r->q_cap = cap;
		r->q_head = 0;
	}
	r->q[(r->q_head + r->q_len++) % r->q_cap] = lb;
	return 0;
}

/*
 * Under lk, after a demand read of @lb: the next LBs of its stream, those
 * nobody has read, to be read ahead. They are claimed only when a reader
 * takes them (ra_take), so dropping the oldest of a full queue loses
 * nothing but the hint. Returns how many readers may start on them now: the
 * caller signals q_cond that often once it has unlocked.
 */
size_t rs_ra_push(struct halite_restore *r, uint64_t lb)
{
	/* Learning: nothing comes in unasked (learn.c). */
	if (atomic_load(&r->learning))
		return 0;
	for (unsigned i = 0; i < r->o.readahead && r->ra_next; i++) {
		lb = rs_ra_next(r, lb);
		if (lb == UINT64_MAX)
			break;
		if (atomic_load(&r->lbs[lb].state) != LB_IDLE)
			continue;
		if (r->raq_len == RA_QUEUE) {
			r->raq_head = (r->raq_head + 1) % RA_QUEUE;
			r->raq_len--;
		}
		r->raq[(r->raq_head + r->raq_len++) % RA_QUEUE] = lb;
	}
	return HALITE_MIN(r->raq_len, (size_t)(r->ra_readers - r->ra_busy));
}

/* A reader is through with its readahead read: another may take one. */
static void ra_done(struct halite_restore *r, bool ahead)
{
	bool more;

	if (!ahead)
		return;
	pthread_mutex_lock(&r->lk);
	r->ra_busy--;
	more = r->raq_len > 0;
	pthread_mutex_unlock(&r->lk);
	if (more)
		pthread_cond_signal(&r->q_cond);
}

/*
 * Under lk: an LB to read ahead, now READING, or UINT64_MAX. Readahead
 * takes at most ra_readers readers at a time, so the others stay free for
 * demand reads, which a queued fault is waiting for.
 */
static uint64_t ra_take(struct halite_restore *r)
{
	while (r->raq_len && r->ra_busy < r->ra_readers) {
		uint64_t lb = r->raq[r->raq_head];

		r->raq_head = (r->raq_head + 1) % RA_QUEUE;
		r->raq_len--;
		if (atomic_load(&r->lbs[lb].state) == LB_IDLE) {
			atomic_store(&r->lbs[lb].state, LB_READING);
			r->ra_busy++;
			return lb;
		}
	}
	return UINT64_MAX;
}

void *rs_reader_main(void *arg)
{
	struct halite_restore *r = arg;
	uint8_t *tmp = halite_io_alloc(r->mb_size);

	pthread_setname_np(pthread_self(), "halite-rread");
	for (;;) {
		uint64_t lb = UINT64_MAX;
		bool ahead = false;
		uint8_t *buf;
		unsigned reads;
		int ret;

		pthread_mutex_lock(&r->lk);
		/* Demand first: a fault waits for it. */
		while (!atomic_load(&r->stopping) && !r->q_len &&
		       (lb = ra_take(r)) == UINT64_MAX)
			pthread_cond_wait(&r->q_cond, &r->lk);
		if (atomic_load(&r->stopping)) {
			if (lb != UINT64_MAX)
				r->ra_busy--; /* left READING: nothing is read any more */
			pthread_mutex_unlock(&r->lk);
			break;
		}
		if (lb != UINT64_MAX) {
			ahead = true;
		} else {
			lb = r->q[r->q_head];
			r->q_head = (r->q_head + 1) % r->q_cap;
			r->q_len--;
		}
		pthread_mutex_unlock(&r->lk);
		if (atomic_load(&r->failed)) {
			ra_done(r, ahead);
			continue;
		}
		buf = tmp ? halite_reader_alloc_lb(r->rd) : NULL;
		if (!buf) {
			ra_done(r, ahead);
			rs_set_failed(r, rs_fail(r, -ENOMEM, "locality block %llu: read buffer", ULL(lb)));
			continue;
		}
		ret = rs_read_lb_retrying(r, lb, buf, &reads);
		ra_done(r, ahead);
		if (ret) {
			halite_reader_free_lb(buf);
			rs_lb_failed(r, lb, ret, reads);
			continue;
		}
		/* Read ahead, it is prefetched: its blocks are the pool's, nobody asked. */
		rs_lb_landed(r, lb, buf, ahead ? HOW_PREFETCH : HOW_DEMAND, tmp);
	}
	halite_io_free(tmp);
	return NULL;
}

/*
 * The fault thread reads @lb (READING, its waiters queued) itself when the
 * whole LB is in the page cache: preadv2(RWF_NOWAIT) copies it or fails at
 * once, never waiting for a device. That saves handing the fault to a
 * reader thread and back, the largest cost of a fault on cached data after
 * the copy itself (halite-bench fault). Verified like any read, then landed
 * as a demand read, with readahead queued as the readers' path does. False
 * when not all of it is cached or it does not verify: the readers then read
 * it as usual (retries included; this attempt is not counted). Only for
 * buffered reads with no added latency (inline_reads).
 */
bool rs_read_cached(struct halite_restore *r, uint64_t lb)
{
	struct halite_lb_info li;
	struct iovec iov;
	size_t wake;
	uint8_t *buf = halite_reader_alloc_lb(r->rd);
	ssize_t n;

	if (!buf)
		return false;
	halite_reader_lb_info(r->rd, lb, &li);
	iov = (struct iovec){ buf, r->lb_size };
	n = preadv2(r->fd, &iov, 1, (off_t)li.offset, RWF_NOWAIT);
	if (n != (ssize_t)r->lb_size || halite_reader_verify_lb(r->rd, lb, buf)) {
		halite_reader_free_lb(buf);
		return false;
	}
	atomic_fetch_add(&r->n_bytes_read, r->lb_size);
	pthread_mutex_lock(&r->lk);
	wake = rs_ra_push(r, lb);
	pthread_mutex_unlock(&r->lk);
	while (wake--)
		pthread_cond_signal(&r->q_cond);
	rs_lb_landed(r, lb, buf, HOW_DEMAND, r->fault_tmp);
	return true;
}

/*
 * ra_next: each LB's successor in its stream. The writer fills a stream's
 * LBs in order, so in file order each stream's LBs come by rising seq, and
 * a file has a few streams (one per vCPU, virtual, physical, other) that
 * interleave: the successor is a few LBs on. It is looked up when first
 * needed, scanning at most RA_SCAN entries (none found: no readahead, a
 * hint), and kept. Open only allocates (calloc: pages appear as used), so it
 * does not read the whole LB table (a 1.1 file's chunks come in on use).
 */
#define RA_SCAN 256u

int rs_ra_build(struct halite_restore *r)
{
	if (!r->o.readahead || !r->lb_total)
		return 0;
	r->ra_next = halite_zalloc(r->lb_total * sizeof(*r->ra_next));
	return r->ra_next ? 0 : -ENOMEM;
}

uint64_t rs_ra_next(struct halite_restore *r, uint64_t lb)
{
	struct halite_lb_info li, ln;
	uint64_t next = UINT64_MAX;

	if (r->ra_next[lb])
		return r->ra_next[lb] == UINT64_MAX ? UINT64_MAX : r->ra_next[lb] - 1;
	if (!halite_reader_lb_info(r->rd, lb, &li))
		for (uint64_t k = lb + 1; k < r->lb_total && k <= lb + RA_SCAN; k++)
			if (!halite_reader_lb_info(r->rd, k, &ln) && ln.stream == li.stream) {
				next = k;
				break;
			}
	r->ra_next[lb] = next == UINT64_MAX ? UINT64_MAX : next + 1;
	return next;
}
