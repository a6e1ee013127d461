/* SPDX-License-Identifier: MIT */
/*
 * HALITE_RESTORE_LEARN: the order in which the guest first touches each
 * memory block after resume, per vCPU, written as a version 2 restore trace
 * (docs/restore-trace.md, learn and touch lines).
 *
 * Every first touch must be a fault the engine sees, so while learning no
 * block reaches guest memory before the guest asks for it:
 * - the blocks of an LB no fault asked for are staged (install.c's
 *   install_lb, as with TRACK_ACCESS), whether the LB was read for a fault
 *   or, at start, for a copy (HALITE_MEM_COPY);
 * - the background prefetcher holds back (pf_hold) and stream readahead
 *   queues nothing (src_ra_push). Staging what they read instead would hold
 *   up to all of guest memory decoded in the engine (64 GiB for a 64 GiB
 *   guest); paused, the engine holds what the guest's own faults read.
 * Zero and never-touched blocks need nothing: only a fault installs them.
 *
 * Recording is the fault thread's (the one thread that serves faults, in
 * the order their messages come): one byte per memory block says it was
 * recorded, so a block is recorded once whatever faults follow (a second
 * vCPU on a block being read, a discarded page faulting again). On
 * hugetlbfs a huge page comes in whole: the first fault on the page is
 * recorded, keyed by its first block, naming the block that faulted.
 *
 * The window: the fault thread polls with the time left as its timeout
 * (learn_tick) and ends it when due. Then every staged block is
 * installed (a pool task, unstage()) but, with TRACK_ACCESS, those of
 * demand LBs, which it keeps staged to the end as it always does (their
 * later touches count in vm_access_pct), readahead queues again from the next
 * demand read and the prefetcher runs: the restore goes on as one without
 * LEARN. An LB whose install task was still staging when unstage() passed
 * it keeps those blocks staged until the end (rs_finish() installs them), or
 * until the guest touches them. If the restore ends first, done or failed,
 * learning stops there; "complete" says whether it was done.
 *
 * Memory: a record of 24 bytes per block first touched, and the touch map
 * (one byte per block, pages appearing as used: zalloc.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "restore_int.h"
#include "zalloc.h"

#define TOUCHES_FIRST 4096u

static const struct rs_observer learn_observer;

int rs_learn_init(struct halite_restore *r)
{
	if (!r->learn)
		return 0;
	r->obs = &learn_observer;
	r->touched = halite_zalloc(r->mb_total ? r->mb_total : 1);
	return r->touched ? 0 : -ENOMEM;
}

void rs_learn_free(struct halite_restore *r)
{
	halite_zfree(r->touched);
	free(r->touches);
}

/*
 * Every block staged for learning installed (the window's end); see the top
 * for the LBs it misses. With TRACK_ACCESS a demand LB's blocks stay staged
 * to the end (rs_finish()), as without LEARN: vm_access_pct counts the guest's
 * touches of them until then, not only those inside the window.
 */
static void unstage(void *arg)
{
	struct halite_restore *r = arg;
	int ret = 0;

	for (uint64_t lb = 0; lb < r->lb_total && !ret && !rs_failed(r); lb++) {
		uint8_t s = atomic_load(&r->src.st[lb]);
		const uint64_t *mbs;
		uint32_t n;
		int by;

		/* Staged blocks are in LBs that landed: CACHED or DONE. */
		if (s != LB_CACHED && s != LB_DONE)
			continue;
		by = rs_staged_by(r, lb);
		if (r->track && by == BY_POOL)
			continue;
		halite_reader_lb_members(r->rd, lb, &mbs, &n);
		for (uint32_t i = 0; i < n && !ret; i++) {
			if (!rs_claim(r, mbs[i], MB_STAGED))
				continue;
			ret = rs_install_staged(r, lb, mbs[i], 0);
			if (!ret)
				rs_installed(r, mbs[i], by);
		}
	}
	if (ret)
		rs_set_failed(r, ret);
}

/* The window is over (or no more can be recorded): back to a plain restore. */
static void window_end(struct halite_restore *r, const char *why)
{
	size_t n;
	bool was;

	pthread_mutex_lock(&r->learn_lk);
	was = atomic_exchange(&r->learning, false);
	n = r->ntouches;
	pthread_mutex_unlock(&r->learn_lk);
	if (!was)
		return;
	halite_logf(&r->log, HALITE_LOG_INFO, "learning ends (%s): %zu first touches recorded; "
		    "staged blocks go in, prefetch resumes", why, n);
	if (halite_pool_submit(r->pool, unstage, r))
		unstage(r);
}

static void learn_fault(struct halite_restore *r, uint64_t mb, int kind, uint32_t tid, uint64_t t0)
{
	const struct rregion *g;
	uint64_t key = mb;
	bool full = false;

	if (!atomic_load(&r->learning))
		return;
	g = rs_region_of_mb(r, mb);
	if (g->hpage)
		key = mb - (mb - g->first_mb) % (g->hpage / r->mb_size);
	pthread_mutex_lock(&r->learn_lk);
	if (atomic_load(&r->learning) && !r->touched[key]) {
		if (r->ntouches == r->touches_cap) {
			size_t cap = r->touches_cap ? 2 * r->touches_cap : TOUCHES_FIRST;
			struct learn_touch *t = realloc(r->touches, cap * sizeof(*t));

			if (t) {
				r->touches = t;
				r->touches_cap = cap;
			}
			full = !t;
		}
		if (!full) {
			r->touched[key] = 1;
			r->touches[r->ntouches++] = (struct learn_touch){
				t0 > r->gs.running_ns ? t0 - r->gs.running_ns : 0, mb, gs_vcpu_of(&r->gs, tid),
				(uint8_t)kind };
		}
	}
	pthread_mutex_unlock(&r->learn_lk);
	/* Short of memory: what was learnt stands, the restore goes on. */
	if (full)
		window_end(r, "out of memory for the touch records");
}

static int learn_tick(struct halite_restore *r)
{
	uint64_t now;

	if (!r->learn_end_ns || !atomic_load(&r->learning))
		return -1;
	now = halite_now_ns();
	if (now >= r->learn_end_ns) {
		window_end(r, "its window is over");
		return -1;
	}
	return (int)((r->learn_end_ns - now + 999999) / 1000000);
}

static void learn_stop(struct halite_restore *r, bool done)
{
	if (!r->learn)
		return;
	pthread_mutex_lock(&r->learn_lk);
	if (atomic_exchange(&r->learning, false) && done)
		r->learn_complete = true;
	pthread_mutex_unlock(&r->learn_lk);
}

static void learn_write(struct halite_restore *r, FILE *f)
{
	pthread_mutex_lock(&r->learn_lk);
	trace_write_learn(f, r->o.learn_window_ms, r->learn_complete, r->touches, r->ntouches);
	pthread_mutex_unlock(&r->learn_lk);
}

static const struct rs_observer learn_observer = {
	.fault = learn_fault,
	.tick = learn_tick,
	.stop = learn_stop,
	.write = learn_write,
};
