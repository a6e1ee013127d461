/* SPDX-License-Identifier: MIT */
/*
 * What the restore asks of its snapshot source (source.h), which reads
 * every LB: a verified LB lands (install.c), a failed one fails the
 * restore; the prefetcher is held back while the pool has enough
 * prefetched LBs waiting and while learning; a relayouted file's hot
 * prefix is its first list, read unthrottled.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>

#include "endian_util.h"
#include "relayout_meta.h"
#include "restore_int.h"

/* The prefetcher naps this long while learning (learn.c): it cannot run until the window ends. */
#define LEARN_NAP_US 10000u
/* ... and this long when the pool's backlog holds it back (save.c's bg nap). */
#define BACKLOG_NAP_US 200u
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

static void src_landed(void *ctx, uint64_t lb, uint8_t *buf, int how, uint8_t *tmp)
{
	rs_lb_landed(ctx, lb, buf, how, tmp);
}

/* Every read of @lb failed: the restore fails; its waiters stay blocked. */
static void src_failed(void *ctx, uint64_t lb, int err, const char *msg)
{
	struct halite_restore *r = ctx;

	(void)lb;
	rs_errmsg(r, msg);
	rs_set_failed(r, err);
}

/*
 * Hold the prefetcher back while learning (nothing comes in unasked,
 * learn.c), and while the pool has enough prefetched LBs waiting.
 */
static uint32_t src_hold(void *ctx)
{
	struct halite_restore *r = ctx;

	if (atomic_load(&r->learning))
		return LEARN_NAP_US;
	/* The source's depth: an object's is deeper (source.c). */
	if (atomic_load(&r->lbs_cached) >= (uint64_t)PREFETCH_BACKLOG_PER_QD * r->src.o.queue_depth)
		return BACKLOG_NAP_US;
	return 0;
}

/* Learning: nothing is read ahead either. */
static bool src_ra_ok(void *ctx)
{
	struct halite_restore *r = ctx;

	return !atomic_load(&r->learning);
}

static void src_fatal(void *ctx, int err, const char *msg)
{
	struct halite_restore *r = ctx;

	rs_set_failed(r, rs_fail(r, err, "%s", msg));
}

static const struct src_ops restore_src_ops = {
	.landed = src_landed,
	.failed = src_failed,
	.hold = src_hold,
	.ra_ok = src_ra_ok,
	.error = src_fatal,
};

/*
 * A relayouted file's hot prefix, from its metadata (halite-inspect
 * relayout: "traces=N hot-lbs=K hot-blocks=M source-uuid=HEX", read by
 * hlt_relayout_read(), relayout_meta.h). A value we cannot
 * read is ignored with a warning rather than refused: it only orders the
 * reads, and every LB is verified whatever the order.
 */
static void hot_init(struct halite_restore *r)
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

int rs_source_init(struct halite_restore *r)
{
	struct src_opts so = {
		.readers = r->o.demand_readers,
		/* Readahead takes at most half the readers: the rest serve faults. */
		.ra_readers = r->o.demand_readers / 2 ? r->o.demand_readers / 2 : 1,
		.readahead = r->o.readahead,
		.read_retries = r->o.read_retries,
		.prefetch = !(r->o.flags & HALITE_RESTORE_NO_PREFETCH),
		.first_unthrottled = true,
		.inline_reads = !(r->o.flags & HALITE_RESTORE_DIRECT) && !r->o.read_latency_us,
		.queue_depth = r->o.queue_depth,
		.prefetch_idle_us = r->o.prefetch_idle_us,
		.prefetch_min_rate = r->o.prefetch_min_rate,
		.io_backend = r->o.io_backend,
		.io_flags = (r->o.flags & HALITE_RESTORE_DIRECT) ? HALITE_IO_DIRECT : 0,
		.read_latency_us = r->o.read_latency_us,
		.thread_name = "halite-rread",
	};
	int ret = src_init(&r->src, r->rd, r->path, r->fd, &so, &restore_src_ops, r, &r->log);

	if (ret)
		return ret;
	hot_init(r);
	r->src.nfirst = r->hot_lbs; /* LBs 0..hot_lbs-1 (src.first NULL) */
	return 0;
}
