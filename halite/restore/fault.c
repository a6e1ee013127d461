/* SPDX-License-Identifier: MIT */
/*
 * The copy strategy's fault path (the session's gs_ops): a fault, placed by
 * the session (guest_session.c), to its page installed and its thread
 * woken: zero blocks, stored blocks by their MB and LB state, hugetlbfs
 * pages through the huge strategy.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>

#include "restore_int.h"

/*
 * A fault on page @off of region @ri of an installed block raced its
 * install, or the guest discarded the page since: a zero page there fails
 * with EEXIST in the race (gmem then wakes) and gives a discarded page the
 * zeros a discard means, rather than waking the thread into the same fault
 * forever (the wake rules: docs/architecture.md).
 */
static int wake_installed(struct halite_restore *r, uint32_t ri, uint64_t off, bool write)
{
	return halite_gmem_fill(r->gs.gm, ri, off, r->page, NULL, HALITE_GMEM_ZERO,
				HALITE_GMEM_ZERO_GONE | (write ? HALITE_GMEM_WRITE : 0));
}

static void serve_zero(struct halite_restore *r, uint64_t mb, const struct gs_fault *f)
{
	uint64_t t0 = f->t0;
	int ret;

	gs_count_kind(&r->gs.faults_zero, f);
	/* Only this thread installs zero blocks: the claim cannot be contended. */
	if (rs_claim(r, mb, MB_NONE)) {
		/* A write would copy-on-write the zero page at once: give it its own. */
		ret = rs_mb_fill(r, mb, NULL, HALITE_GMEM_ZERO_GONE |
			      (f->write ? HALITE_GMEM_WRITE : 0));
		if (ret) {
			rs_set_failed(r, rs_install_failed(r, ret, mb, "UFFDIO_ZEROPAGE"));
			return;
		}
		atomic_store(&r->mb[mb], MB_INSTALLED);
	} else {
		ret = wake_installed(r, f->ri, f->off, f->write);
		if (ret) {
			rs_set_failed(r, rs_fail(r, ret, "memory block %llu: waking a fault", ULL(mb)));
			return;
		}
	}
	rs_fault_served(r, t0);
}

static void serve_stored(struct halite_restore *r, uint64_t mb, uint64_t lb,
			 const struct gs_fault *f)
{
	struct rlb *b = &r->lbs[lb];
	uint64_t t0 = f->t0;

	for (;;) {
		uint8_t s = atomic_load(&r->mb[mb]);
		struct fault_waiter *w;
		uint8_t *buf;
		uint64_t fault_mb;
		size_t wake = 0;
		int ret, how;

		if (s == MB_CLAIMED) {
			/* Whoever claimed it is copying it in, and that copy wakes us. */
			gs_count_kind(&r->gs.faults_cached, f);
			return;
		}
		if (s == MB_INSTALLED) {
			gs_count_kind(&r->gs.faults_cached, f);
			ret = wake_installed(r, f->ri, f->off, f->write);
			if (ret)
				rs_set_failed(r, rs_fail(r, ret, "memory block %llu: waking a fault",
						    ULL(mb)));
			else
				rs_fault_served(r, t0);
			return;
		}
		if (s == MB_STAGED) {
			if (!rs_claim(r, mb, MB_STAGED))
				continue;
			ret = rs_install_staged(r, lb, mb, HALITE_GMEM_ZERO_GONE);
			if (ret) {
				rs_set_failed(r, ret);
				return;
			}
			rs_installed(r, mb, BY_FAULT);
			gs_count_kind(&r->gs.faults_cached, f);
			/* Staged for learning only (learn.c): not what TRACK_ACCESS counts. */
			if (r->track && b->how == HOW_DEMAND)
				rs_count_accessed(r, b);
			rs_fault_served(r, t0);
			return;
		}
		pthread_mutex_lock(&r->src.lk);
		switch (atomic_load(&r->src.st[lb])) {
		case LB_IDLE:
		case LB_READING:
			w = malloc(sizeof(*w));
			if (!w) {
				pthread_mutex_unlock(&r->src.lk);
				rs_set_failed(r, rs_fail(r, -ENOMEM, "memory block %llu: waiter",
						    ULL(mb)));
				return;
			}
			*w = (struct fault_waiter){ b->waiters, mb, t0 };
			b->waiters = w;
			ret = 0;
			if (atomic_load(&r->src.st[lb]) == LB_IDLE) {
				atomic_store(&r->src.st[lb], LB_READING);
				b->fault_mb = mb;
				/* Nobody queued ahead: try the page cache first (src_read_cached). */
				if (src_inline_ok(&r->src)) {
					pthread_mutex_unlock(&r->src.lk);
					if (src_read_cached(&r->src, lb, r->fault_tmp))
						return;
					pthread_mutex_lock(&r->src.lk);
				}
				ret = src_queue_push(&r->src, lb);
				if (!ret)
					wake = 1 + src_ra_push(&r->src, lb);
			}
			pthread_mutex_unlock(&r->src.lk);
			/* A reader for the demand read, and one per readahead read it may start. */
			while (wake--)
				pthread_cond_signal(&r->src.q_cond);
			if (ret)
				rs_set_failed(r, rs_fail(r, ret, "locality block %llu: demand queue",
						    ULL(lb)));
			return;
		case LB_CACHED:
			b->refs++;
			buf = b->buf;
			how = b->how;
			fault_mb = b->fault_mb;
			pthread_mutex_unlock(&r->src.lk);
			if (!rs_claim(r, mb, MB_NONE)) {
				rs_lb_release(r, lb);
				continue; /* the pool took it meanwhile */
			}
			ret = rs_install_from_lb(r, mb, buf, r->fault_tmp, HALITE_GMEM_ZERO_GONE);
			if (!ret) {
				rs_installed(r, mb, BY_FAULT);
				gs_count_kind(&r->gs.faults_cached, f);
				if (r->track && how == HOW_DEMAND && mb != fault_mb)
					rs_count_accessed(r, b);
				rs_fault_served(r, t0);
			}
			rs_lb_release(r, lb);
			if (ret)
				rs_set_failed(r, ret);
			return;
		case LB_FAILED:
			pthread_mutex_unlock(&r->src.lk);
			return; /* the restore has failed: the thread stays blocked */
		default:
			/* DONE: every block was claimed since the load above. */
			s = atomic_load(&r->mb[mb]);
			pthread_mutex_unlock(&r->src.lk);
			if (s != MB_NONE)
				continue;
			if (!rs_failed(r))
				rs_set_failed(r, rs_fail(r, -HALITE_E_INTERNAL,
						    "memory block %llu: not installed, its locality "
						    "block %llu done", ULL(mb), ULL(lb)));
			return;
		}
	}
}

static struct halite_restore *of_gs(struct gsession *gs)
{
	return (struct halite_restore *)((char *)gs - offsetof(struct halite_restore, gs));
}

static void copy_fault(struct gsession *gs, const struct gs_fault *fault)
{
	struct gs_fault ff = *fault, *f = &ff;
	struct halite_restore *r = of_gs(gs);
	const struct rregion *g = &r->regions[f->ri];
	uint64_t mb = g->first_mb + f->off / r->mb_size;
	struct halite_mb_loc loc;
	int ret;

	/*
	 * Read before the ranges were unregistered at the end, whose
	 * unregistering woke the thread: nothing to serve or count.
	 */
	if (atomic_load(&r->ended) && !rs_failed(r))
		return;
	if (rs_failed(r)) {
		/*
		 * Install nothing more; only a raced fault on good bytes is
		 * woken (a huge page's blocks are good once it is complete).
		 */
		if (g->hpage && r->huge->in(r, mb))
			halite_gmem_wake(gs->gm, f->ri, f->off - f->off % g->hpage, g->hpage);
		else if (!g->hpage && atomic_load(&r->mb[mb]) == MB_INSTALLED)
			halite_gmem_wake(gs->gm, f->ri, f->off, r->page);
		return;
	}
	atomic_store(&r->src.last_fault_ns, f->t0);
	/* In: the thread was answered, and this is a new fault (after a discard, say). */
	if (f->again)
		f->again = g->hpage ? !r->huge->in(r, mb) : atomic_load(&r->mb[mb]) != MB_INSTALLED;
	gs_count_fault(gs, f);
	/* A 1.1 file's index chunks come in here on first use; damaged, it fails. */
	ret = halite_reader_mb_lookup(r->rd, mb, &loc);
	if (ret) {
		rs_set_failed(r, rs_fail(r, ret, "memory block %llu: %s", ULL(mb),
					 halite_reader_errmsg(r->rd)));
		return;
	}
	if (r->obs && !f->again)
		r->obs->fault(r, mb, loc.state, f->tid, f->t0);
	if (g->hpage)
		r->huge->fault(r, mb, f);
	else if (loc.state != HALITE_MB_STORED)
		serve_zero(r, mb, f);
	else
		serve_stored(r, mb, loc.lb, f);
}

static void copy_stray_failed(struct gsession *gs, uint64_t addr, int err)
{
	struct halite_restore *r = of_gs(gs);

	rs_set_failed(r, rs_fail(r, err, "fault at 0x%llx outside guest memory", ULL(addr)));
}

static int copy_timeout(struct gsession *gs)
{
	struct halite_restore *r = of_gs(gs);

	/* Learning: woken when its window ends (learn.c). */
	return r->obs ? r->obs->tick(r) : -1;
}

/*
 * The session serves until told to stop, also after done (messages read
 * before the ranges were unregistered) and after a failure (a fault that
 * raced an install is still woken): no next().
 */
const struct gs_ops rs_copy_ops = {
	.fault = copy_fault,
	.stray_failed = copy_stray_failed,
	.timeout_ms = copy_timeout,
	.ending = rs_ending,
};
