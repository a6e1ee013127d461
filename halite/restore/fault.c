/* SPDX-License-Identifier: MIT */
/*
 * The fault path: a fault from the fault loop's batch to its page installed
 * and its thread woken (zero blocks, stored blocks by their MB and LB state,
 * hugetlbfs pages through the huge strategy), and the fault thread itself.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>

#include "fault_loop.h"
#include "guest_fault.h"
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
	return halite_gmem_fill(r->gm, ri, off, r->page, NULL, HALITE_GMEM_ZERO,
				HALITE_GMEM_ZERO_GONE | (write ? HALITE_GMEM_WRITE : 0));
}

static void serve_zero(struct halite_restore *r, uint64_t mb, const struct fault *f)
{
	uint64_t t0 = f->t0;
	int ret;

	atomic_fetch_add(&r->n_faults_zero, 1);
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
			 const struct fault *f)
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
			atomic_fetch_add(&r->n_faults_cached, 1);
			return;
		}
		if (s == MB_INSTALLED) {
			atomic_fetch_add(&r->n_faults_cached, 1);
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
			atomic_fetch_add(&r->n_faults_cached, 1);
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
				atomic_fetch_add(&r->n_faults_cached, 1);
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
			if (!atomic_load(&r->failed))
				rs_set_failed(r, rs_fail(r, -HALITE_E_INTERNAL,
						    "memory block %llu: not installed, its locality "
						    "block %llu done", ULL(mb), ULL(lb)));
			return;
		}
	}
}

static void serve_fault(struct halite_restore *r, const struct uffd_msg *m, uint64_t t0)
{
	uint64_t addr = m->arg.pagefault.address & ~(r->page - 1);
	struct fault f = { .write = m->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE, .t0 = t0 };
	const struct rregion *g;
	struct halite_mb_loc loc;
	uint64_t mb;
	int ret;

	if (!guest_fault_place(r->gm, m, addr, &f.ri, &f.off, &ret)) {
		if (ret)
			rs_set_failed(r, rs_fail(r, ret, "fault at 0x%llx outside guest memory",
					    ULL(addr)));
		return;
	}
	g = &r->regions[f.ri];
	mb = g->first_mb + f.off / r->mb_size;
	/*
	 * Read before the ranges were unregistered at the end, whose
	 * unregistering woke the thread: nothing to serve or count.
	 */
	if (atomic_load(&r->ended) && !atomic_load(&r->failed))
		return;
	if (atomic_load(&r->failed)) {
		/*
		 * Install nothing more; only a raced fault on good bytes is
		 * woken (a huge page's blocks are good once it is complete).
		 */
		if (g->hpage && r->huge->in(r, mb))
			halite_gmem_wake(r->gm, f.ri, f.off - f.off % g->hpage, g->hpage);
		else if (!g->hpage && atomic_load(&r->mb[mb]) == MB_INSTALLED)
			halite_gmem_wake(r->gm, f.ri, f.off, r->page);
		return;
	}
	atomic_store(&r->src.last_fault_ns, t0);
	atomic_fetch_add(&r->n_faults, 1);
	if (guest_vcpu_of(r->o.vcpu_tids, r->o.nvcpus, m->arg.pagefault.feat.ptid))
		atomic_fetch_add(&r->n_faults_vcpu, 1);
	/* A 1.1 file's index chunks come in here on first use; damaged, it fails. */
	ret = halite_reader_mb_lookup(r->rd, mb, &loc);
	if (ret) {
		rs_set_failed(r, rs_fail(r, ret, "memory block %llu: %s", ULL(mb),
					 halite_reader_errmsg(r->rd)));
		return;
	}
	if (r->obs)
		r->obs->fault(r, mb, loc.state, m->arg.pagefault.feat.ptid, t0);
	if (g->hpage)
		r->huge->fault(r, mb, &f);
	else if (loc.state != HALITE_MB_STORED)
		serve_zero(r, mb, &f);
	else
		serve_stored(r, mb, loc.lb, &f);
}

static int fault_timeout(void *ctx)
{
	struct halite_restore *r = ctx;

	/* Learning: woken when its window ends (learn.c). */
	return r->obs ? r->obs->tick(r) : -1;
}

static void fault_serve(void *ctx, const struct uffd_msg *m, int n, uint64_t t0)
{
	for (int i = 0; i < n; i++)
		serve_fault(ctx, &m[i], t0);
}

static void fault_read_failed(void *ctx, int err)
{
	struct halite_restore *r = ctx;

	rs_set_failed(r, rs_fail(r, err, "reading the userfaultfd"));
}

void *rs_fault_main(void *arg)
{
	struct halite_restore *r = arg;
	struct halite_fault_loop loop = {
		.gm = r->gm, .uffd = r->uffd, .stop_fd = r->stop_fd, .ctx = r,
		.timeout_ms = fault_timeout, .serve = fault_serve, .failed = fault_read_failed,
	};

	pthread_setname_np(pthread_self(), "halite-rfault");
	/*
	 * Serve until told to exit, also after done (messages read before the
	 * ranges were unregistered) and after a failure (a fault that raced an
	 * install is still woken).
	 */
	halite_fault_loop_run(&loop);
	return NULL;
}
