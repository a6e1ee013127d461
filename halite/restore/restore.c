/* SPDX-License-Identifier: MIT */
/*
 * Userfaultfd lazy restore engine (include/halite/restore.h): its lifecycle,
 * open, start (copies filled first), wait, free.
 *
 * A single restore is a session (guest_session.h) with the copy install
 * strategy over a snapshot source. Open reads the file's index and
 * allocates one state byte per memory block (MB) and one record per
 * locality block (LB), nothing more: open-to-ready costs the same for 1 GiB
 * as for 1 TiB. Start registers the regions and starts the session's
 * fault thread (serving with fault.c), the install pool (install.c) and the
 * snapshot source's demand readers and prefetcher (source.h; what the
 * restore asks of it is prefetch.c). Each MB is
 * claimed NONE -> CLAIMED -> INSTALLED exactly once (or through STAGED), so
 * one thread installs and counts it; an LB is read once, IDLE -> READING ->
 * CACHED -> DONE, its waiting faults served first and its other blocks by
 * the pool. A failed LB read fails the restore, and nothing unverified is
 * ever shown to the guest. hugetlbfs regions install by huge page (huge.c);
 * learning (learn.c) records first touches.
 *
 * The design (states, locks, threads, wake rules, failure, take-over,
 * copies, hugetlbfs) is told in full in docs/architecture.md. Locks:
 * r->src.lk (the source's: LB states, waiters, the demand queue) and
 * r->gs.mu (the session's: state, error) are never held together.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <halite/restore.h>

#include "export.h"
#include "io.h"
#include "opts.h"
#include "restore_int.h"
#include "zalloc.h"

#define QUEUE_DEPTH_DEFAULT 8u
#define DEMAND_READERS_DEFAULT 16u
#define READ_RETRIES_DEFAULT 2u
#define IDLE_US_DEFAULT 2000u
#define MIN_RATE_DEFAULT (64ull << 20)
#define THREADS_MAX 256u
#ifndef HALITE_IO_QD_MAX
#define HALITE_IO_QD_MAX 4096u
#endif
/* Stream readahead: LBs after a demand-read one (0 = this). */
#define READAHEAD_DEFAULT 8u
#define READAHEAD_MAX 64u

/*
 * Which address space a region is in: the owner's, or (a copy, when the
 * owner is another process) this one's. Regions overlap only within one.
 */
static int region_space(const struct halite_restore *r, const struct rregion *g)
{
	return r->external && g->kind == HALITE_MEM_COPY;
}

struct host_order {
	const struct halite_restore *r;
	const struct rregion *rg;
};

static int cmp_host(const void *a, const void *b, void *ctx)
{
	const struct host_order *h = ctx;
	const struct rregion *x = &h->rg[*(const uint32_t *)a], *y = &h->rg[*(const uint32_t *)b];
	int sx = region_space(h->r, x), sy = region_space(h->r, y);

	if (sx != sy)
		return sx - sy;
	return x->host < y->host ? -1 : x->host > y->host;
}

static int match_regions(struct halite_restore *r, const struct halite_restore_region *regions,
			 uint32_t nregions)
{
	if (nregions != r->fi->region_count)
		return rs_fail(r, -EINVAL, "%u regions given, the file has %u", nregions,
			     r->fi->region_count);
	for (uint32_t i = 0; i < nregions; i++) {
		const struct halite_restore_region *in = &regions[i];
		const struct halite_region_info *ri;
		struct rregion *g;
		int idx = in->name ? halite_reader_find_region(r->rd, in->name) : -EINVAL, ret;

		if (idx < 0)
			return rs_fail(r, idx == -EINVAL ? -EINVAL : -HALITE_E_NOT_FOUND,
				     "region %u '%s': not in the file", i, in->name ? in->name : "");
		ri = halite_reader_region(r->rd, (uint32_t)idx);
		g = &r->regions[idx];
		if (g->name)
			return rs_fail(r, -EINVAL, "region '%s' given twice", in->name);
		g->name = strdup(in->name);
		if (!g->name)
			return -ENOMEM;
		g->host = in->host;
		g->length = in->length;
		g->kind = in->kind;
		g->first_mb = ri->first_mb;
		g->nmb = ri->mb_count;
		if (in->length != ri->length)
			return rs_fail(r, -EINVAL, "region '%s': %llu bytes, the file has %llu",
				     in->name, ULL(in->length), ULL(ri->length));
		if (in->host % r->page || !in->host || in->host + in->length < in->host)
			return rs_fail(r, -EINVAL, "region '%s': host address 0x%llx not page aligned",
				     in->name, ULL(in->host));
		if (in->kind != HALITE_MEM_ANON && in->kind != HALITE_MEM_SHARED &&
		    in->kind != HALITE_MEM_COPY)
			return rs_fail(r, -EINVAL, "region '%s': unknown memory kind %d", in->name,
				     in->kind);
		r->has_copy |= in->kind == HALITE_MEM_COPY;
		if (in->kind == HALITE_MEM_SHARED) {
			struct stat st;

			r->has_shared = true;
			if (fstat(in->fd, &st) || !S_ISREG(st.st_mode) ||
			    (uint64_t)st.st_size < in->fd_offset + in->length)
				return rs_fail(r, -EINVAL, "region '%s': fd %d is not the file of shared "
					     "memory holding %llu bytes at offset %llu", in->name,
					     in->fd, ULL(in->length), ULL(in->fd_offset));
			g->fd = fcntl(in->fd, F_DUPFD_CLOEXEC, 0);
			if (g->fd < 0)
				return rs_fail(r, -errno, "region '%s': fd %d", in->name, in->fd);
			g->fd_off = in->fd_offset;
			/* On hugetlbfs: installed by huge page (huge.c). */
			ret = rs_huge_region(r, g);
			if (ret)
				return ret;
		}
	}
	for (uint32_t i = 0; i < nregions; i++)
		r->by_host[i] = i;
	qsort_r(r->by_host, nregions, sizeof(r->by_host[0]), cmp_host,
		&(struct host_order){ r, r->regions });
	for (uint32_t i = 1; i < nregions; i++) {
		const struct rregion *a = &r->regions[r->by_host[i - 1]];
		const struct rregion *b = &r->regions[r->by_host[i]];

		if (region_space(r, a) == region_space(r, b) && a->host + a->length > b->host)
			return rs_fail(r, -EINVAL, "regions '%s' and '%s' overlap", a->name, b->name);
	}
	return 0;
}

HALITE_EXPORT int halite_restore_open(struct halite_restore **rp, const char *path,
				      const struct halite_restore_region *regions,
				      uint32_t nregions, const struct halite_restore_opts *opts)
{
	HALITE_OPTS(halite_reader_opts, ro);
	struct halite_restore *r;
	char rerr[256] = "";
	bool want_trace;
	int ret;

	if (!rp || !path || !regions || !nregions)
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	gs_init(&r->gs, &rs_copy_ops, &r->log);
	r->fd = -1;
	pthread_mutex_init(&r->learn_lk, NULL);
	ret = halite_opts_copy(&r->o, sizeof(r->o), opts);
	if (ret || (r->o.flags & ~HALITE_RESTORE_FLAGS_ALL) || (r->o.nvcpus && !r->o.vcpu_tids) ||
	    r->o.io_backend < HALITE_IO_DEFAULT || r->o.io_backend > HALITE_IO_PSYNC ||
	    r->o.queue_depth > HALITE_IO_QD_MAX || r->o.workers > THREADS_MAX ||
	    r->o.demand_readers > THREADS_MAX || r->o.readahead > READAHEAD_MAX ||
	    (r->o.owner_pid && r->o.owner_uffd < 0) ||
	    /* Learning writes a trace; a take-over comes after the first touches. */
	    ((r->o.flags & HALITE_RESTORE_LEARN) &&
	     (!r->o.trace_path || (r->o.flags & HALITE_RESTORE_ATTACH))) ||
	    (r->o.learn_window_ms && !(r->o.flags & HALITE_RESTORE_LEARN))) {
		/* Nothing the caller owns was copied yet. */
		r->o.vcpu_tids = NULL;
		r->o.trace_path = NULL;
		ret = -EINVAL;
		goto err;
	}
	r->log = (struct halite_logger){ r->o.log, r->o.log_ctx, r->o.log_level };
	if (!r->o.queue_depth)
		r->o.queue_depth = QUEUE_DEPTH_DEFAULT;
	if (!r->o.demand_readers)
		r->o.demand_readers = DEMAND_READERS_DEFAULT;
	if (!r->o.readahead)
		r->o.readahead = READAHEAD_DEFAULT;
	if (r->o.flags & HALITE_RESTORE_NO_READAHEAD)
		r->o.readahead = 0;
	if (!r->o.read_retries)
		r->o.read_retries = READ_RETRIES_DEFAULT;
	if (!r->o.prefetch_idle_us)
		r->o.prefetch_idle_us = IDLE_US_DEFAULT;
	if (!r->o.prefetch_min_rate)
		r->o.prefetch_min_rate = MIN_RATE_DEFAULT;
	r->external = r->o.owner_pid != 0;
	r->track = r->o.flags & HALITE_RESTORE_TRACK_ACCESS;
	r->learn = r->o.flags & HALITE_RESTORE_LEARN;
	want_trace = r->o.trace_path != NULL;
	if (want_trace)
		r->o.trace_path = strdup(r->o.trace_path);
	r->path = strdup(path);
	if ((want_trace && !r->o.trace_path) || !r->path) {
		ret = -ENOMEM;
		goto err;
	}

	ro.flags = (r->o.flags & HALITE_RESTORE_DIRECT) ? HALITE_READER_DIRECT : 0;
	ro.read_latency_us = r->o.read_latency_us;
	ro.errbuf = rerr;
	ro.errbuf_len = sizeof(rerr);
	ro.same_as = r->o.same_as;
	r->o.same_as = NULL; /* the caller's, for this call only */
	/* No log: LB read failures are reported (and retried) here, once each. */
	ret = halite_reader_open(&r->rd, path, &ro);
	if (ret) {
		/* The reader's message names the reason already. */
		if (rerr[0])
			rs_errmsg(r, rerr);
		else
			rs_fail(r, ret, "%s", path);
		goto err;
	}
	r->fi = halite_reader_info(r->rd);
	r->mb_size = r->fi->mb_size;
	r->lb_size = r->fi->lb_size;
	r->mb_total = r->fi->mb_count;
	r->lb_total = r->fi->lb_count;
	r->mb_zero = r->fi->mb_zero + r->fi->mb_untouched;
	r->page = (uint64_t)sysconf(_SC_PAGESIZE);
	if (r->fi->page_size % r->page) {
		ret = rs_fail(r, -HALITE_E_UNSUPPORTED, "%s: pages of %u bytes, the host's are %llu",
			    path, r->fi->page_size, ULL(r->page));
		goto err;
	}
	r->regions = calloc(r->fi->region_count, sizeof(*r->regions));
	r->by_host = calloc(r->fi->region_count, sizeof(*r->by_host));
	if (!r->regions || !r->by_host) {
		ret = -ENOMEM;
		goto err;
	}
	r->nregions = r->fi->region_count;
	for (uint32_t i = 0; i < r->nregions; i++)
		r->regions[i].fd = -1;
	/* The session's regions and its copy of the vCPU thread ids. */
	ret = gs_setup(&r->gs, r->nregions, r->o.vcpu_tids, r->o.nvcpus);
	r->o.vcpu_tids = NULL;
	if (ret)
		goto err;
	ret = match_regions(r, regions, nregions);
	if (!ret)
		ret = r->huge ? r->huge->init(r) : 0;
	if (ret)
		goto err;
	rs_session_regions(r);
	/* O(1) whatever the memory size (zalloc.h); pages appear as used. */
	r->mb = halite_zalloc(r->mb_total);
	r->lbs = halite_zalloc(r->lb_total * sizeof(*r->lbs));
	r->fault_tmp = halite_io_alloc(r->mb_size);
	if (!r->mb || !r->lbs || !r->fault_tmp) {
		ret = -ENOMEM;
		goto err;
	}
	ret = rs_learn_init(r);
	if (ret)
		goto err;
	/*
	 * An object of an S3 store has no descriptor: its reads are pinned to
	 * one version by ETag instead of a lock (io_s3.c), and the source
	 * skips the page-cache paths.
	 */
	r->fd = halite_io_is_s3_path(path) ? -1 : open(path, O_RDONLY | O_CLOEXEC);
	if (r->fd < 0 && !halite_io_is_s3_path(path)) {
		ret = rs_fail(r, -errno, "%s: cannot open", path);
		goto err;
	}
	/*
	 * HALITE_LOCK_PROTOCOL (format.h): while this restore reads the file, a
	 * save refuses to replace it. Advisory: a failure only loses that check.
	 */
	if (r->fd >= 0 && flock(r->fd, LOCK_SH | LOCK_NB) && errno != EWOULDBLOCK)
		halite_logf(&r->log, HALITE_LOG_DEBUG, "%s: flock: %s", path, strerror(errno));
	ret = rs_source_init(r);
	if (ret)
		goto err;
	halite_logf(&r->log, HALITE_LOG_DEBUG,
		    "%s: %llu memory blocks (%llu stored) in %llu locality blocks, %u regions",
		    path, ULL(r->mb_total), ULL(r->fi->mb_stored), ULL(r->lb_total), r->nregions);
	*rp = r;
	return 0;
err:
	halite_restore_free(r);
	return ret;
}

HALITE_EXPORT int halite_restore_device_state(struct halite_restore *r, const void **data,
					      uint64_t *len)
{
	return halite_reader_device_state(r->rd, data, len);
}

HALITE_EXPORT struct halite_reader *halite_restore_reader(struct halite_restore *r)
{
	return r->rd;
}

/* The copies' blocks of verified LB @lb, decoded straight into the caller's memory. */
static int decode_copies(struct halite_restore *r, uint64_t lb, const uint8_t *buf)
{
	const uint64_t *mbs;
	uint32_t n;

	halite_reader_lb_members(r->rd, lb, &mbs, &n);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t off;
		const struct rregion *g = &r->regions[rs_mb_region(r, mbs[i], &off)];
		int ret;

		if (g->kind != HALITE_MEM_COPY || !rs_claim(r, mbs[i], MB_NONE))
			continue;
		ret = halite_reader_decode_mb(r->rd, mbs[i], buf, (void *)(uintptr_t)(g->host + off));
		if (ret)
			return rs_fail(r, ret, "memory block %llu does not decode", ULL(mbs[i]));
		rs_installed(r, mbs[i], BY_PREFETCH);
	}
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * The LBs holding a stored block of a copy, each claimed (READING, ours),
 * into *@lbsp (malloc'd), in file order. How many, or the failure (the
 * restore has failed).
 */
static int64_t copies_claim(struct halite_restore *r, uint64_t **lbsp)
{
	uint64_t *lbs = NULL, n = 0, cap = 0;

	for (uint32_t i = 0; i < r->nregions; i++) {
		const struct rregion *g = &r->regions[i];

		for (uint64_t mb = g->first_mb; g->kind == HALITE_MEM_COPY &&
						mb < g->first_mb + g->nmb; mb++) {
			struct halite_mb_loc loc;
			bool mine = false;
			int ret = halite_reader_mb_lookup(r->rd, mb, &loc);

			if (ret) {
				free(lbs);
				ret = rs_fail(r, ret, "%s", halite_reader_errmsg(r->rd));
				rs_set_failed(r, ret);
				return ret;
			}
			if (loc.state != HALITE_MB_STORED)
				continue;
			pthread_mutex_lock(&r->src.lk);
			if (atomic_load(&r->src.st[loc.lb]) == LB_IDLE) {
				atomic_store(&r->src.st[loc.lb], LB_READING);
				mine = true;
			}
			pthread_mutex_unlock(&r->src.lk);
			if (!mine)
				continue; /* an earlier block's */
			if (n == cap) {
				uint64_t *nl = realloc(lbs, (cap = cap ? 2 * cap : 64) * sizeof(*lbs));

				if (!nl) {
					free(lbs);
					ret = rs_fail(r, -ENOMEM, "the copies' LBs");
					rs_set_failed(r, ret);
					return ret;
				}
				lbs = nl;
			}
			lbs[n++] = loc.lb;
		}
	}
	qsort(lbs, n, sizeof(*lbs), cmp_u64);
	*lbsp = lbs;
	return (int64_t)n;
}

/* A copy's LB @lb in @buf (read alone first unless @verified): decoded into place, landed. */
static int copy_lb(struct halite_restore *r, uint64_t lb, uint8_t *buf, bool verified,
		   uint8_t *tmp)
{
	unsigned reads;
	int ret;

	if (!verified) {
		ret = src_read_lb_retrying(&r->src, lb, buf, &reads);
		if (ret) {
			halite_reader_free_lb(buf);
			src_lb_failed(&r->src, lb, ret, reads);
			return ret;
		}
	}
	ret = decode_copies(r, lb, buf);
	if (ret) {
		halite_reader_free_lb(buf);
		rs_set_failed(r, ret);
		return ret;
	}
	src_land(&r->src, lb, buf, SRC_PREFETCH, tmp);
	return 0;
}

/*
 * The copies, at start, before any thread reads an LB: each LB holding a
 * stored block of one is read and verified here, its copies' blocks
 * decoded into place, and it lands as prefetched, so the pool installs its
 * other blocks as for any prefetched LB. From an object, LBs that follow
 * each other in the file come in one request (src_read_run(), up to the
 * source's span): device RAM is saved in one go, so its LBs mostly do.
 * Zero and never-touched blocks need nothing: the caller's memory reads
 * zeros (rs_check_unpopulated()). 0, or the failure (the restore has
 * failed).
 */
static int fill_copies(struct halite_restore *r)
{
	uint8_t *tmp, *bufs[SRC_SPAN_MAX];
	uint64_t *lbs = NULL;
	int64_t n;
	int ret = 0;

	if (!r->has_copy)
		return 0;
	n = copies_claim(r, &lbs);
	if (n < 0)
		return (int)n;
	tmp = halite_io_alloc(r->mb_size);
	if (!tmp)
		ret = rs_fail(r, -ENOMEM, "decode buffer");
	for (int64_t i = 0, run; i < n && !ret; i += run) {
		uint64_t bad;

		for (run = 1; run < r->src.span && i + run < n && lbs[i + run] == lbs[i] + run;)
			run++;
		for (int64_t k = 0; k < run; k++) {
			bufs[k] = halite_reader_alloc_lb(r->rd);
			if (!bufs[k]) {
				while (k--)
					halite_reader_free_lb(bufs[k]);
				ret = rs_fail(r, -ENOMEM, "locality block %llu: read buffer",
					      ULL(lbs[i]));
				break;
			}
		}
		if (ret) {
			rs_set_failed(r, ret);
			break;
		}
		/* A run of one is read alone, as a file's are. */
		bad = run > 1 ? src_read_run(&r->src, lbs[i], (unsigned)run, bufs) : 1;
		for (int64_t k = 0; k < run; k++) {
			if (ret)
				halite_reader_free_lb(bufs[k]);
			else
				ret = copy_lb(r, lbs[i + k], bufs[k], !(bad & (1ull << k)), tmp);
		}
	}
	halite_io_free(tmp);
	free(lbs);
	return ret;
}

/* Stop and join every thread; the pool finishes its tasks first. */
static void stop_threads(struct halite_restore *r)
{
	src_join(&r->src);
	/*
	 * The fault thread before the pool: it submits install tasks too (an
	 * LB it read from the page cache), and a task submitted to a freed
	 * pool is a crash. Pool tasks need no fault thread: an install that
	 * finds an event pending reads it itself (gmem.h).
	 */
	gs_stop_thread(&r->gs);
	/* The tasks may submit finish; the pool runs those too before it goes. */
	halite_pool_free(r->pool);
	r->pool = NULL;
}

HALITE_EXPORT int halite_restore_start(struct halite_restore *r)
{
	bool attach, nothing;
	int ret;

	pthread_mutex_lock(&r->gs.mu);
	ret = r->gs.state != GS_CREATED || r->started ? -HALITE_E_STATE : 0;
	r->started = true;
	pthread_mutex_unlock(&r->gs.mu);
	if (ret)
		return ret;
	attach = r->o.flags & HALITE_RESTORE_ATTACH;
	ret = rs_open_uffd(r);
	for (uint32_t i = 0; i < r->nregions && !ret && !attach; i++)
		ret = rs_check_unpopulated(r, &r->regions[i]);
	if (!ret)
		ret = gs_register_all(&r->gs);
	if (!ret)
		ret = gs_make_gmem(&r->gs);
	if (!ret && attach)
		ret = rs_attach_scan(r);
	if (!ret)
		rs_refuse_discards(r);
	if (!ret) {
		ret = halite_pool_create(&r->pool, r->o.workers, "halite-rinst");
		if (ret)
			ret = rs_fail(r, ret, "install pool of %u threads", r->o.workers);
	}
	if (ret)
		goto fail;
	/*
	 * Ready: registered, threads about to start. Published before they
	 * start, since a small file can be done before this function returns.
	 */
	gs_running(&r->gs);
	pthread_mutex_lock(&r->gs.mu);
	r->ready_ns = r->gs.running_ns - r->gs.start_ns;
	pthread_mutex_unlock(&r->gs.mu);
	/* Before the copies land: their LBs' other blocks are staged too. */
	if (r->learn && r->o.learn_window_ms)
		r->learn_end_ns = r->gs.running_ns + (uint64_t)r->o.learn_window_ms * 1000000;
	atomic_store(&r->learning, r->learn);
	atomic_store(&r->src.last_fault_ns, r->gs.running_ns);
	/* Before the copies: their LBs' installs may finish the restore themselves. */
	nothing = atomic_load(&r->lb_done) == r->lb_total;
	ret = fill_copies(r);
	if (ret) {
		/* LBs that landed are being installed: that ends before the ranges go. */
		halite_pool_wait(r->pool);
		goto fail;
	}
	ret = gs_start_thread(&r->gs);
	if (!ret)
		ret = src_start(&r->src);
	if (ret) {
		/* Nothing can have faulted yet: the caller resumes the guest after this. */
		ret = rs_fail(r, ret, "starting threads");
		rs_set_failed(r, ret);
		stop_threads(r);
		goto fail;
	}
	halite_logf(&r->log, HALITE_LOG_INFO,
		    "restoring %s: %llu memory blocks, %llu locality blocks, ready in %.2f ms",
		    r->path, ULL(r->mb_total), ULL(r->lb_total), (double)r->ready_ns / 1e6);
	/*
	 * Taken over: the faults the dead handler had read are lost; woken,
	 * their threads fault again, to us, or find their page in.
	 */
	if (attach)
		gs_wake_all(&r->gs);
	/* Nothing to read: a file of zero and never-touched blocks, or all in already. */
	if (nothing && halite_pool_submit(r->pool, rs_finish_task, r))
		rs_finish(r);
	return 0;
fail:
	rs_allow_discards(r);
	/* Taken over: the registration is the owner's, and its threads wait on it. */
	if (!attach)
		gs_unregister_regions(&r->gs);
	pthread_mutex_lock(&r->gs.mu);
	r->gs.state = GS_FAILED;
	r->gs.error = ret;
	pthread_mutex_unlock(&r->gs.mu);
	return ret;
}

HALITE_EXPORT int halite_restore_wait(struct halite_restore *r, int timeout_ms)
{
	bool started;

	if (!r)
		return -EINVAL;
	pthread_mutex_lock(&r->gs.mu);
	started = r->started;
	pthread_mutex_unlock(&r->gs.mu);
	return started ? gs_wait(&r->gs, timeout_ms) : -HALITE_E_STATE;
}

HALITE_EXPORT void halite_restore_stats(struct halite_restore *r, struct halite_restore_stats *st)
{
	rs_fill_stats(r, st);
}

HALITE_EXPORT void halite_restore_free(struct halite_restore *r)
{
	bool failed;

	if (!r)
		return;
	if (r->started) {
		pthread_mutex_lock(&r->gs.mu);
		failed = r->gs.state == GS_RUNNING && !r->gs.ending;
		pthread_mutex_unlock(&r->gs.mu);
		if (failed) {
			/* The caller's decision, not a fault: no error in the log. */
			gs_errmsg_level(&r->gs, "restore cancelled: freed while running",
					HALITE_LOG_INFO);
			rs_set_failed(r, -ECANCELED);
		}
		stop_threads(r);
		failed = gs_state(&r->gs, NULL) != GS_DONE;
		/*
		 * Closing the userfaultfd wakes every blocked thread and drops
		 * the registration: unrestored memory would then read as zeros.
		 * PROT_NONE first turns that into SIGSEGV. Another process's
		 * memory stays registered with the owner's descriptor instead.
		 */
		if (failed && !r->external)
			gs_protect_none(&r->gs);
		rs_allow_discards(r);
	}
	halite_pool_free(r->pool);
	for (uint64_t lb = 0; r->lbs && lb < r->lb_total; lb++) {
		struct rlb *b = &r->lbs[lb];
		struct fault_waiter *w;

		while ((w = b->waiters)) {
			b->waiters = w->next;
			free(w);
		}
		halite_reader_free_lb(b->buf);
		free(b->stage);
	}
	src_destroy(&r->src);
	if (r->huge)
		r->huge->free(r);
	rs_learn_free(r);
	gs_destroy(&r->gs);
	if (r->fd >= 0)
		close(r->fd);
	halite_reader_free(r->rd);
	for (uint32_t i = 0; r->regions && i < r->nregions; i++) {
		free(r->regions[i].name);
		if (r->regions[i].fd >= 0)
			close(r->regions[i].fd);
	}
	free(r->regions);
	free(r->by_host);
	halite_zfree((void *)r->mb);
	halite_zfree(r->lbs);
	halite_io_free(r->fault_tmp);
	free((void *)r->o.trace_path);
	free(r->path);
	pthread_mutex_destroy(&r->learn_lk);
	free(r);
}

HALITE_EXPORT const char *halite_restore_errmsg(const struct halite_restore *r)
{
	return r->gs.errmsg;
}
