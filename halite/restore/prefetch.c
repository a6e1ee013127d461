/* SPDX-License-Identifier: MIT */
/*
 * The prefetcher: every LB nobody has read, in file order, queue_depth reads
 * in flight, held back while faults come; a relayouted file's hot prefix
 * first and unthrottled.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "endian_util.h"
#include "relayout_meta.h"
#include "restore_int.h"

/* The prefetcher naps this long when held back with nothing in flight (save.c's bg nap). */
#define PREFETCH_NAP_NS 200000L
/* ... and while learning (learn.c), when it cannot run at all until the window ends. */
#define LEARN_NAP_NS 10000000L
/*
 * Prefetched LBs waiting for the pool, at most this many per read in flight:
 * bounds the memory held when reads outrun decoding.
 */
#define PREFETCH_BACKLOG_PER_QD 4u
/*
 * The hot prefix read first (opts.hot_prefix_max = 0): 256 MiB at 1 GB/s is
 * a quarter of a second of reads running beside the guest's faults. The
 * QEMU HTTP guest, whose verifier re-reads 256 MiB in a loop, touched 149
 * MB of its 186 MB file in a 15 s learning window; a bound well under that
 * would cut what its client's requests touch late in the window.
 */
#define HOT_PREFIX_DEFAULT (256ull << 20)

struct pf_slot {
	uint64_t lb;
	uint8_t *buf;
	unsigned reads;
};

/*
 * Hold back? While faults come (one within prefetch_idle_us), unless behind
 * prefetch_min_rate since the prefetcher started; and while the pool has
 * enough prefetched LBs waiting.
 */
static bool pf_hold(struct halite_restore *r, uint64_t start, uint64_t issued, bool hot)
{
	/* Learning: nothing comes in unasked (learn.c). */
	if (atomic_load(&r->learning))
		return true;
	if (atomic_load(&r->lbs_cached) >= (uint64_t)PREFETCH_BACKLOG_PER_QD * r->o.queue_depth)
		return true;
	/* The hot prefix: the guest's faults want these next. */
	if (hot)
		return false;
	return !src_prefetch_may(halite_now_ns(), atomic_load(&r->last_fault_ns),
				 r->o.prefetch_idle_us, start, r->o.prefetch_min_rate, issued);
}

/* The next LB in file order nobody has read, now READING; UINT64_MAX at the end. */
static uint64_t pf_next(struct halite_restore *r, uint64_t *cursor)
{
	while (*cursor < r->lb_total) {
		struct rlb *b = &r->lbs[(*cursor)++];
		bool mine = false;

		if (atomic_load(&b->state) != LB_IDLE)
			continue;
		pthread_mutex_lock(&r->lk);
		if (atomic_load(&b->state) == LB_IDLE) {
			atomic_store(&b->state, LB_READING);
			mine = true;
		}
		pthread_mutex_unlock(&r->lk);
		if (mine)
			return (uint64_t)(b - r->lbs);
	}
	return UINT64_MAX;
}

static int pf_submit(struct halite_restore *r, struct pf_slot *s, unsigned tag)
{
	struct halite_lb_info li;
	const uint64_t *mbs;
	uint32_t n;
	int ret;

	/* Its index entries first (a 1.1 file's chunks load here, off the fault path). */
	ret = halite_reader_lb_members(r->rd, s->lb, &mbs, &n);
	if (!ret)
		ret = halite_reader_lb_info(r->rd, s->lb, &li);
	if (ret)
		return rs_fail(r, ret, "locality block %llu: %s", ULL(s->lb),
			       halite_reader_errmsg(r->rd));
	ret = halite_io_submit_read(r->pf_io, s->buf, r->lb_size, li.offset, tag);
	if (ret)
		return rs_fail(r, ret, "locality block %llu at offset %llu: submitting a read",
			     ULL(s->lb), ULL(li.offset));
	return 0;
}

/* A read came back: land it, read it again, or fail. True when the slot is free again. */
static bool pf_complete(struct halite_restore *r, struct pf_slot *s, unsigned tag, int64_t res,
			uint8_t *tmp)
{
	int ret;

	if (res == (int64_t)r->lb_size) {
		atomic_fetch_add(&r->n_bytes_read, r->lb_size);
		ret = halite_reader_verify_lb(r->rd, s->lb, s->buf);
	} else {
		ret = res < 0 ? (int)res : -HALITE_E_TRUNCATED;
	}
	if (!ret) {
		/* Counted before it lands, so a caller that sees the restore done sees it. */
		if (s->lb < r->hot_lbs)
			atomic_fetch_add(&r->n_lb_hot, 1);
		rs_lb_landed(r, s->lb, s->buf, HOW_PREFETCH, tmp);
		s->buf = NULL;
		return true;
	}
	if (s->reads <= r->o.read_retries && !atomic_load(&r->failed)) {
		rs_lb_retrying(r, s->lb, ret, s->reads);
		s->reads++;
		ret = pf_submit(r, s, tag);
		if (!ret)
			return false;
	}
	halite_reader_free_lb(s->buf);
	s->buf = NULL;
	rs_lb_failed(r, s->lb, ret, s->reads);
	return true;
}

void *rs_prefetch_main(void *arg)
{
	struct halite_restore *r = arg;
	unsigned qd = r->o.queue_depth, nfree = qd;
	struct pf_slot *slots = calloc(qd, sizeof(*slots));
	unsigned *freel = calloc(qd, sizeof(*freel));
	struct halite_io_done *done = calloc(qd, sizeof(*done));
	uint8_t *tmp = halite_io_alloc(r->mb_size);
	uint64_t cursor = 0, issued = 0, start = halite_now_ns();

	pthread_setname_np(pthread_self(), "halite-prefetch");
	if (!slots || !freel || !done || !tmp) {
		rs_set_failed(r, rs_fail(r, -ENOMEM, "prefetcher buffers"));
		goto out;
	}
	for (unsigned i = 0; i < qd; i++)
		freel[i] = qd - 1 - i;
	while (!atomic_load(&r->stopping) && !atomic_load(&r->failed)) {
		unsigned inflight = halite_io_inflight(r->pf_io);
		bool more, hot, hold;
		struct pf_slot *s;
		uint64_t lb;
		unsigned tag;
		int n;

		/*
		 * Past what faults read already first: whether the next read
		 * is a hot one (unthrottled) is the next LB's to say, not the
		 * one a fault took.
		 */
		while (cursor < r->lb_total && atomic_load(&r->lbs[cursor].state) != LB_IDLE)
			cursor++;
		more = cursor < r->lb_total;
		hot = cursor < r->hot_lbs;
		hold = !more || !nfree || pf_hold(r, start, issued, hot);

		if (!more && !inflight)
			break;
		if (inflight) {
			/*
			 * Collect what has landed (its waiters are waiting);
			 * block for it only when there is nothing to submit.
			 */
			n = halite_io_reap(r->pf_io, done, qd, hold ? 1 : 0);
			if (n < 0) {
				rs_set_failed(r, rs_fail(r, n, "prefetch reads"));
				break;
			}
			for (int i = 0; i < n; i++) {
				tag = (unsigned)done[i].tag;
				if (pf_complete(r, &slots[tag], tag, done[i].res, tmp))
					freel[nfree++] = tag;
			}
			if (hold)
				continue;
		} else if (hold) {
			struct timespec ts = { 0, atomic_load(&r->learning) ? LEARN_NAP_NS :
						  PREFETCH_NAP_NS };

			nanosleep(&ts, NULL);
			continue;
		}
		lb = pf_next(r, &cursor);
		if (lb == UINT64_MAX)
			continue;
		tag = freel[--nfree];
		s = &slots[tag];
		*s = (struct pf_slot){ lb, halite_reader_alloc_lb(r->rd), 1 };
		if (!s->buf) {
			rs_set_failed(r, rs_fail(r, -ENOMEM, "locality block %llu: read buffer", ULL(lb)));
			break;
		}
		n = pf_submit(r, s, tag);
		if (n) {
			halite_reader_free_lb(s->buf);
			s->buf = NULL;
			rs_set_failed(r, n);
			break;
		}
		/* The minimum rate is owed from the end of the hot prefix on. */
		if (hot)
			start = halite_now_ns();
		else
			issued += r->lb_size;
	}
	/* Stopped (failed, or freed): the kernel may still write into the buffers. */
	while (halite_io_inflight(r->pf_io))
		if (halite_io_reap(r->pf_io, done, qd, 1) < 0)
			break;
out:
	/* A buffer a read may still target is left to leak, never freed under it. */
	for (unsigned i = 0; slots && i < qd && !halite_io_inflight(r->pf_io); i++)
		halite_reader_free_lb(slots[i].buf);
	free(slots);
	free(freel);
	free(done);
	halite_io_free(tmp);
	return NULL;
}

/*
 * A relayouted file's hot prefix, from its metadata (halite-inspect
 * relayout: "traces=N hot-lbs=K hot-blocks=M source-uuid=HEX", read by
 * hlt_relayout_read(), relayout_meta.h). A value we cannot
 * read is ignored with a warning rather than refused: it only orders the
 * reads, and every LB is verified whatever the order.
 */
void rs_hot_init(struct halite_restore *r)
{
	uint64_t max = r->o.hot_prefix_max ? r->o.hot_prefix_max : HOT_PREFIX_DEFAULT;
	struct hlt_relayout rel;

	if (r->o.flags & (HALITE_RESTORE_NO_HOT | HALITE_RESTORE_NO_PREFETCH))
		return;
	if (hlt_relayout_read(r->rd, &rel)) {
		halite_logf(&r->log, HALITE_LOG_WARN,
			    "%s: metadata %s is not 'hot-lbs=K' with K at most %llu (the file's "
			    "locality blocks): no hot prefix read first", r->path, HLT_RELAYOUT_META,
			    ULL(r->lb_total));
		return;
	}
	r->hot_lbs = HALITE_MIN(rel.hot_lbs, max / r->lb_size);
	if (r->hot_lbs)
		halite_logf(&r->log, HALITE_LOG_DEBUG, "%s: hot prefix: LBs 0..%llu read first",
			    r->path, ULL(r->hot_lbs - 1));
}
