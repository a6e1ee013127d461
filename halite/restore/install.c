/* SPDX-License-Identifier: MIT */
/*
 * Installing blocks: decoded from a verified LB into guest memory through
 * gmem (UFFDIO_COPY, or a copy region's memcpy), staged (TRACK_ACCESS,
 * learning) or written into a huge page (the huge strategy); the install
 * pool's task per LB; an LB landing, its waiting faults served first; an
 * LB's last reference going; and the restore's finish once every LB is in.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "restore_int.h"

/*
 * TRACK_ACCESS: the blocks of demand-read @lb to stage, all but @fault_mb's
 * and those of huge pages (never staged: the guest sees a huge page whole,
 * so its blocks' accesses cannot be told apart).
 */
static uint32_t lb_stageable(const struct halite_restore *r, uint64_t lb, uint64_t fault_mb)
{
	const uint64_t *mbs;
	uint32_t n, k = 0;

	halite_reader_lb_members(r->rd, lb, &mbs, &n);
	for (uint32_t i = 0; i < n; i++)
		k += mbs[i] != fault_mb && !rs_mb_huge(r, mbs[i]);
	return k;
}

/*
 * Fill memory block @mb with a copy of @src, or with zeros (@src NULL), and
 * wake its faults. Page by page where it must be (gmem.h): a page already
 * there is left as it is, a page the guest discarded is left to read zeros
 * (@flags HALITE_GMEM_ZERO_GONE fills it with them: a fault waits on it).
 * 0 or -errno.
 */
int rs_mb_fill(struct halite_restore *r, uint64_t mb, const uint8_t *src, unsigned flags)
{
	uint64_t off;
	uint32_t ri = rs_mb_region(r, mb, &off);
	const struct rregion *g = &r->regions[ri];

	/* fill_copies() does them all before anyone else could; kept exact anyway. */
	if (g->kind == HALITE_MEM_COPY) {
		uint8_t *dst = (uint8_t *)(uintptr_t)(g->host + off);

		if (src)
			memcpy(dst, src, halite_reader_mb_bytes(r->rd, mb));
		else
			memset(dst, 0, halite_reader_mb_bytes(r->rd, mb));
		return 0;
	}
	return halite_gmem_fill(r->gs.gm, ri, off, halite_reader_mb_bytes(r->rd, mb), src,
				src ? HALITE_GMEM_COPY : HALITE_GMEM_ZERO, flags);
}

static int mb_wake(struct halite_restore *r, uint64_t mb)
{
	uint64_t off;
	uint32_t ri = rs_mb_region(r, mb, &off);

	if (r->regions[ri].kind == HALITE_MEM_COPY)
		return 0; /* no thread waits on a copy */
	return halite_gmem_wake(r->gs.gm, ri, off, halite_reader_mb_bytes(r->rd, mb));
}

/* What a failed install says about itself. */
int rs_install_failed(struct halite_restore *r, int ret, uint64_t mb, const char *how)
{
	uint64_t off;
	uint32_t ri = rs_mb_region(r, mb, &off);

	if (ret == -ESRCH)
		return rs_fail(r, ret, "memory block %llu: %s (the process that owns the memory is "
			     "gone)", ULL(mb), how);
	if (ret == -ENOENT)
		return rs_fail(r, ret, "memory block %llu: %s: region '%s' at offset %llu is no "
			     "longer mapped, and no event said the guest unmapped it", ULL(mb), how,
			     r->regions[ri].name, ULL(off));
	return rs_fail(r, ret, "memory block %llu: %s", ULL(mb), how);
}

/*
 * Decode verified block @mb from @lb_buf into @tmp and install it (@flags:
 * rs_mb_fill()). 0 or -errno.
 */
int rs_install_from_lb(struct halite_restore *r, uint64_t mb, const uint8_t *lb_buf,
			   uint8_t *tmp, unsigned flags)
{
	int ret = halite_reader_decode_mb(r->rd, mb, lb_buf, tmp);

	if (ret)
		return rs_fail(r, ret, "memory block %llu does not decode", ULL(mb));
	ret = rs_mb_fill(r, mb, tmp, flags);
	return ret ? rs_install_failed(r, ret, mb, "UFFDIO_COPY") : 0;
}

/* Index of @mb among its LB's members (sorted by offset in the LB). */
static uint32_t member_index(const struct halite_restore *r, uint64_t lb, uint64_t mb)
{
	const uint64_t *mbs;
	struct halite_mb_loc want, loc;
	uint32_t n, lo = 0, hi;

	halite_reader_lb_members(r->rd, lb, &mbs, &n);
	halite_reader_mb_lookup(r->rd, mb, &want);
	hi = n;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		halite_reader_mb_lookup(r->rd, mbs[mid], &loc);
		if (loc.offset < want.offset)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Install a block claimed from STAGED, from its LB's stage (@flags: rs_mb_fill()). */
int rs_install_staged(struct halite_restore *r, uint64_t lb, uint64_t mb, unsigned flags)
{
	const uint8_t *src = r->lbs[lb].stage + (size_t)member_index(r, lb, mb) * r->mb_size;
	int ret = rs_mb_fill(r, mb, src, flags);

	return ret ? rs_install_failed(r, ret, mb, "UFFDIO_COPY from the stage") : 0;
}

/* Whose count a staged block of @lb goes to: learning stages prefetched LBs' too. */
int rs_staged_by(struct halite_restore *r, uint64_t lb)
{
	int how;

	pthread_mutex_lock(&r->src.lk);
	how = r->lbs[lb].how;
	pthread_mutex_unlock(&r->src.lk);
	return how == HOW_DEMAND ? BY_POOL : BY_PREFETCH;
}

void rs_finish_task(void *arg)
{
	rs_finish(arg);
}

/* Drop a reference to a cached LB; the last one frees its bytes. */
void rs_lb_release(struct halite_restore *r, uint64_t lb)
{
	struct rlb *b = &r->lbs[lb];
	uint8_t *buf = NULL;

	pthread_mutex_lock(&r->src.lk);
	if (--b->refs == 0) {
		buf = b->buf;
		b->buf = NULL;
		atomic_store(&r->src.st[lb], LB_DONE);
	}
	pthread_mutex_unlock(&r->src.lk);
	if (!buf)
		return;
	halite_reader_free_lb(buf);
	atomic_fetch_sub(&r->lbs_cached, 1);
	/* After a failure some blocks may be left: done then means nothing. */
	if (atomic_fetch_add(&r->lb_done, 1) + 1 == r->lb_total && !rs_failed(r)) {
		if (halite_pool_submit(r->pool, rs_finish_task, r))
			rs_finish(r);
	}
}

/*
 * The install task: every block of the LB no fault took is installed (or,
 * for a TRACK_ACCESS demand LB, and for any LB while learning, decoded into
 * the stage), then the task's reference goes.
 */
static void install_lb(struct itask *t)
{
	struct halite_restore *r = t->r;
	struct rlb *b = &r->lbs[t->lb];
	const uint64_t *mbs;
	uint8_t *tmp = NULL;
	uint32_t n;
	int by, ret = 0;
	bool stage;

	pthread_mutex_lock(&r->src.lk);
	by = b->how == HOW_DEMAND ? BY_POOL : BY_PREFETCH;
	stage = (r->track && b->how == HOW_DEMAND) || atomic_load(&r->learning);
	pthread_mutex_unlock(&r->src.lk);
	halite_reader_lb_members(r->rd, t->lb, &mbs, &n);
	if (stage) {
		/* Published to the fault thread by the STAGED stores below. */
		b->stage = malloc((size_t)n * r->mb_size);
		if (!b->stage)
			ret = rs_fail(r, -ENOMEM, "locality block %llu: stage", ULL(t->lb));
	} else {
		tmp = halite_io_alloc(r->mb_size);
		if (!tmp)
			ret = rs_fail(r, -ENOMEM, "locality block %llu: decode buffer", ULL(t->lb));
	}
	/*
	 * Not stopped by another LB's failure: every block of a verified,
	 * published LB goes in, so that after a failure each LB is either
	 * whole in memory or not at all (bar TRACK_ACCESS stages; a block of
	 * a huge page is in its page, which may wait for another LB).
	 */
	for (uint32_t i = 0; i < n && !ret; i++) {
		uint64_t mb = mbs[i];
		bool huge = rs_mb_huge(r, mb);

		if (stage && !huge) {
			uint8_t *slot = b->stage + (size_t)i * r->mb_size;
			uint8_t none = MB_NONE;

			/*
			 * Decoded before the CAS, so a STAGED block's bytes are
			 * complete when the fault thread sees it; a fault that
			 * took the block meanwhile only wastes the decode.
			 */
			if (atomic_load(&r->mb[mb]) != MB_NONE)
				continue;
			ret = halite_reader_decode_mb(r->rd, mb, t->buf, slot);
			if (ret)
				ret = rs_fail(r, ret, "memory block %llu does not decode", ULL(mb));
			else
				atomic_compare_exchange_strong(&r->mb[mb], &none, MB_STAGED);
			continue;
		}
		if (!rs_claim(r, mb, MB_NONE))
			continue;
		if (huge) {
			ret = r->huge->write(r, mb, t->buf, by);
			continue;
		}
		ret = rs_install_from_lb(r, mb, t->buf, tmp, 0);
		if (!ret)
			rs_installed(r, mb, by);
	}
	if (ret)
		rs_set_failed(r, ret);
	halite_io_free(tmp);
	rs_lb_release(r, t->lb);
}

static void install_task(void *arg)
{
	install_lb(arg);
	free(arg);
}

/*
 * A verified LB: publish it, install the blocks faults wait for (in the
 * order they came, so the one that caused a demand read goes first), and
 * hand the rest to the pool. Takes @buf.
 */
void rs_lb_landed(struct halite_restore *r, uint64_t lb, uint8_t *buf, int how, uint8_t *tmp)
{
	struct rlb *b = &r->lbs[lb];
	struct fault_waiter *w, *fifo = NULL;
	struct itask *t;
	const uint64_t *mbs;
	uint64_t fault_mb;
	uint32_t n, staged = 0;
	int ret = 0;

	/* After a failure nothing more is published; what was is installed whole. */
	if (rs_failed(r)) {
		halite_reader_free_lb(buf);
		return;
	}
	halite_reader_lb_members(r->rd, lb, &mbs, &n);
	atomic_fetch_add(&r->lbs_cached, 1);
	pthread_mutex_lock(&r->src.lk);
	atomic_store(&r->src.st[lb], LB_CACHED);
	b->buf = buf;
	b->refs = 1;
	b->how = (uint8_t)how;
	b->t_ns = rs_since_ready(r);
	fault_mb = b->fault_mb;
	if (r->track && how == HOW_DEMAND)
		b->staged = staged = lb_stageable(r, lb, fault_mb);
	while ((w = b->waiters)) {
		b->waiters = w->next;
		w->next = fifo;
		fifo = w;
	}
	pthread_mutex_unlock(&r->src.lk);
	atomic_fetch_add(&r->n_staged, staged);
	while ((w = fifo)) {
		fifo = w->next;
		if (!ret) {
			if (rs_claim(r, w->mb, MB_NONE)) {
				ret = rs_install_from_lb(r, w->mb, buf, tmp, HALITE_GMEM_ZERO_GONE);
				if (!ret) {
					rs_installed(r, w->mb, BY_FAULT);
					rs_fault_served(r, w->t0);
					if (r->track && how == HOW_DEMAND && w->mb != fault_mb)
						rs_count_accessed(r, b);
				}
			} else {
				/* Two threads faulted on one block: installed just above. */
				ret = mb_wake(r, w->mb);
				if (ret)
					ret = rs_fail(r, ret, "memory block %llu: UFFDIO_WAKE",
						    ULL(w->mb));
				rs_fault_served(r, w->t0);
			}
		}
		free(w);
	}
	/* Then the blocks of huge pages a fault waits for (huge.c), in address order. */
	for (uint32_t i = 0; i < n && !ret && r->has_huge; i++)
		if (r->huge->wanted(r, mbs[i]) && rs_claim(r, mbs[i], MB_NONE))
			ret = r->huge->write(r, mbs[i], buf, BY_FAULT);
	if (ret)
		rs_set_failed(r, ret);
	/* No task, or no room in the pool: this thread installs the LB itself. */
	t = malloc(sizeof(*t));
	if (!t) {
		install_lb(&(struct itask){ r, lb, buf });
		return;
	}
	*t = (struct itask){ r, lb, buf };
	if (halite_pool_submit(r->pool, install_task, t))
		install_task(t);
}

/* Every stored block is in: install what is staged, unregister, done. */
void rs_finish(struct halite_restore *r)
{
	int ret = 0;

	for (uint64_t lb = 0; (r->track || r->learn) && lb < r->lb_total && !ret; lb++) {
		struct rlb *b = &r->lbs[lb];
		const uint64_t *mbs;
		uint32_t n;

		if (!b->stage)
			continue;
		halite_reader_lb_members(r->rd, lb, &mbs, &n);
		for (uint32_t i = 0; i < n && !ret; i++) {
			if (!rs_claim(r, mbs[i], MB_STAGED)) {
				/*
				 * A fault took it and is installing it: done must
				 * wait for that install to be counted, or the sums
				 * read right after done would be one short.
				 */
				while (atomic_load(&r->mb[mbs[i]]) == MB_CLAIMED &&
				       !rs_failed(r))
					sched_yield();
				continue;
			}
			ret = rs_install_staged(r, lb, mbs[i], 0);
			if (!ret)
				rs_installed(r, mbs[i], rs_staged_by(r, lb));
		}
	}
	if (ret) {
		rs_set_failed(r, ret);
		return;
	}
	if (rs_failed(r))
		return;
	atomic_store(&r->ended, true);
	/*
	 * Unregistering (where the memory is now, moves included) wakes every
	 * waiter; holes then read as zeros. Every block is in: the guest may
	 * discard what it likes again.
	 */
	ret = gs_unregister(&r->gs);
	if (ret)
		halite_logf(&r->log, HALITE_LOG_WARN, "UFFDIO_UNREGISTER: %s", strerror(-ret));
	rs_allow_discards(r);
	rs_end(r, 0);
}
