/* SPDX-License-Identifier: MIT */
/*
 * A relayouted file's hot prefix, read before its restore can start
 * (restore.h: halite_restore_preload_start(), opts.preload).
 *
 * Why. A VMM takes tens of milliseconds to start (QEMU under TCG here:
 * 35-45 ms to its QMP socket), and only then do its memory and so the
 * restore exist. The hot prefix is what earlier guests touched first: on
 * slow storage (1 ms per read) the guest's first faults would wait for
 * those reads after resume. Read during the VMM's start instead, they cost
 * the guest nothing: the reads need a device and a little CPU for the
 * checksum, not the memory.
 *
 * One thread keeps up to qd reads in flight on its own halite_io handle,
 * LBs 0..n-1 in order, and keeps each LB that verifies (a failed read or
 * checksum is dropped: the restore reads that LB again, retrying and
 * reporting as for any other). The restore's start stops it (the reads in
 * flight are waited for, at most one read's latency) and lands what it
 * verified; nothing it kept is ever installed without that check.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <halite/restore.h>

#include "endian_util.h"
#include "export.h"
#include "io.h"
#include "log_internal.h"
#include "opts.h"
#include "restore_int.h"
#include "stats.h"

/* Reads in flight at least: a slow device's latency hides behind many. */
#define PRELOAD_QD_MIN 32u

struct halite_restore_preload {
	char *path;
	struct halite_reader *rd;
	struct halite_io *io;
	struct halite_logger log;
	uint64_t n;		/* LBs 0..n-1: the hot prefix, bounded */
	uint32_t lb_size;
	unsigned qd;
	uint8_t **bufs;		/* per LB: verified bytes, or NULL */
	uint64_t bytes_read;	/* written by the thread; read after the join */
	uint64_t next;		/* rs_preload_next()'s cursor */
	_Atomic bool stop;
	bool started, stopped;
	pthread_t thr;
	pthread_mutex_t lk;	/* @done, @kept, for halite_restore_preload_wait() */
	pthread_cond_t cond;
	bool done;
	uint64_t kept;		/* LBs verified and kept */
};

/* A read came back: keep the LB if all of it came and it verifies. */
static void pl_landed(struct halite_restore_preload *p, uint64_t lb, uint8_t *buf, int64_t res)
{
	int ret = res == (int64_t)p->lb_size ? 0 : res < 0 ? (int)res : -HALITE_E_TRUNCATED;

	if (res > 0)
		p->bytes_read += (uint64_t)res;
	if (!ret)
		ret = halite_reader_verify_lb(p->rd, lb, buf);
	if (ret) {
		/* The restore reads it again, and says what is wrong if it still is. */
		halite_logf(&p->log, HALITE_LOG_DEBUG, "%s: preload of locality block %llu: %s",
			    p->path, ULL(lb), halite_strerror(ret));
		halite_reader_free_lb(buf);
		return;
	}
	p->bufs[lb] = buf;
	pthread_mutex_lock(&p->lk);
	p->kept++;
	pthread_mutex_unlock(&p->lk);
}

static void pl_done(struct halite_restore_preload *p)
{
	pthread_mutex_lock(&p->lk);
	p->done = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lk);
}

static void *preload_main(void *arg)
{
	struct halite_restore_preload *p = arg;
	struct halite_io_done *done = calloc(p->qd, sizeof(*done));
	uint8_t **slot = calloc(p->qd, sizeof(*slot));
	uint64_t *slot_lb = calloc(p->qd, sizeof(*slot_lb));
	uint64_t cursor = 0;
	unsigned nfree = p->qd, *freel = calloc(p->qd, sizeof(*freel));

	pthread_setname_np(pthread_self(), "halite-preload");
	if (!done || !slot || !slot_lb || !freel)
		goto out; /* nothing read: the restore reads the prefix itself */
	for (unsigned i = 0; i < p->qd; i++)
		freel[i] = p->qd - 1 - i;
	for (;;) {
		bool more = cursor < p->n && !atomic_load(&p->stop);
		unsigned inflight = halite_io_inflight(p->io);
		int n;

		while (more && nfree) {
			unsigned tag = freel[nfree - 1];
			struct halite_lb_info li;
			uint8_t *buf;

			if (halite_reader_lb_info(p->rd, cursor, &li) ||
			    !(buf = halite_reader_alloc_lb(p->rd))) {
				more = false;
				break;
			}
			if (halite_io_submit_read(p->io, buf, p->lb_size, li.offset, tag)) {
				halite_reader_free_lb(buf);
				more = false;
				break;
			}
			nfree--;
			slot[tag] = buf;
			slot_lb[tag] = cursor++;
			inflight++;
			more = cursor < p->n && !atomic_load(&p->stop);
		}
		if (!inflight)
			break;
		n = halite_io_reap(p->io, done, p->qd, 1);
		if (n < 0)
			break; /* what is in flight is waited for by halite_io_close() */
		for (int i = 0; i < n; i++) {
			unsigned tag = (unsigned)done[i].tag;

			pl_landed(p, slot_lb[tag], slot[tag], done[i].res);
			slot[tag] = NULL;
			freel[nfree++] = tag;
		}
		if (!more && atomic_load(&p->stop) && !halite_io_inflight(p->io))
			break;
	}
out:
	/* A buffer a read may still target is left to leak, never freed under it. */
	for (unsigned i = 0; slot && i < p->qd && !halite_io_inflight(p->io); i++)
		halite_reader_free_lb(slot[i]);
	free(done);
	free(slot);
	free(slot_lb);
	free(freel);
	pl_done(p);
	return NULL;
}

HALITE_EXPORT int halite_restore_preload_start(struct halite_restore_preload **pp,
					      const char *path,
					      const struct halite_restore_opts *opts)
{
	HALITE_OPTS(halite_restore_opts, o);
	HALITE_OPTS(halite_reader_opts, ro);
	HALITE_OPTS(halite_io_opts, io);
	struct halite_restore_preload *p;
	int ret;

	if (!pp || !path || (opts && halite_opts_copy(&o, sizeof(o), opts)) ||
	    (o.flags & ~HALITE_RESTORE_FLAGS_ALL) || o.queue_depth > HALITE_IO_QD_MAX ||
	    o.io_backend < HALITE_IO_DEFAULT || o.io_backend > HALITE_IO_PSYNC)
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->log = (struct halite_logger){ o.log, o.log_ctx, o.log_level };
	pthread_mutex_init(&p->lk, NULL);
	halite_cond_init_mono(&p->cond);
	p->path = strdup(path);
	if (!p->path) {
		ret = -ENOMEM;
		goto err;
	}
	ro.flags = (o.flags & HALITE_RESTORE_DIRECT) ? HALITE_READER_DIRECT : 0;
	ro.read_latency_us = o.read_latency_us;
	ret = halite_reader_open(&p->rd, path, &ro);
	if (ret)
		goto err;
	p->lb_size = halite_reader_info(p->rd)->lb_size;
	if (!(o.flags & (HALITE_RESTORE_NO_HOT | HALITE_RESTORE_NO_PREFETCH)))
		p->n = rs_hot_lbs(p->rd, path, o.hot_prefix_max, &p->log);
	if (!p->n) {
		p->done = true; /* nothing to read ahead: a restore takes it as a no-op */
		*pp = p;
		return 0;
	}
	p->qd = HALITE_MIN(HALITE_MAX(o.queue_depth, PRELOAD_QD_MIN), p->n);
	p->bufs = calloc(p->n, sizeof(*p->bufs));
	if (!p->bufs) {
		ret = -ENOMEM;
		goto err;
	}
	io.backend = o.io_backend;
	io.queue_depth = p->qd;
	io.flags = (o.flags & HALITE_RESTORE_DIRECT) ? HALITE_IO_DIRECT : 0;
	io.read_latency_us = o.read_latency_us;
	ret = halite_io_open(&p->io, path, O_RDONLY | O_CLOEXEC, 0, &io);
	if (ret)
		goto err;
	ret = -pthread_create(&p->thr, NULL, preload_main, p);
	if (ret) {
		p->done = true;
		goto err;
	}
	p->started = true;
	halite_logf(&p->log, HALITE_LOG_DEBUG, "%s: preloading LBs 0..%llu, %u reads in flight",
		    path, ULL(p->n - 1), p->qd);
	*pp = p;
	return 0;
err:
	halite_restore_preload_free(p);
	return ret;
}

HALITE_EXPORT int halite_restore_preload_wait(struct halite_restore_preload *p, int timeout_ms)
{
	struct timespec ts;
	int ret = 0;

	if (!p)
		return -EINVAL;
	if (timeout_ms >= 0)
		halite_deadline(&ts, (uint64_t)timeout_ms * 1000000u);
	pthread_mutex_lock(&p->lk);
	while (!p->done && ret != ETIMEDOUT)
		ret = timeout_ms < 0 ? pthread_cond_wait(&p->cond, &p->lk) :
				       pthread_cond_timedwait(&p->cond, &p->lk, &ts);
	ret = p->done ? (int)HALITE_MIN(p->kept, (uint64_t)INT32_MAX) : -ETIMEDOUT;
	pthread_mutex_unlock(&p->lk);
	return ret;
}

bool rs_preload_matches(const struct halite_restore_preload *p,
			const struct halite_file_info *fi)
{
	const struct halite_file_info *pi = halite_reader_info(p->rd);

	return !memcmp(pi->uuid, fi->uuid, sizeof(fi->uuid)) && pi->lb_size == fi->lb_size &&
	       pi->lb_count == fi->lb_count;
}

uint64_t rs_preload_stop(struct halite_restore_preload *p)
{
	if (p->started && !p->stopped) {
		atomic_store(&p->stop, true);
		pthread_join(p->thr, NULL);
		p->stopped = true;
	}
	return p->bytes_read;
}

uint8_t *rs_preload_next(struct halite_restore_preload *p, uint64_t *lb)
{
	while (p->next < p->n) {
		uint8_t *buf = p->bufs[p->next];

		p->bufs[p->next++] = NULL;
		if (buf) {
			*lb = p->next - 1;
			return buf;
		}
	}
	return NULL;
}

HALITE_EXPORT void halite_restore_preload_free(struct halite_restore_preload *p)
{
	uint64_t lb;
	uint8_t *buf;

	if (!p)
		return;
	rs_preload_stop(p);
	/* The reads in flight are waited for before the buffers go. */
	halite_io_close(p->io);
	while (p->bufs && (buf = rs_preload_next(p, &lb)))
		halite_reader_free_lb(buf);
	free(p->bufs);
	halite_reader_free(p->rd);
	pthread_mutex_destroy(&p->lk);
	pthread_cond_destroy(&p->cond);
	free(p->path);
	free(p);
}
