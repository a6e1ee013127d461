/* SPDX-License-Identifier: MIT */
/*
 * The copy-on-access fault path: a fault from the loop's batch to its block
 * claimed, copied aside and given back (the vCPU released), then queued;
 * and the block operations it is made of, which the background thread and
 * teardown use too.
 *
 * The fault thread reads first-touch faults; it claims the memory block, gives
 * it back with one UFFDIO_COPY from the shadow (which wakes the thread), and
 * only once every fault of the batch it read is answered queues the
 * blocks, tagged with the faulting threads' streams. Nothing slower than
 * that one copy happens before a wake. It runs SCHED_FIFO where allowed
 * (fault_thread_sched()): on a machine with fewer cores than busy threads
 * the tail of fault service was the thread being preempted mid-service by
 * the vCPUs and the engine's own threads, not its work.
 *
 * Untouched blocks: a shadow block with no page present (or swapped), or a
 * file range that is a hole (SEEK_DATA counts swapped shmem pages as data),
 * was never touched by the guest; it is recorded as such and reads as zeros,
 * which is what it was.
 *
 * Shadow memory: a block's snapshot bytes stay in the shadow until the
 * block is SAVED and the page-table walk, which may still read it as a page
 * table, is over; then they are dropped (save_release_block()), so after the
 * walk the shadow holds only blocks in flight and blocks never claimed.
 *
 * Giving back, and the guest's own changes: every give-back goes through
 * halite/src/gmem.h, which reads the userfaultfd's events with the faults. A
 * private page the guest discards after the snapshot instant is "gone": a
 * fault on it gets zeros (give-backs for faults fill gone pages with zeros,
 * the others skip them), while its snapshot bytes, in the shadow, are saved
 * as usual. The fault thread starts before arming: dropping the owner's
 * page-table entries raises a REMOVE event that someone must read. The
 * range of private memory is not registered while its pages move to the
 * shadow (the registration would follow them, EVENT_REMAP), but is
 * registered once before that, which is how memory another save or restore
 * holds is refused (EBUSY) before anything moved.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fault_loop.h"

#include "save_int.h"

static uint32_t stream_of_tid(const struct halite_save *s, uint32_t tid)
{
	for (uint32_t i = 0; i < s->o.nvcpus; i++)
		if ((uint32_t)s->o.vcpu_tids[i] == tid)
			return HALITE_STREAM(HALITE_STREAM_VCPU, i);
	return HALITE_STREAM(HALITE_STREAM_OTHER, 0);
}

/* Was any page of the block ever populated (present or swapped)? 1, 0 or -errno. */
int save_block_touched(struct halite_save *s, const struct sregion *r, uint64_t mb)
{
	uint64_t off = (mb - r->first_mb) * s->mb_size;
	uint64_t e[SAVE_PAGES_MAX];
	uint32_t n = s->mb_size / 4096;
	const uint8_t *p = r->shadow + off;
	ssize_t got;

	if (r->hpage)
		return 1; /* hugetlbfs has no holes to find (see the top) */
	if (r->had_data) {
		/* What the file held at the snapshot instant: it may have lost it since. */
		for (uint64_t pg = off / 4096; pg < (off + s->mb_size) / 4096; pg++)
			if (r->had_data[pg / 64] & (1ull << (pg % 64)))
				return 1;
		return 0;
	}
	if (r->kind == HALITE_MEM_SHARED) {
		off_t d = lseek(r->fd, (off_t)(r->fd_off + off), SEEK_DATA);

		if (d < 0)
			return errno == ENXIO ? 0 : -errno;
		return (uint64_t)d < r->fd_off + off + s->mb_size;
	}

	/* Private memory: the shadow here, or the pages moved aside in the owner. */
	if (r->aside)
		got = pread(s->owner_pagemap_fd, e, n * sizeof(e[0]),
			    (off_t)((r->aside + off) / 4096 * 8));
	else
		got = pread(s->pagemap_fd, e, n * sizeof(e[0]), (off_t)((uintptr_t)p / 4096 * 8));
	if (got != (ssize_t)(n * sizeof(e[0])))
		return got < 0 ? -errno : -EIO;
	for (uint32_t i = 0; i < n; i++)
		if (e[i] & (PAGEMAP_PRESENT | PAGEMAP_SWAPPED))
			return 1;
	return 0;
}

/*
 * Give memory block @mb back to the guest (halite/src/gmem.h): private memory
 * from the shadow (UFFDIO_COPY), shared memory from the page cache
 * (UFFDIO_CONTINUE; a hole gets the zeros it holds), on hugetlbfs its whole
 * huge page. A page already there is kept; a page the guest discarded since
 * is skipped, or gets zeros with HALITE_GMEM_ZERO_GONE (a fault waits on it);
 * HALITE_GMEM_DONTWAKE leaves its faults asleep. 0 or -errno.
 */
int save_give_back(struct halite_save *s, const struct sregion *r, uint64_t mb, unsigned flags)
{
	uint64_t off = (mb - r->first_mb) * s->mb_size;
	uint32_t ri = (uint32_t)(r - s->regions);
	int ret;

	if (r->hpage)
		return halite_gmem_fill(s->gm, ri, off - off % r->hpage, r->hpage, NULL,
					HALITE_GMEM_CONTINUE, flags);
	if (r->kind == HALITE_MEM_SHARED)
		return halite_gmem_fill(s->gm, ri, off, s->mb_size, NULL, HALITE_GMEM_CONTINUE,
					flags);
	ret = halite_gmem_fill(s->gm, ri, off, s->mb_size, r->shadow + off, HALITE_GMEM_COPY,
			       flags);
	if (!ret)
		atomic_fetch_or(&s->given[mb / 64], 1ull << (mb % 64));
	return ret;
}

/*
 * @len bytes at region offset @off of the file, into @dst, by pread(): a hole
 * reads as zeros and stays a hole (hugetlbfs; shared memory whose file may
 * lose pages, copy_checked()). 0 or -errno.
 */
int save_read_huge(const struct sregion *r, uint64_t off, void *dst, uint64_t len)
{
	for (uint64_t done = 0; done < len;) {
		ssize_t n = pread(r->fd, (uint8_t *)dst + done, len - done,
				  (off_t)(r->fd_off + off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		done += (uint64_t)n;
	}
	return 0;
}

/*
 * Another process's private memory: @len bytes at region offset @off of the
 * pages it moved aside (nobody writes them: the guest has the range they
 * came from), into @dst. 0 or -errno.
 */
int save_read_aside(struct halite_save *s, const struct sregion *r, uint64_t off, void *dst,
		    uint64_t len)
{
	struct iovec l = { dst, len }, rm = { (void *)(uintptr_t)(r->aside + off), len };
	ssize_t n = process_vm_readv(s->o.owner_pid, &l, 1, &rm, 1, 0);

	if (n == (ssize_t)len)
		return 0;
	return n < 0 ? -errno : -EIO;
}

/*
 * Shared memory whose file could not be made to refuse hole punches
 * (r->had_data): block @mb read with pread(), then every page that held data
 * at the snapshot instant must still hold data now. If the VMM punched one
 * away before it was copied (a balloon or virtio-mem discard; no userfaultfd
 * event tells of a hole punched through the file), the bytes just read may
 * be zeros that were never the guest's: the save fails, naming where. A
 * punch after the check is harmless: the bytes are copied by then.
 */
static int copy_checked(struct halite_save *s, const struct sregion *r, uint64_t mb)
{
	uint64_t off = (mb - r->first_mb) * s->mb_size;
	int ret = save_read_huge(r, off, r->shadow + off, s->mb_size);

	if (ret)
		return ret;
	for (uint64_t p = off / 4096; p < (off + s->mb_size) / 4096; p++) {
		off_t at = (off_t)(r->fd_off + p * 4096), d;

		if (!(r->had_data[p / 64] & (1ull << (p % 64))))
			continue;
		d = lseek(r->fd, at, SEEK_DATA);
		if (d < 0 && errno != ENXIO)
			return -errno;
		if (d != at)
			return sfail(s, -ENODATA, "guest memory at guest-physical 0x%llx (region "
				     "'%s', offset %llu) was discarded after the snapshot instant, "
				     "before it was saved: its file lost the page (a hole punched: "
				     "virtio-balloon inflation, free page reporting or virtio-mem "
				     "unplug?), so the snapshot cannot be completed",
				     (unsigned long long)(r->gpa + p * 4096), r->name,
				     (unsigned long long)(p * 4096));
	}
	return 0;
}

/*
 * Shared: copy the snapshot bytes of the @n claimed blocks from @mb to the
 * shadow (a hole stays a hole there: zeros), then mark them READY, even
 * when the copy fails (a fault waiting on COPYING would wait forever).
 */
int save_copy_claimed(struct halite_save *s, const struct sregion *r, uint64_t mb,
		      uint64_t n, int touched)
{
	uint64_t off = (mb - r->first_mb) * s->mb_size;
	int ret = 0;

	if (r->hpage)
		ret = save_read_huge(r, off, r->shadow + off, n * s->mb_size);
	else if (r->aside && touched > 0)
		ret = save_read_aside(s, r, off, r->shadow + off, n * s->mb_size);
	else if (r->kind == HALITE_MEM_SHARED && touched > 0 && r->had_data)
		for (uint64_t i = 0; i < n && !ret; i++)
			ret = copy_checked(s, r, mb + i);
	else if (r->kind == HALITE_MEM_SHARED && touched > 0)
		memcpy(r->shadow + off, r->view + off, n * s->mb_size);
	for (uint64_t i = 0; i < n; i++)
		atomic_store(&s->claim[mb + i], CLAIM_READY);
	return ret;
}

/* A fault answered whose block still has to be queued, once the batch is. */
struct pending {
	uint64_t mb;
	uint32_t stream;
	bool touched;
};

/* After the wake: queue block @mb that a fault in @stream claimed. */
static int queue_faulted(struct halite_save *s, uint64_t mb, uint32_t stream, bool touched)
{
	struct item *it = save_item_new(s, mb, stream, touched);

	if (!it)
		return sfail(s, -ENOMEM, "memory block %llu: queueing", (unsigned long long)mb);
	if (HALITE_STREAM_KIND(stream) == HALITE_STREAM_VCPU) {
		atomic_fetch_add(&s->n_faults_vcpu, 1);
		atomic_fetch_add(&s->n_faults_by_vcpu[HALITE_STREAM_INDEX(stream)], 1);
	} else {
		atomic_fetch_add(&s->n_faults_other, 1);
	}
	return save_enqueue(s, it);
}

static void fault_served(struct halite_save *s, uint64_t t0)
{
	atomic_store(&s->last_fault_ns, halite_now_ns());
	halite_hist_add(&s->fault_hist, halite_now_ns() - t0);
	atomic_fetch_add(&s->n_faults, 1);
}

/*
 * hugetlbfs: the kernel gives back whole huge pages, so every block of the
 * faulting one is claimed (those no one has yet), copied and given back at
 * once; the faulting block is queued first, then the others in address
 * order. The copy is one pread() per run of blocks claimed here.
 */
static int serve_huge_fault(struct halite_save *s, const struct sregion *r, uint64_t off,
			    uint32_t stream, uint64_t t0)
{
	uint64_t n = r->hpage / s->mb_size;
	uint64_t first = r->first_mb + off / r->hpage * n;
	uint64_t mb = r->first_mb + off / s->mb_size;
	bool *mine = s->huge_claimed;
	int ret = 0, e;

	for (uint64_t i = 0; i < n; i++)
		mine[i] = claim_block(s, first + i);
	for (uint64_t i = 0; i < n;) {
		uint64_t j = i;

		while (j < n && mine[j] == mine[i])
			j++;
		if (mine[i]) {
			e = save_copy_claimed(s, r, first + i, j - i, 1);
			if (e && !ret)
				ret = sfail(s, e, "memory blocks %llu-%llu: reading them",
					    (unsigned long long)(first + i),
					    (unsigned long long)(first + j - 1));
		} else {
			for (uint64_t k = i; k < j; k++)
				wait_ready(s, first + k);
		}
		i = j;
	}
	/* Even after a failed copy: the page cache still holds the guest's data. */
	e = save_give_back(s, r, mb, HALITE_GMEM_ZERO_GONE);
	if (e)
		return sfail(s, e, "giving the huge page at offset %llu of region '%s' back to the "
			     "guest", (unsigned long long)(off - off % r->hpage), r->name);
	fault_served(s, t0);
	if (ret || atomic_load(&s->stopping))
		return ret;
	if (mine[mb - first])
		ret = queue_faulted(s, mb, stream, true);
	for (uint64_t i = 0; i < n && !ret; i++)
		if (mine[i] && first + i != mb)
			ret = queue_faulted(s, first + i, stream, true);
	return ret;
}

/*
 * Answer fault @m, read at @t0: claim its block, copy it aside if it must
 * be, give it back (the wake). A block this fault claimed goes to *@p for
 * the caller to queue after the batch (p->mb UINT64_MAX: none). Huge pages
 * queue their blocks here (serve_huge_fault()). 0 or -errno.
 */
static int serve_fault(struct halite_save *s, const struct uffd_msg *m, uint64_t t0,
		       struct pending *p)
{
	uint64_t addr = m->arg.pagefault.address, off;
	const struct sregion *r;
	uint32_t stream, ri;
	uint64_t mb;
	int ret, touched = 0;
	unsigned turns = 0;
	bool claimed;

	p->mb = UINT64_MAX;

	if (!halite_gmem_lookup(s->gm, addr, &ri, &off)) {
		/* Left behind by a move, or read before it: what the mapping holds. */
		ret = halite_gmem_serve_stray(s->gm, m);
		return ret ? sfail(s, ret, "fault at 0x%llx outside guest memory",
				   (unsigned long long)addr) : 0;
	}
	r = &s->regions[ri];
	/*
	 * A fault needs the registration, which comes after the region is set
	 * up, but for another process's private memory: registered before its
	 * pages move aside, it can fault while the mremap runs in the owner,
	 * which arm waits for, a few microseconds. If arm fails instead, its
	 * undo wakes the thread.
	 */
	while (!atomic_load_explicit(&r->armed, memory_order_acquire)) {
		if (atomic_load(&s->arm_over))
			return 0;
		backoff(&turns);
	}
	mb = r->first_mb + off / s->mb_size;
	stream = stream_of_tid(s, m->arg.pagefault.feat.ptid);
	if (r->hpage)
		return serve_huge_fault(s, r, off, stream, t0);
	claimed = claim_block(s, mb);
	if (claimed) {
		/*
		 * Before the give-back: that maps the zero page into an anonymous
		 * shadow's hole, and lets the guest write shared pages.
		 */
		touched = save_block_touched(s, r, mb);
		ret = save_copy_claimed(s, r, mb, 1, touched);
		if (touched < 0)
			return sfail(s, touched, "memory block %llu: is it populated?",
				     (unsigned long long)mb);
		if (ret)
			return sfail(s, ret, "memory block %llu: copying it", (unsigned long long)mb);
	} else {
		wait_ready(s, mb);
	}
	/* A page the guest discarded since the snapshot instant reads zero, not its snapshot. */
	ret = save_give_back(s, r, mb, HALITE_GMEM_ZERO_GONE);
	if (ret)
		return sfail(s, ret, "giving memory block %llu back to the guest",
			     (unsigned long long)mb);
	fault_served(s, t0);
	if (claimed)
		*p = (struct pending){ mb, stream, touched > 0 };
	return 0;
}

/*
 * Where allowed (CAP_SYS_NICE or RLIMIT_RTPRIO), the fault thread runs
 * SCHED_FIFO at the lowest real-time priority: measured on 2 cores with 4
 * vCPUs, 99% of the faults slower than 50 us had spent about 6 us on the
 * CPU and the rest preempted (one involuntary switch), most inside the
 * give-back (docs/benchmarks.md, "Lazy save").
 * It sleeps in poll() between faults and each block faults once, so the
 * CPU it can take is bounded by the faults; its waits on other threads
 * sleep after a few turns (backoff()). HALITE_SAVE_NO_REALTIME leaves it an
 * ordinary thread.
 */
static void fault_thread_sched(struct halite_save *s)
{
	struct sched_param sp = { .sched_priority = sched_get_priority_min(SCHED_FIFO) };
	int ret;

	if (s->o.flags & HALITE_SAVE_NO_REALTIME)
		return;
	ret = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
	atomic_store(&s->fault_rt, !ret);
	if (ret)
		halite_logf(&s->log, HALITE_LOG_INFO, "fault thread: SCHED_FIFO refused (%s): it "
			    "runs as an ordinary thread, and can be preempted while serving",
			    strerror(ret));
}

/*
 * Answer every fault of the batch first, timed from its read (a fault
 * behind others in it waits for them too), then queue the blocks they
 * claimed: the queue's lock, allocation and the compression pool's wake-up
 * delay no fault of the batch.
 */
static void serve_batch(struct halite_save *s, const struct uffd_msg *msgs,
			struct pending *pend, int n)
{
	uint64_t t0 = halite_now_ns();
	int ret;

	/* The background holds back while faults are being served. */
	atomic_store(&s->in_fault, true);
	for (int i = 0; i < n; i++) {
		ret = serve_fault(s, &msgs[i], t0, &pend[i]);
		if (ret) {
			pend[i].mb = UINT64_MAX;
			save_set_failed(s, ret);
		}
	}
	atomic_store(&s->in_fault, false);
	for (int i = 0; i < n; i++) {
		/* The save is over (failed or cancelled): only serve the guest. */
		if (pend[i].mb == UINT64_MAX || atomic_load(&s->stopping))
			continue;
		/* After the wake: the snapshot bytes are safe in the shadow. */
		ret = queue_faulted(s, pend[i].mb, pend[i].stream, pend[i].touched);
		if (ret)
			save_set_failed(s, ret);
	}
}

struct fault_ctx {
	struct halite_save *s;
	struct pending pend[HALITE_FAULT_BATCH];
};

/* A stop request with value 2 means "exit": ranges are gone. */
static bool fault_stop(void *ctx, uint64_t v)
{
	(void)ctx;
	return v >= 2;
}

static void fault_serve(void *ctx, const struct uffd_msg *m, int n, uint64_t t0)
{
	struct fault_ctx *fc = ctx;

	(void)t0;
	serve_batch(fc->s, m, fc->pend, n);
}

static void fault_read_failed(void *ctx, int err)
{
	struct fault_ctx *fc = ctx;

	save_set_failed(fc->s, sfail(fc->s, err, "reading userfaultfd"));
}

void *save_fault_main(void *arg)
{
	struct halite_save *s = arg;
	struct fault_ctx fc = { .s = s };
	struct halite_fault_loop loop = {
		.gm = s->gm, .uffd = s->uffd, .stop_fd = s->stop_fd, .ctx = &fc,
		.stop = fault_stop, .serve = fault_serve, .failed = fault_read_failed,
	};

	fault_thread_sched(s);
	/*
	 * Serve faults until the ranges are unregistered, even after a failure:
	 * the abort path gives every block back and a faulting vCPU must
	 * always be woken. Events (the guest's discards, unmaps, moves) are
	 * applied as they are read.
	 */
	halite_fault_loop_run(&loop);
	return NULL;
}
