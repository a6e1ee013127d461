/* SPDX-License-Identifier: MIT */
/*
 * Copy-on-access lazy save engine (include/halite/save.h).
 *
 * Arming (guest paused), per region, a few syscalls each:
 * - private anonymous memory: the pages move aside with
 *   mremap(MREMAP_DONTUNMAP) to a "shadow" mapping that keeps the
 *   snapshot-instant contents; the now empty guest range is registered with
 *   userfaultfd MISSING. A block is given back with UFFDIO_COPY from the
 *   shadow, which nothing ever writes.
 * - shared memory (memfd/tmpfs), ours or another process's: the range is
 *   registered MINOR|MISSING and the owner's page-table entries dropped; the
 *   data stays in the page cache, which the guest writes as soon as a block
 *   is given back (UFFDIO_CONTINUE). So the claimer first copies the block
 *   through the engine's own read-only mapping of the file ("view") into the
 *   region's shadow, a sparse anonymous mapping that then holds the
 *   snapshot-instant bytes of every claimed block, as for anonymous memory.
 * - hugetlbfs: as shared memory, but the kernel maps and faults whole huge
 *   pages, so a fault claims, copies and gives back every block of its huge
 *   page at once (serve_huge_fault()). Blocks are read with pread(), which
 *   reads a hole as zeros without allocating a huge page (a read through a
 *   mapping would); hugetlbfs cannot tell holes (SEEK_DATA says "all data"),
 *   so never-touched memory there is saved as zero blocks.
 * - a copy (HALITE_MEM_COPY): the caller's memory, which nobody writes while
 *   the save runs, serves as the region's shadow as it is. Nothing is
 *   registered, nothing is given back, and its pages are never dropped
 *   (release_block()): they are the caller's. The background thread saves
 *   all of it first (save_copies()), so that the caller gets it back soon.
 *
 * Threads:
 * - fault thread: reads first-touch faults; claims the memory block, gives it
 *   back with one UFFDIO_COPY from the shadow (which wakes the thread), and
 *   only once every fault of the batch it read is answered queues the
 *   blocks, tagged with the faulting threads' streams. Nothing slower than
 *   that one copy happens before a wake. It runs SCHED_FIFO where allowed
 *   (fault_thread_sched()): on a machine with fewer cores than busy threads
 *   the tail of fault service was the thread being preempted mid-service by
 *   the vCPUs and the engine's own threads, not its work.
 * - background thread: claims the blocks no fault has claimed, first in
 *   guest-virtual order by walking the guest's page tables from each root
 *   (ptwalk.c; a block mapped at several addresses is saved once, where the
 *   walk meets it first), then in physical order for what no page table
 *   maps, then what the walk deferred (defer.c: blocks next to ones a fault
 *   claimed first, left for the vCPU that is working there); throttled
 *   (paper, section 6): it runs only when no fault has come
 *   for bg_idle_us, or when it falls behind bg_min_rate. Page-table pages
 *   are read as at the snapshot instant: from the shadow, or for shared
 *   memory from the view while no one has claimed the block (pt_read()).
 *   The tables are the guest's, so hostile input: a leaf is clipped to guest
 *   memory, a large leaf over memory the walk has been through costs one bit
 *   test (pt_visit()), and the whole walk, roots the sampler adds later
 *   included, has a work budget proportional to guest memory (bg_walk()).
 *   Past it the walk stops with a warning and the physical sweep saves the
 *   rest: the save still finishes at the rate floor, and exactly.
 * - compression pool: encodes queued blocks from the shadow.
 * - writer thread: retires queued blocks strictly in queue order (a reorder
 *   point after the parallel pool), so each stream's locality blocks hold its
 *   blocks in the order the guest touched them, then finishes the file.
 *
 * Claiming: each block has one claim byte, taken once by whichever of the
 * two producers gets there first; only the claimer queues it, so every block
 * is saved exactly once. Anonymous: the shadow is never written, so a fault
 * on a block the background claimed is answered from the shadow at once (the
 * background's copy then fails with EEXIST, a normal race). Shared: the
 * claim goes FREE -> COPYING -> READY, and a fault on a COPYING block waits
 * for the claimer's memcpy (bounded, no I/O) before giving the block back:
 * the guest must not write a page before its snapshot bytes are copied.
 * Once the writer has stored a block it marks it SAVED.
 *
 * Untouched blocks: a shadow block with no page present (or swapped), or a
 * file range that is a hole (SEEK_DATA counts swapped shmem pages as data),
 * was never touched by the guest; it is recorded as such and reads as zeros,
 * which is what it was.
 *
 * Shadow memory: a block's snapshot bytes stay in the shadow until the
 * block is SAVED and the page-table walk, which may still read it as a page
 * table, is over; then they are dropped (release_block()), so after the walk
 * the shadow holds only blocks in flight and blocks never claimed.
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
 *
 * Shared memory the VMM gives back: a hole punched in the file of a block
 * not yet copied would lose it, and no event reports it. guard_discards()
 * makes the file refuse punches until teardown; where it cannot, it notes
 * which pages held data at the instant and copy_checked() fails the save on
 * a block that lost one.
 *
 * Internal checks (SAVE_CHECK) guard the invariants a bug would break; a
 * failed check fails the save like an I/O error, with HALITE_E_INTERNAL,
 * and the guest's memory is given back exactly as for any other failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <halite/save.h>

#include "defer.h"
#include "discard.h"
#include "endian_util.h"
#include "export.h"
#include "fault_loop.h"
#include "gmem.h"
#include "log_internal.h"
#include "opts.h"
#include "pool.h"
#include "ptwalk.h"
#include "stats.h"
#include "uffd.h"
#include "save_test.h"
#include "writer_test.h"

#define SAVE_PAGES_MAX 64 /* pages per memory block this engine handles */
#define ITEMS_PREALLOC 512u /* queued blocks ahead of the writer before malloc */
#define PAGEMAP_PRESENT (1ull << 63)
#define PAGEMAP_SWAPPED (1ull << 62)

struct sregion {
	char *name;
	uint64_t gpa, length;
	uint64_t host;	 /* in the owner's address space; registered with userfaultfd */
	int kind;	 /* enum halite_mem_kind */
	/*
	 * ANON of another process: where the owner's pages went at arm (in the
	 * owner, remap callback), read from there; 0 once unmapped, or for
	 * memory of this process.
	 */
	uint64_t aside;
	int fd;		 /* SHARED: our dup of the file */
	uint64_t fd_off;
	/*
	 * Snapshot-instant contents. ANON: the guest's pages moved here at arm.
	 * SHARED: sparse; each claimed block copied here from the view. COPY:
	 * the caller's memory at @host, not ours to drop or unmap.
	 */
	uint8_t *shadow;
	uint8_t *view;	 /* SHARED but hugetlbfs: our read-only mapping of the file */
	uint64_t hpage;	 /* hugetlbfs: its page size; else 0 */
	uint64_t first_mb, nmb;
	bool registered;
	/*
	 * SHARED: the file refuses hole punches while the save needs it
	 * (halite/src/discard.h). When it cannot (@had_data set instead), the
	 * pages that held data at the snapshot instant, one bit each: a block
	 * is then copied with pread() and checked against them, so a hole
	 * punched before it was saved fails the save instead of being saved as
	 * zeros.
	 */
	bool discards_refused;
	uint64_t *had_data;
	/*
	 * Set (release) once arm has set up what the fault path reads (shadow,
	 * had_data), before the region is registered: the fault thread runs
	 * from before arm, and a fault's acquire of it orders those reads.
	 */
	_Atomic bool armed;
};

enum { CLAIM_FREE, CLAIM_COPYING, CLAIM_READY, CLAIM_SAVED };

enum item_kind { ITEM_DATA, ITEM_ZERO, ITEM_UNTOUCHED };

struct item {
	struct item *next;
	uint64_t mb;
	uint32_t stream;
	int kind;
	bool ready;	  /* encoded; under q_lock */
	uint32_t len;	  /* encoded length */
	bool compressed;
	struct halite_save *s;
	uint8_t buf[];	  /* mb_size: encoded */
};

enum { S_CREATED, S_RUNNING, S_DONE, S_FAILED };

struct halite_save {
	struct halite_save_opts o;
	char *path;
	struct halite_writer *w;
	struct sregion *regions;
	uint32_t nregions;
	uint32_t mb_size;
	int codec;
	uint64_t mb_total;
	_Atomic uint8_t *claim;
	/*
	 * Private memory: blocks given back to the guest, one bit each, so that
	 * teardown gives back only the others (a fault, then the background,
	 * gives back every block it claims: after a complete save, none).
	 */
	_Atomic uint64_t *given;

	int uffd;
	struct halite_gmem *gm;	/* every give-back, and the userfaultfd's events */
	bool has_shared;
	bool ext_anon;	   /* a region is another process's private memory */
	/* Claimed blocks are copied into our shadow first (shared, ext_anon): COPYING. */
	bool copy_in;
	bool has_huge;	   /* a region is on hugetlbfs */
	uint64_t max_page; /* the largest page size of any region */
	bool *huge_claimed; /* serve_huge_fault(): blocks of one huge page it claimed */
	int stop_fd;	   /* eventfd: wakes the fault thread */
	int pagemap_fd;
	int owner_pagemap_fd; /* ext_anon: the owner's /proc/PID/pagemap */
	pthread_t fault_thr, bg_thr, writer_thr;
	bool threads_started;
	bool bg_started;
	struct halite_pool *pool;

	/* the queue: producers append, the writer retires from the head */
	pthread_mutex_t q_lock;
	pthread_cond_t q_cond;
	struct item *q_head, *q_tail;
	struct item *free_items; /* under q_lock */
	uint32_t nfree;

	/* state, result, and waiting for them */
	pthread_mutex_t st_lock;
	pthread_cond_t st_cond;
	int state;
	int error;
	_Atomic bool stopping;	/* background and fault threads: wind down */
	_Atomic bool arm_over;	/* halite_save_arm() has returned */
	_Atomic bool walk_done;	/* no page-table page will be read any more */
	_Atomic uint64_t last_fault_ns;
	_Atomic bool in_fault;	/* the fault thread is serving one */
	_Atomic bool fault_rt;	/* the fault thread runs SCHED_FIFO */
	_Atomic uint64_t test_check_after; /* halite_save_test_fail_check() */
	bool test_no_refusal;		    /* halite_save_test_no_discard_refusal() */

	struct halite_root *roots;
	uint32_t nroots, roots_cap;
	struct halite_defer defer; /* the background's: what its walk leaves for later */
	uint32_t defer_window;	   /* HALITE_SAVE_DEFER_WINDOW, or a test's */
	_Atomic bool test_hold_deferred; /* halite_save_test_hold_deferred() */
	_Atomic bool deferred_held;	 /* the background reached that hold (stays set) */
	pthread_mutex_t roots_lock;
	struct halite_save_test_walk walk_end; /* set by the background thread */

	/* statistics */
	uint64_t arm_start_ns, arm_ns, done_ns;
	_Atomic uint64_t n_faults, n_faults_vcpu, n_faults_other, n_bg, n_saved;
	_Atomic uint64_t *n_faults_by_vcpu; /* blocks each vCPU's first touch saved */
	_Atomic uint64_t n_stored, n_zero, n_untouched, raw_bytes, stored_bytes;
	_Atomic uint64_t file_bytes; /* once finished */
	struct halite_hist fault_hist;

	struct halite_logger log;
	char errmsg[256];
};

__attribute__((format(printf, 3, 4)))
static int sfail(struct halite_save *s, int err, const char *fmt, ...)
{
	char msg[sizeof(s->errmsg)];
	va_list ap;

	va_start(ap, fmt);
	halite_vformat_error(msg, sizeof(msg), err, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&s->st_lock);
	if (!s->errmsg[0])
		memcpy(s->errmsg, msg, sizeof(msg));
	pthread_mutex_unlock(&s->st_lock);
	halite_logf(&s->log, HALITE_LOG_ERROR, "%s", msg);
	return err < 0 ? err : -err;
}

/* The first error wins; everything winds down from there. */
static void set_failed(struct halite_save *s, int err)
{
	pthread_mutex_lock(&s->st_lock);
	if (s->state == S_RUNNING) {
		s->state = S_FAILED;
		s->error = err;
	}
	pthread_cond_broadcast(&s->st_cond);
	pthread_mutex_unlock(&s->st_lock);
	atomic_store(&s->stopping, true);
	pthread_mutex_lock(&s->q_lock);
	pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
	eventfd_write(s->stop_fd, 1);
}

static const struct sregion *region_of_mb(const struct halite_save *s, uint64_t mb)
{
	return &s->regions[halite_find_first_mb(s->regions, s->nregions, sizeof(s->regions[0]),
						offsetof(struct sregion, first_mb), mb)];
}

static uint32_t stream_of_tid(const struct halite_save *s, uint32_t tid)
{
	for (uint32_t i = 0; i < s->o.nvcpus; i++)
		if ((uint32_t)s->o.vcpu_tids[i] == tid)
			return HALITE_STREAM(HALITE_STREAM_VCPU, i);
	return HALITE_STREAM(HALITE_STREAM_OTHER, 0);
}

/* Was any page of the block ever populated (present or swapped)? 1, 0 or -errno. */
static int block_touched(struct halite_save *s, const struct sregion *r, uint64_t mb)
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
static int give_back(struct halite_save *s, const struct sregion *r, uint64_t mb, unsigned flags)
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

static bool given_back(const struct halite_save *s, uint64_t mb)
{
	return atomic_load(&s->given[mb / 64]) & (1ull << (mb % 64));
}

/*
 * Take the claim on @mb: true if this thread saves it. Shared memory: the
 * claimer copies the block to the shadow before marking it READY; a thread
 * that lost waits for READY before the block may be given back.
 */
static bool claim_block(struct halite_save *s, uint64_t mb)
{
	uint8_t expect = CLAIM_FREE;

	return atomic_compare_exchange_strong(&s->claim[mb], &expect,
					      s->copy_in ? CLAIM_COPYING : CLAIM_READY);
}

/*
 * One turn of a wait for another thread's short step. The fault thread may
 * be SCHED_FIFO, and sched_yield() then gives the CPU to no ordinary thread:
 * past a few turns it sleeps, so the thread it waits for can run on this
 * CPU even when no other CPU takes it.
 */
static void backoff(unsigned *turns)
{
	struct timespec ts = { 0, 20000 };

	if ((*turns)++ < 16)
		sched_yield();
	else
		nanosleep(&ts, NULL);
}

static void wait_ready(struct halite_save *s, uint64_t mb)
{
	unsigned turns = 0;

	/* The claimer is inside a memcpy of one block: no I/O, no lock. */
	while (atomic_load(&s->claim[mb]) == CLAIM_COPYING)
		backoff(&turns);
}

static size_t item_size(const struct halite_save *s)
{
	return sizeof(struct item) + s->mb_size;
}

/*
 * Items come from a free list filled at create; malloc only when the writer
 * has fallen more than ITEMS_PREALLOC blocks behind.
 */
static struct item *item_new(struct halite_save *s, uint64_t mb, uint32_t stream, bool touched)
{
	struct item *it;

	pthread_mutex_lock(&s->q_lock);
	it = s->free_items;
	if (it) {
		s->free_items = it->next;
		s->nfree--;
	}
	pthread_mutex_unlock(&s->q_lock);
	if (!it)
		it = malloc(item_size(s));
	if (!it)
		return NULL;
	*it = (struct item){ .mb = mb, .stream = stream, .s = s,
			     .kind = touched ? ITEM_DATA : ITEM_UNTOUCHED, .ready = !touched };
	return it;
}

static void item_free(struct halite_save *s, struct item *it)
{
	if (!it)
		return;
	pthread_mutex_lock(&s->q_lock);
	if (s->nfree < ITEMS_PREALLOC) {
		it->next = s->free_items;
		s->free_items = it;
		s->nfree++;
		it = NULL;
	}
	pthread_mutex_unlock(&s->q_lock);
	free(it);
}

/*
 * @len bytes at region offset @off of the file, into @dst, by pread(): a hole
 * reads as zeros and stays a hole (hugetlbfs; shared memory whose file may
 * lose pages, copy_checked()). 0 or -errno.
 */
static int read_huge(const struct sregion *r, uint64_t off, void *dst, uint64_t len)
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
static int read_aside(struct halite_save *s, const struct sregion *r, uint64_t off, void *dst,
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
	int ret = read_huge(r, off, r->shadow + off, s->mb_size);

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
static int copy_claimed(struct halite_save *s, const struct sregion *r, uint64_t mb,
			uint64_t n, int touched)
{
	uint64_t off = (mb - r->first_mb) * s->mb_size;
	int ret = 0;

	if (r->hpage)
		ret = read_huge(r, off, r->shadow + off, n * s->mb_size);
	else if (r->aside && touched > 0)
		ret = read_aside(s, r, off, r->shadow + off, n * s->mb_size);
	else if (r->kind == HALITE_MEM_SHARED && touched > 0 && r->had_data)
		for (uint64_t i = 0; i < n && !ret; i++)
			ret = copy_checked(s, r, mb + i);
	else if (r->kind == HALITE_MEM_SHARED && touched > 0)
		memcpy(r->shadow + off, r->view + off, n * s->mb_size);
	for (uint64_t i = 0; i < n; i++)
		atomic_store(&s->claim[mb + i], CLAIM_READY);
	return ret;
}

/* A SAVED block's snapshot bytes, once the walk cannot read them any more. */
static void release_block(struct halite_save *s, uint64_t mb)
{
	const struct sregion *r = region_of_mb(s, mb);

	if (r->kind == HALITE_MEM_COPY)
		return;
	madvise(r->shadow + (mb - r->first_mb) * s->mb_size, s->mb_size, MADV_DONTNEED);
}

/*
 * An internal invariant: false fails the save with HALITE_E_INTERNAL (and the
 * guest gets its memory back as after any failure). Tests make a check fail
 * on purpose with halite_save_test_fail_check().
 */
#define SAVE_CHECK(s, cond, ...) \
	((cond) && !check_injected(s) ? 0 : sfail(s, -HALITE_E_INTERNAL, __VA_ARGS__))

static bool check_injected(struct halite_save *s)
{
	uint64_t n = atomic_load_explicit(&s->test_check_after, memory_order_relaxed);

	return n && atomic_fetch_sub(&s->test_check_after, 1) == 1;
}

static void compress_task(void *arg);

/* After the wake: allocation is fine from here on. */
static int enqueue(struct halite_save *s, struct item *it)
{
	bool touched = it->kind == ITEM_DATA;

	pthread_mutex_lock(&s->q_lock);
	if (s->q_tail)
		s->q_tail->next = it;
	else
		s->q_head = it;
	s->q_tail = it;
	if (it->ready)
		pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
	if (touched && halite_pool_submit(s->pool, compress_task, it))
		return -ENOMEM; /* the item stays queued, never ready: the save fails */
	return 0;
}

static void compress_task(void *arg)
{
	struct item *it = arg;
	struct halite_save *s = it->s;
	const struct sregion *r = region_of_mb(s, it->mb);
	const uint8_t *src = r->shadow + (it->mb - r->first_mb) * s->mb_size;
	int n;

	if (halite_all_zero(src, s->mb_size)) {
		it->kind = ITEM_ZERO;
	} else {
		n = halite_compress(s->codec, s->o.level, src, s->mb_size, it->buf,
				    s->mb_size - 1);
		if (n > 0) {
			it->len = (uint32_t)n;
			it->compressed = true;
		} else {
			memcpy(it->buf, src, s->mb_size);
			it->len = s->mb_size;
			it->compressed = false;
		}
	}
	pthread_mutex_lock(&s->q_lock);
	it->ready = true;
	if (s->q_head == it)
		pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
}

/* ---- fault thread ---- */

/* A fault answered whose block still has to be queued, once the batch is. */
struct pending {
	uint64_t mb;
	uint32_t stream;
	bool touched;
};

/* After the wake: queue block @mb that a fault in @stream claimed. */
static int queue_faulted(struct halite_save *s, uint64_t mb, uint32_t stream, bool touched)
{
	struct item *it = item_new(s, mb, stream, touched);

	if (!it)
		return sfail(s, -ENOMEM, "memory block %llu: queueing", (unsigned long long)mb);
	if (HALITE_STREAM_KIND(stream) == HALITE_STREAM_VCPU) {
		atomic_fetch_add(&s->n_faults_vcpu, 1);
		atomic_fetch_add(&s->n_faults_by_vcpu[HALITE_STREAM_INDEX(stream)], 1);
	} else {
		atomic_fetch_add(&s->n_faults_other, 1);
	}
	return enqueue(s, it);
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
			e = copy_claimed(s, r, first + i, j - i, 1);
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
	e = give_back(s, r, mb, HALITE_GMEM_ZERO_GONE);
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
		touched = block_touched(s, r, mb);
		ret = copy_claimed(s, r, mb, 1, touched);
		if (touched < 0)
			return sfail(s, touched, "memory block %llu: is it populated?",
				     (unsigned long long)mb);
		if (ret)
			return sfail(s, ret, "memory block %llu: copying it", (unsigned long long)mb);
	} else {
		wait_ready(s, mb);
	}
	/* A page the guest discarded since the snapshot instant reads zero, not its snapshot. */
	ret = give_back(s, r, mb, HALITE_GMEM_ZERO_GONE);
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
			set_failed(s, ret);
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
			set_failed(s, ret);
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

	set_failed(fc->s, sfail(fc->s, err, "reading userfaultfd"));
}

static void *fault_main(void *arg)
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

/* ---- background thread ---- */

static void bg_throttle(struct halite_save *s, uint64_t start_ns, uint64_t saved_bytes)
{
	uint64_t idle_ns = (uint64_t)s->o.bg_idle_us * 1000;

	while (!atomic_load(&s->stopping)) {
		uint64_t now = halite_now_ns();
		uint64_t since_fault = atomic_load(&s->in_fault) ? 0
				       : now - atomic_load(&s->last_fault_ns);
		/* The rate floor: bytes this thread should have saved by now. */
		uint64_t owed = (now - start_ns) / 1000 * (s->o.bg_min_rate / 1000) / 1000;
		struct timespec ts = { 0, 200000 };

		if (since_fault >= idle_ns || saved_bytes < owed)
			return;
		nanosleep(&ts, NULL);
	}
}

/*
 * Claim and save @mb into @stream unless someone has. Anonymous memory is
 * given back now, so the shadow can go at the end; an untouched block stays a
 * hole until the guest wants it. Shared memory is already where it belongs: a
 * later fault only needs UFFDIO_CONTINUE. 0 or -errno.
 */
static int bg_save_block(struct halite_save *s, const struct sregion *r, uint64_t mb,
			 uint32_t stream)
{
	struct item *it;
	int ret, touched;

	if (!claim_block(s, mb))
		return 0;
	halite_defer_mine(&s->defer, mb);
	touched = block_touched(s, r, mb);
	ret = copy_claimed(s, r, mb, 1, touched);
	if (touched < 0)
		ret = touched;
	if (!ret && touched > 0 && r->kind == HALITE_MEM_ANON)
		ret = give_back(s, r, mb, HALITE_GMEM_DONTWAKE);
	it = ret ? NULL : item_new(s, mb, stream, touched > 0);
	if (!ret && !it)
		ret = -ENOMEM;
	if (!ret)
		ret = enqueue(s, it);
	if (ret)
		return sfail(s, ret, "background save of memory block %llu", (unsigned long long)mb);
	atomic_fetch_add(&s->n_bg, 1);
	return 0;
}

#define SZ_2M (1ull << 21)
#define SZ_1G (1ull << 30)

/* A region as the walk sees it, in a copy of the regions sorted by GPA. */
struct walk_region {
	const struct sregion *r;
	uint64_t gpa, end;
	uint64_t max_end; /* the largest end of this region and those before it */
	/*
	 * A bit per 2 MiB and per 1 GiB chunk of GPA (aligned) the region
	 * overlaps, from the one holding @gpa: every block of the region in
	 * that chunk is claimed, and the walk has been through it.
	 */
	uint64_t *done_2m, *done_1g;
};

struct bg {
	struct halite_save *s;
	struct halite_ptw *w;
	struct walk_region *wr;
	uint32_t nwr;
	uint64_t *done; /* the bits of every walk_region */
	uint64_t start_ns, saved;
	int err;
};

/*
 * Throttled, then claim and save @mb into @stream unless someone has: 0, 1
 * when the save is stopping, or -errno.
 */
static int bg_save_next(struct bg *b, const struct sregion *r, uint64_t mb, uint32_t stream)
{
	struct halite_save *s = b->s;
	int ret;

	bg_throttle(s, b->start_ns, b->saved);
	if (atomic_load(&s->stopping))
		return 1;
	ret = bg_save_block(s, r, mb, stream);
	if (!ret)
		b->saved += s->mb_size;
	return ret;
}

static const struct sregion *region_of_gpa(const struct halite_save *s, uint64_t gpa,
					   uint64_t *off)
{
	for (uint32_t i = 0; i < s->nregions; i++) {
		const struct sregion *r = &s->regions[i];

		if (gpa >= r->gpa && gpa - r->gpa < r->length) {
			*off = gpa - r->gpa;
			return r;
		}
	}
	return NULL;
}

/* halite_ptw_read_fn: a page-table page as the snapshot has it. */
static int pt_read(void *ctx, uint64_t gpa, void *page)
{
	struct bg *b = ctx;
	struct halite_save *s = b->s;
	uint64_t off;
	const struct sregion *r = region_of_gpa(s, gpa, &off);
	uint64_t mb;
	int touched;

	if (atomic_load(&s->stopping))
		return -ECANCELED; /* a cancel must not wait for the walk */
	if (!r || r->length - off < 4096)
		return -ERANGE;
	mb = r->first_mb + off / s->mb_size;
	if (r->kind == HALITE_MEM_SHARED && atomic_load(&s->claim[mb]) == CLAIM_FREE) {
		/*
		 * Unclaimed, the page cache still holds the snapshot: the guest
		 * cannot write a block before someone claims it. Read optimistically
		 * and keep the bytes if the block is still unclaimed afterwards
		 * (as a seqlock reader does); else the claimer's copy is in the
		 * shadow. Reading a hole through the view would populate it.
		 */
		touched = block_touched(s, r, mb);
		if (touched < 0)
			return touched;
		/*
		 * A file that may have lost a page since (had_data): a read through
		 * the view would fill the hole, and hide it from copy_checked().
		 */
		if (r->hpage || (touched && r->had_data)) {
			int ret = read_huge(r, off, page, 4096);

			if (ret)
				return ret;
		} else if (touched) {
			memcpy(page, r->view + off, 4096);
		} else {
			memset(page, 0, 4096);
		}
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load(&s->claim[mb]) == CLAIM_FREE)
			return 0;
	}
	if (r->kind == HALITE_MEM_SHARED) {
		/* A hole claimed stays a hole in the shadow: zeros, as in the snapshot. */
		wait_ready(s, mb);
		memcpy(page, r->shadow + off, 4096);
		return 0;
	}
	/* Anonymous: reading a hole of the shadow would populate it. */
	touched = block_touched(s, r, mb);
	if (touched < 0)
		return touched;
	/* Another process's: the pages it moved aside hold the snapshot, claimed or not. */
	if (touched && r->aside)
		return read_aside(s, r, off, page, 4096);
	if (touched)
		memcpy(page, r->shadow + off, 4096);
	else
		memset(page, 0, 4096);
	return 0;
}

/*
 * The first sorted region that may hold @gpa or anything above it: the
 * first whose max_end passes @gpa. max_end never decreases, so a binary
 * search finds it even if regions overlap (nothing forbids it).
 */
static uint32_t walk_region_first(const struct bg *b, uint64_t gpa)
{
	uint32_t lo = 0, hi = b->nwr;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (b->wr[mid].max_end > gpa)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/* Save the unclaimed blocks of @r that [lo, hi) overlaps, in GPA order. */
static int walk_blocks(struct bg *b, const struct sregion *r, uint64_t lo, uint64_t hi)
{
	struct halite_save *s = b->s;
	uint64_t first = r->first_mb + (lo - r->gpa) / s->mb_size;
	uint64_t last = r->first_mb + (hi - 1 - r->gpa) / s->mb_size;
	int ret = halite_ptw_charge(b->w, last - first + 1);

	if (ret)
		return ret;
	for (uint64_t mb = first; mb <= last; mb++) {
		bool claimed = atomic_load(&s->claim[mb]);

		/* Decided after the throttle's wait, with the faults that came in it. */
		if (!claimed) {
			bg_throttle(s, b->start_ns, b->saved);
			if (atomic_load(&s->stopping))
				return 1;
			claimed = atomic_load(&s->claim[mb]);
		}
		/* Next to a vCPU's work: left for its faults (defer.c). */
		if (halite_defer_walk(&s->defer, mb, claimed) || claimed)
			continue;
		b->err = bg_save_block(s, r, mb, HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0));
		if (b->err)
			return b->err;
		b->saved += s->mb_size;
	}
	return 0;
}

static bool bit_test(const uint64_t *bits, uint64_t i)
{
	return bits[i / 64] >> (i % 64) & 1;
}

static void bit_set(uint64_t *bits, uint64_t i)
{
	bits[i / 64] |= 1ull << (i % 64);
}

/* The part [lo, hi) of region @w in one 2 MiB chunk, unless it is done. */
static int walk_2m(struct bg *b, struct walk_region *w, uint64_t lo, uint64_t hi)
{
	uint64_t c = (lo >> 21) - (w->gpa >> 21);
	int ret;

	if (bit_test(w->done_2m, c))
		return 0;
	ret = walk_blocks(b, w->r, lo, hi);
	if (!ret)
		bit_set(w->done_2m, c);
	return ret;
}

/*
 * The part [lo, hi) of region @w that a 2 MiB or 1 GiB leaf maps. Claims
 * are never undone, so once the walk has been through a chunk it is done
 * for good, and a leaf over a done chunk costs one bit test. Leaves repeat:
 * hostile tables map GPA 0 a million times over, and every process of a
 * Linux guest maps the kernel's direct map with 2 MiB or 1 GiB pages (most
 * share the tables, which the walker skips, but not all).
 */
static int walk_large(struct bg *b, struct walk_region *w, uint64_t lo, uint64_t hi,
		      uint64_t len)
{
	uint64_t c;
	int ret;

	if (len == SZ_2M)
		return walk_2m(b, w, lo, hi);
	c = (lo >> 30) - (w->gpa >> 30);
	if (bit_test(w->done_1g, c))
		return 0;
	ret = halite_ptw_charge(b->w, ((hi - 1) >> 21) - (lo >> 21) + 1);
	for (uint64_t g = lo, next; !ret && g < hi; g = next) {
		next = HALITE_MIN(hi, (g | (SZ_2M - 1)) + 1);
		ret = walk_2m(b, w, g, next);
	}
	if (!ret)
		bit_set(w->done_1g, c);
	return ret;
}

/*
 * halite_ptw_visit_fn: save the blocks behind a mapped leaf, in VA order.
 * The leaf is clipped to the regions it overlaps, so what lies outside guest
 * memory (MMIO, or a hostile entry) costs nothing per block: a leaf outside
 * every region costs a binary search. Large leaves skip what the walk has
 * been through (walk_large()). So the blocks the walk looks at are at most
 * one per 4 KiB leaf, plus every block of memory once (twice when blocks
 * straddle 2 MiB boundaries), plus one per 2 MiB chunk of memory.
 */
static int pt_visit(void *ctx, uint64_t va, uint64_t gpa, uint64_t len)
{
	struct bg *b = ctx;
	uint64_t end = gpa + len; /* no overflow: gpa < 2^52 */
	int ret = 0;

	/* A walk may take a while: a cancel must not wait for it. */
	if (atomic_load(&b->s->stopping))
		return 1;

	for (uint32_t i = walk_region_first(b, gpa); i < b->nwr && b->wr[i].gpa < end && !ret;
	     i++) {
		struct walk_region *w = &b->wr[i];
		uint64_t lo = HALITE_MAX(gpa, w->gpa), hi = HALITE_MIN(end, w->end);

		if (lo >= hi)
			continue;
		if (len > 4096)
			ret = walk_large(b, w, lo, hi, len);
		else
			ret = walk_blocks(b, w->r, lo, hi);
	}
	return ret;
}

/* Aligned 2 MiB and 1 GiB chunks of GPA that @r overlaps. */
static uint64_t chunks_2m(const struct sregion *r)
{
	return ((r->gpa + r->length - 1) >> 21) - (r->gpa >> 21) + 1;
}

static uint64_t chunks_1g(const struct sregion *r)
{
	return ((r->gpa + r->length - 1) >> 30) - (r->gpa >> 30) + 1;
}

static int walk_region_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct walk_region *)a)->gpa, y = ((const struct walk_region *)b)->gpa;

	return x < y ? -1 : x > y;
}

/* The walk's view of the regions: sorted by GPA, with their done bits. 0 or -ENOMEM. */
static int walk_regions(struct halite_save *s, struct bg *b)
{
	uint64_t words = 0;

	b->wr = calloc(s->nregions, sizeof(*b->wr));
	if (!b->wr)
		return -ENOMEM;
	for (uint32_t i = 0; i < s->nregions; i++) {
		const struct sregion *r = &s->regions[i];

		b->wr[i] = (struct walk_region){ .r = r, .gpa = r->gpa, .end = r->gpa + r->length };
		words += chunks_2m(r) / 64 + 1 + chunks_1g(r) / 64 + 1;
	}
	b->done = calloc(words, sizeof(uint64_t));
	if (!b->done)
		return -ENOMEM;
	qsort(b->wr, s->nregions, sizeof(*b->wr), walk_region_cmp);
	words = 0;
	for (uint32_t i = 0; i < s->nregions; i++) {
		struct walk_region *wr = &b->wr[i];

		wr->max_end = HALITE_MAX(wr->end, i ? b->wr[i - 1].max_end : 0);
		wr->done_2m = b->done + words;
		words += chunks_2m(wr->r) / 64 + 1;
		wr->done_1g = b->done + words;
		words += chunks_1g(wr->r) / 64 + 1;
	}
	b->nwr = s->nregions;
	return 0;
}

/* Walk every root known so far, including ones added while walking. */
static int bg_walk(struct halite_save *s, struct bg *b)
{
	struct halite_ptw *w;
	struct timespec cpu0, cpu1;
	uint64_t mem = 0;
	int ret;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
	for (uint32_t i = 0; i < s->nregions; i++)
		mem += s->regions[i].length;
	ret = walk_regions(s, b);
	if (!ret)
		ret = halite_ptw_create(&w, mem);
	if (ret) {
		halite_logf(&s->log, HALITE_LOG_WARN, "no page-table walk: %s", halite_strerror(ret));
		free(b->done);
		free(b->wr);
		return 0;
	}
	/*
	 * The walk's budget, for all roots, those added later included. Every
	 * page of memory a table (512 units each: the walker's own bound on
	 * what it reads) and every block looked at twice: a legitimate guest
	 * stays far below, as its tables are a few percent of its memory at
	 * most. At the 9 ns a unit measured on a guest full of tables
	 * (tests/save/test_save_hostile), that is about 1 ns of CPU per byte
	 * of guest memory, where the default rate floor (64 MiB/s) allows 15.
	 */
	s->walk_end.budget = HALITE_PTW_TABLE_UNITS * (mem / 4096) + 2 * s->mb_total;
	halite_ptw_set_budget(w, s->walk_end.budget);
	b->w = w;
	for (uint32_t i = 0; !atomic_load(&s->stopping); i++) {
		struct halite_root root;

		pthread_mutex_lock(&s->roots_lock);
		if (i >= s->nroots) {
			pthread_mutex_unlock(&s->roots_lock);
			break;
		}
		root = s->roots[i];
		pthread_mutex_unlock(&s->roots_lock);
		s->walk_end.roots = i + 1;
		ret = halite_ptw_walk(w, root.cr3, root.mode, pt_read, pt_visit, b);
		if (b->err || atomic_load(&s->stopping))
			break;
		/*
		 * A walk that fails for another reason (hostile tables the
		 * walker refuses, or too many of them) only loses ordering: the
		 * sweep saves the rest.
		 */
		if (ret == -EDQUOT) {
			struct halite_ptw_stats st;

			halite_ptw_stats(w, &st);
			halite_logf(&s->log, HALITE_LOG_WARN, "page-table walk stopped after %llu "
				    "units of work: hostile or unusual page tables; the rest is "
				    "saved in physical order", (unsigned long long)st.work);
			break;
		}
		if (ret < 0)
			halite_logf(&s->log, HALITE_LOG_WARN, "page-table walk from CR3 0x%llx: %s",
				    (unsigned long long)root.cr3, halite_strerror(ret));
	}
	halite_ptw_stats(w, &s->walk_end.st);
	halite_logf(&s->log, HALITE_LOG_DEBUG, "page-table walk: %llu roots, %llu leaves (4K %llu, "
		    "2M %llu, 1G %llu), %llu of them marked accessed by the guest",
		    (unsigned long long)s->walk_end.roots,
		    (unsigned long long)(s->walk_end.st.leaves_4k + s->walk_end.st.leaves_2m +
					 s->walk_end.st.leaves_1g),
		    (unsigned long long)s->walk_end.st.leaves_4k,
		    (unsigned long long)s->walk_end.st.leaves_2m,
		    (unsigned long long)s->walk_end.st.leaves_1g,
		    (unsigned long long)s->walk_end.st.leaves_accessed);
	halite_ptw_free(w);
	free(b->done);
	free(b->wr);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
	s->walk_end.ns = halite_now_ns() - b->start_ns;
	s->walk_end.cpu_ns = (uint64_t)((cpu1.tv_sec - cpu0.tv_sec) * 1000000000 +
					(cpu1.tv_nsec - cpu0.tv_nsec));
	return b->err;
}

/*
 * The copies, whole, in physical order and unthrottled: the guest never
 * faults on them, and the caller holds their memory until the save is over.
 * Before the walk, which then finds them claimed, so their blocks fill
 * locality blocks of their own at the head of the physical stream (bar the
 * last one, which the sweep fills up). 0 or -errno.
 */
static int save_copies(struct halite_save *s)
{
	for (uint32_t i = 0; i < s->nregions && !atomic_load(&s->stopping); i++) {
		const struct sregion *r = &s->regions[i];

		for (uint64_t mb = r->first_mb; r->kind == HALITE_MEM_COPY &&
						mb < r->first_mb + r->nmb; mb++) {
			int ret = bg_save_block(s, r, mb, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0));

			if (ret)
				return ret;
		}
	}
	return 0;
}

/*
 * After the physical sweep: what the walk deferred (defer.c) and no vCPU
 * has claimed since, in the walk's order, into the guest-virtual stream.
 * 0, or -errno.
 */
static int bg_deferred(struct halite_save *s, struct bg *b)
{
	const struct halite_defer *d = &s->defer;
	struct timespec ts = { 0, 1000000 };
	int ret;

	if (atomic_load(&s->test_hold_deferred)) {
		atomic_store(&s->deferred_held, true);
		while (atomic_load(&s->test_hold_deferred) && !atomic_load(&s->stopping))
			nanosleep(&ts, NULL);
	}
	for (size_t i = 0; i < d->n; i++) {
		uint64_t mb = d->order[i];

		if (atomic_load(&s->claim[mb]))
			continue;
		ret = bg_save_next(b, region_of_mb(s, mb), mb,
				   HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0));
		if (ret)
			return ret < 0 ? ret : 0;
	}
	return 0;
}

/* What no one has claimed, in physical order, but for the walk's deferred. 0 or -errno. */
static int bg_sweep(struct halite_save *s, struct bg *b)
{
	for (uint32_t i = 0; i < s->nregions; i++) {
		const struct sregion *r = &s->regions[i];

		for (uint64_t mb = r->first_mb; mb < r->first_mb + r->nmb; mb++) {
			int ret;

			if (atomic_load(&s->claim[mb]) || halite_defer_is(&s->defer, mb))
				continue;
			ret = bg_save_next(b, r, mb, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0));
			if (ret)
				return ret < 0 ? ret : 0;
		}
	}
	return 0;
}

static void *bg_main(void *arg)
{
	struct halite_save *s = arg;
	struct bg b = { .s = s, .start_ns = halite_now_ns() };
	int ret = halite_defer_init(&s->defer, s->mb_total, s->defer_window);

	if (ret)
		halite_logf(&s->log, HALITE_LOG_WARN, "no deferral next to the vCPUs' faults: %s",
			    halite_strerror(ret));
	ret = save_copies(s);
	if (!ret)
		ret = bg_walk(s, &b);
	s->walk_end.deferred = s->defer.n;
	if (!ret) {
		/* The blocks the writer stored during the walk: their shadow can go. */
		atomic_store(&s->walk_done, true);
		for (uint64_t mb = 0; mb < s->mb_total; mb++)
			if (atomic_load(&s->claim[mb]) == CLAIM_SAVED)
				release_block(s, mb);
		ret = bg_sweep(s, &b);
	}
	if (!ret)
		ret = bg_deferred(s, &b);
	if (ret)
		set_failed(s, ret);
	halite_defer_free(&s->defer);
	return NULL;
}

/* After halite_save_wait(): the background thread has been joined. */
void halite_save_test_walk(struct halite_save *s, struct halite_save_test_walk *out)
{
	*out = s->walk_end;
}

/* ---- writer thread ---- */

static int retire(struct halite_save *s, struct item *it)
{
	int ret;

	/* Claimed once, queued once: a block retires from READY, exactly once. */
	ret = SAVE_CHECK(s, it->mb < s->mb_total && atomic_load(&s->claim[it->mb]) == CLAIM_READY,
			 "memory block %llu retired in claim state %d",
			 (unsigned long long)it->mb,
			 it->mb < s->mb_total ? atomic_load(&s->claim[it->mb]) : -1);
	if (ret)
		return ret;
	switch (it->kind) {
	case ITEM_UNTOUCHED:
		atomic_fetch_add(&s->n_untouched, 1);
		break;
	case ITEM_ZERO:
		ret = halite_writer_put_zero(s->w, it->mb);
		atomic_fetch_add(&s->n_zero, 1);
		break;
	default:
		ret = halite_writer_put_encoded(s->w, it->stream, it->mb, it->buf, it->len,
						it->compressed);
		atomic_fetch_add(&s->n_stored, 1);
		atomic_fetch_add(&s->raw_bytes, s->mb_size);
		atomic_fetch_add(&s->stored_bytes, it->len);
		break;
	}
	if (ret)
		return sfail(s, ret, "saving memory block %llu: %s", (unsigned long long)it->mb,
			     halite_writer_errmsg(s->w));
	atomic_fetch_add(&s->n_saved, 1);
	/* Pairs with bg_main()'s walk_done then SAVED scan: one of us releases. */
	atomic_store(&s->claim[it->mb], CLAIM_SAVED);
	if (it->kind == ITEM_DATA && atomic_load(&s->walk_done))
		release_block(s, it->mb);
	return 0;
}

static int finish_file(struct halite_save *s)
{
	struct halite_save_stats st;
	int ret = 0;

	halite_save_stats(s, &st);
	pthread_mutex_lock(&s->roots_lock);
	for (uint32_t i = 0; i < s->nroots && !ret; i++)
		ret = halite_writer_add_root(s->w, &s->roots[i]);
	pthread_mutex_unlock(&s->roots_lock);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "arm_ns", st.arm_ns);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "faults", st.faults);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "faults_vcpu", st.faults_vcpu);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "faults_other", st.faults_other);
	for (uint32_t i = 0; i < s->o.nvcpus && !ret; i++) {
		char key[32];

		snprintf(key, sizeof(key), "faults_vcpu%u", i);
		ret = halite_writer_set_stat(s->w, key, atomic_load(&s->n_faults_by_vcpu[i]));
	}
	if (!ret)
		ret = halite_writer_set_stat(s->w, "mb_background", st.mb_background);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "fault_p50_ns", st.fault_p50_ns);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "fault_p99_ns", st.fault_p99_ns);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "duration_ns", halite_now_ns() - s->arm_start_ns);
	if (!ret)
		ret = halite_writer_finish(s->w);
	/* The file is named once: most of the writer's sentences name it ("PATH: writing ..."). */
	if (ret && strstr(halite_writer_errmsg(s->w), s->path))
		return sfail(s, ret, "%s", halite_writer_errmsg(s->w));
	if (ret)
		return sfail(s, ret, "finishing %s: %s", s->path, halite_writer_errmsg(s->w));
	{
		struct stat sb;

		if (!stat(s->path, &sb))
			atomic_store(&s->file_bytes, (uint64_t)sb.st_size);
	}
	return 0;
}

static void *writer_main(void *arg)
{
	struct halite_save *s = arg;
	int ret = 0;

	while (atomic_load(&s->n_saved) < s->mb_total) {
		struct item *it;

		pthread_mutex_lock(&s->q_lock);
		while (!atomic_load(&s->stopping) && !(s->q_head && s->q_head->ready))
			pthread_cond_wait(&s->q_cond, &s->q_lock);
		if (atomic_load(&s->stopping)) {
			pthread_mutex_unlock(&s->q_lock);
			return NULL;
		}
		it = s->q_head;
		s->q_head = it->next;
		if (!s->q_head)
			s->q_tail = NULL;
		pthread_mutex_unlock(&s->q_lock);
		ret = retire(s, it);
		item_free(s, it);
		if (ret) {
			set_failed(s, ret);
			return NULL;
		}
	}
	ret = finish_file(s);
	pthread_mutex_lock(&s->st_lock);
	if (ret && s->state == S_RUNNING) {
		s->state = S_FAILED;
		s->error = ret;
	} else if (!ret && s->state == S_RUNNING) {
		s->state = S_DONE;
	}
	s->done_ns = halite_now_ns();
	pthread_cond_broadcast(&s->st_cond);
	pthread_mutex_unlock(&s->st_lock);
	if (ret)
		set_failed(s, ret);
	atomic_store(&s->stopping, true);
	return NULL;
}

/* ---- create, arm, wait, teardown ---- */

/* Our read-only window on a shared region's file, and its shadow. */
static int map_view(struct halite_save *s, struct sregion *r)
{
	struct statfs sf;
	void *v, *sh;

	if (fstatfs(r->fd, &sf))
		return sfail(s, -errno, "region '%s': fstatfs", r->name);
	if (sf.f_type == HUGETLBFS_MAGIC) {
		/* No view: reading a hole through it would allocate a huge page. */
		r->hpage = (uint64_t)sf.f_bsize;
		s->has_huge = true;
		if (r->hpage % s->mb_size || r->host % r->hpage || r->length % r->hpage ||
		    r->fd_off % r->hpage)
			return sfail(s, -EINVAL, "region '%s': on hugetlbfs, host address, length "
				     "and file offset must be multiples of its page size %llu",
				     r->name, (unsigned long long)r->hpage);
	} else {
		char path[64];
		int ro;

		/*
		 * Through a read-only descriptor of the file: an append-only file
		 * (a save or restore refusing discards, halite/src/discard.h)
		 * refuses new shared mappings through a writable one, even
		 * PROT_READ ones, and then a second save would fail here, not say
		 * that the memory is being saved.
		 */
		snprintf(path, sizeof(path), "/proc/self/fd/%d", r->fd);
		ro = open(path, O_RDONLY | O_CLOEXEC);
		v = mmap(NULL, r->length, PROT_READ, MAP_SHARED, ro >= 0 ? ro : r->fd,
			 (off_t)r->fd_off);
		if (ro >= 0)
			close(ro);
		if (v == MAP_FAILED)
			return sfail(s, -errno, "region '%s': mapping its file", r->name);
		r->view = v;
	}
	s->max_page = HALITE_MAX(s->max_page, HALITE_MAX(r->hpage, 4096));
	sh = mmap(NULL, r->length, PROT_READ | PROT_WRITE,
		  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (sh == MAP_FAILED)
		return sfail(s, -errno, "region '%s': a shadow of %llu bytes", r->name,
			     (unsigned long long)r->length);
	r->shadow = sh;
	return 0;
}

/*
 * Our own userfaultfd, or the one created inside the owner (whose copy the
 * owner keeps: if this process dies, the owner's faults then block rather
 * than the ranges losing their registration and reading zeros).
 */
static int open_uffd(struct halite_save *s, uint64_t *missing)
{
	uint64_t want = UFFD_FEATURE_THREAD_ID | HALITE_GMEM_EVENTS;
	int ret;

	/*
	 * Another process's private memory moves aside with an mremap run in
	 * it while the range is registered: with EVENT_REMAP that mremap would
	 * take the registration along and wait for us to read its event. A
	 * move of that memory by the guest is then not followed (QEMU does not
	 * move guest RAM).
	 */
	if (s->ext_anon)
		want &= ~(uint64_t)UFFD_FEATURE_EVENT_REMAP;
	if (s->has_shared)
		want |= UFFD_FEATURE_MINOR_SHMEM | UFFD_FEATURE_MISSING_SHMEM;
	/* hugetlbfs faults report the huge page's address unless asked not to. */
	if (s->has_huge)
		want |= UFFD_FEATURE_MINOR_HUGETLBFS | UFFD_FEATURE_MISSING_HUGETLBFS |
			UFFD_FEATURE_EXACT_ADDRESS;
	if (!s->o.owner_pid) {
		s->uffd = halite_uffd_open(want, missing);
		return s->uffd < 0 ? s->uffd : 0;
	}
	s->uffd = fcntl(s->o.owner_uffd, F_DUPFD_CLOEXEC, 0);
	if (s->uffd < 0)
		return -errno;
	ret = halite_uffd_api(s->uffd, want, missing);
	/* The handshake may only be done once, and is ours to do. */
	return ret == -EINVAL ? -HALITE_E_STATE : ret;
}

static int make_gmem(struct halite_save *s)
{
	struct halite_gmem_region *gr = calloc(s->nregions, sizeof(*gr));
	int ret;

	if (!gr)
		return -ENOMEM;
	for (uint32_t i = 0; i < s->nregions; i++) {
		const struct sregion *r = &s->regions[i];
		bool copy = r->kind == HALITE_MEM_COPY;

		/* A copy is no guest memory of the descriptor's: a placeholder. */
		gr[i] = (struct halite_gmem_region){ copy ? 0 : r->host, copy ? 0 : r->length,
						     (uint32_t)(r->hpage ? r->hpage : 4096),
						     r->kind == HALITE_MEM_SHARED };
	}
	ret = halite_gmem_create(&s->gm, s->uffd, gr, s->nregions);
	free(gr);
	return ret ? sfail(s, ret, "guest memory map (regions overlap?)") : 0;
}

HALITE_EXPORT int halite_save_create(struct halite_save **sp, const char *path,
				     const struct halite_save_region *regions, uint32_t nregions,
				     const struct halite_save_opts *opts)
{
	HALITE_OPTS(halite_writer_opts, wo);
	struct halite_region *wr = NULL;
	struct halite_save *s;
	struct item *it;
	uint64_t missing = 0;
	int ret;

	if (!sp || !path || !regions || !nregions)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->uffd = s->stop_fd = s->pagemap_fd = s->owner_pagemap_fd = -1;
	pthread_mutex_init(&s->q_lock, NULL);
	pthread_cond_init(&s->q_cond, NULL);
	pthread_mutex_init(&s->st_lock, NULL);
	halite_cond_init_mono(&s->st_cond);
	pthread_mutex_init(&s->roots_lock, NULL);
	halite_hist_init(&s->fault_hist);
	ret = halite_opts_copy(&s->o, sizeof(s->o), opts);
	if (ret || (s->o.flags & ~HALITE_SAVE_FLAGS_ALL) || (s->o.nvcpus && !s->o.vcpu_tids)) {
		ret = -EINVAL;
		goto err;
	}
	s->log = (struct halite_logger){ s->o.log, s->o.log_ctx, s->o.log_level };
	s->defer_window = HALITE_SAVE_DEFER_WINDOW;
	if (!s->o.bg_idle_us)
		s->o.bg_idle_us = 2000;
	if (!s->o.bg_min_rate)
		s->o.bg_min_rate = 64ull << 20;
	if (s->o.nvcpus) {
		pid_t *t = malloc(s->o.nvcpus * sizeof(*t));

		if (!t) {
			ret = -ENOMEM;
			goto err;
		}
		memcpy(t, s->o.vcpu_tids, s->o.nvcpus * sizeof(*t));
		s->o.vcpu_tids = t;
	}
	s->path = strdup(path);
	s->regions = calloc(nregions, sizeof(*s->regions));
	wr = calloc(nregions, sizeof(*wr));
	if (!s->path || !s->regions || !wr) {
		ret = -ENOMEM;
		goto err;
	}
	for (uint32_t i = 0; i < nregions; i++)
		s->regions[i].fd = -1; /* so that an early failure closes nothing else */
	s->nregions = nregions;
	for (uint32_t i = 0; i < nregions; i++) {
		wr[i] = (struct halite_region){ regions[i].name, regions[i].gpa, regions[i].length };
		s->regions[i].name = strdup(regions[i].name ? regions[i].name : "");
		s->regions[i].gpa = regions[i].gpa;
		s->regions[i].length = regions[i].length;
		s->regions[i].host = regions[i].host;
		s->regions[i].kind = regions[i].kind;
		s->regions[i].fd = -1;
		if (!s->regions[i].name) {
			ret = -ENOMEM;
			goto err;
		}
		if (regions[i].kind == HALITE_MEM_SHARED) {
			s->has_shared = true;
			s->regions[i].fd_off = regions[i].fd_offset;
			s->regions[i].fd = fcntl(regions[i].fd, F_DUPFD_CLOEXEC, 0);
			if (s->regions[i].fd < 0) {
				ret = sfail(s, -errno, "region '%s': fd %d", regions[i].name,
					    regions[i].fd);
				goto err;
			}
		} else if (regions[i].kind == HALITE_MEM_COPY) {
			if (!regions[i].host) {
				ret = sfail(s, -EINVAL, "region '%s': a copy at address 0",
					    regions[i].name);
				goto err;
			}
		} else if (regions[i].kind != HALITE_MEM_ANON) {
			ret = sfail(s, -EINVAL, "region '%s': unknown memory kind", regions[i].name);
			goto err;
		} else if (s->o.owner_pid) {
			s->ext_anon = true;
		}
	}
	s->copy_in = s->has_shared || s->ext_anon;
	if (s->o.owner_pid && (s->o.owner_uffd < 0 || (s->has_shared && !s->o.drop_ptes) ||
			       (s->ext_anon && (!s->o.remap || !s->o.unmap)))) {
		ret = sfail(s, -EINVAL, "another process's memory needs owner_uffd, drop_ptes "
			    "for shared memory, remap and unmap for private memory");
		goto err;
	}
	if (s->ext_anon) {
		char pm[64];

		snprintf(pm, sizeof(pm), "/proc/%d/pagemap", (int)s->o.owner_pid);
		s->owner_pagemap_fd = open(pm, O_RDONLY | O_CLOEXEC);
		if (s->owner_pagemap_fd < 0) {
			ret = sfail(s, -errno, "%s", pm);
			goto err;
		}
	}
	wo.codec = s->o.codec;
	wo.level = s->o.level;
	wo.mb_pages = s->o.mb_pages;
	wo.lb_size = s->o.lb_size;
	wo.vcpu_count = s->o.nvcpus;
	wo.flags = ((s->o.flags & HALITE_SAVE_NO_SYNC) ? HALITE_WRITER_NO_SYNC : 0) |
		   ((s->o.flags & HALITE_SAVE_DIRECT) ? HALITE_WRITER_DIRECT : 0);
	wo.log = s->o.log;
	wo.log_ctx = s->o.log_ctx;
	wo.log_level = s->o.log_level;
	wo.io_backend = s->o.io_backend;
	wo.queue_depth = s->o.queue_depth;
	ret = halite_writer_create(&s->w, path, wr, nregions, &wo);
	if (ret)
		goto err;
	s->mb_size = halite_writer_mb_size(s->w);
	s->codec = s->o.codec ? s->o.codec : HALITE_CODEC_LZ4;
	s->mb_total = halite_writer_mb_count(s->w);
	for (uint32_t i = 0; i < nregions; i++) {
		struct sregion *r = &s->regions[i];

		/* Blocks are given back whole: regions must hold whole blocks. */
		if (r->length % s->mb_size || r->host % 4096) {
			ret = sfail(s, -EINVAL, "region '%s': length %llu not a multiple of the "
				    "memory-block size %u, or host address not page aligned",
				    r->name, (unsigned long long)r->length, s->mb_size);
			goto err;
		}
		r->first_mb = i ? s->regions[i - 1].first_mb + s->regions[i - 1].nmb : 0;
		r->nmb = r->length / s->mb_size;
		if (r->kind == HALITE_MEM_SHARED) {
			ret = map_view(s, r);
		} else if (r->kind == HALITE_MEM_COPY) {
			r->shadow = (uint8_t *)(uintptr_t)r->host;
		} else if (s->o.owner_pid) {
			/* Claimed blocks are copied here from the owner's pages moved aside. */
			void *sh = mmap(NULL, r->length, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

			if (sh == MAP_FAILED)
				ret = sfail(s, -errno, "region '%s': a shadow of %llu bytes", r->name,
					    (unsigned long long)r->length);
			else
				r->shadow = sh;
		}
		if (ret)
			goto err;
	}
	if (s->mb_size / 4096 > SAVE_PAGES_MAX) {
		ret = sfail(s, -EINVAL, "memory blocks of more than %u pages", SAVE_PAGES_MAX);
		goto err;
	}
	s->claim = calloc(s->mb_total, 1);
	s->given = calloc(s->mb_total / 64 + 1, sizeof(*s->given));
	s->n_faults_by_vcpu = calloc(s->o.nvcpus ? s->o.nvcpus : 1, sizeof(*s->n_faults_by_vcpu));
	if (!s->claim || !s->given || !s->n_faults_by_vcpu) {
		ret = -ENOMEM;
		goto err;
	}
	ret = open_uffd(s, &missing);
	if (ret) {
		char names[128];

		ret = sfail(s, ret, "userfaultfd%s%s", missing ? " lacks " : "",
			    missing ? halite_uffd_feature_names(missing, names, sizeof(names)) : "");
		goto err;
	}
	s->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	s->max_page = HALITE_MAX(s->max_page, 4096);
	s->huge_claimed = calloc(s->max_page / s->mb_size + 1, sizeof(bool));
	if (s->stop_fd < 0 || s->pagemap_fd < 0 || !s->huge_claimed) {
		ret = sfail(s, -errno, "eventfd or /proc/self/pagemap");
		goto err;
	}
	ret = make_gmem(s);
	if (ret)
		goto err;
	for (uint32_t i = 0; i < ITEMS_PREALLOC; i++) {
		it = malloc(item_size(s));
		if (!it) {
			ret = -ENOMEM;
			goto err;
		}
		it->next = s->free_items;
		s->free_items = it;
		s->nfree++;
	}
	ret = halite_pool_create(&s->pool, s->o.workers, "halite-save");
	if (ret)
		goto err;
	free(wr);
	*sp = s;
	return 0;
err:
	free(wr);
	halite_save_free(s);
	return ret;
}

HALITE_EXPORT int halite_save_add_root(struct halite_save *s, const struct halite_root *root)
{
	int ret = 0;

	if (root->mode != HALITE_PAGING_4LEVEL && root->mode != HALITE_PAGING_5LEVEL)
		return -EINVAL;
	if (root->vcpu >= s->o.nvcpus && root->vcpu != HALITE_VCPU_UNKNOWN)
		return -EINVAL;
	pthread_mutex_lock(&s->roots_lock);
	for (uint32_t i = 0; i < s->nroots; i++)
		if (s->roots[i].cr3 == root->cr3 && s->roots[i].vcpu == root->vcpu)
			goto out; /* seen before: sampling repeats itself */
	if (s->nroots == s->roots_cap) {
		uint32_t cap = s->roots_cap ? 2 * s->roots_cap : 16;
		void *p = realloc(s->roots, cap * sizeof(*s->roots));

		if (!p) {
			ret = -ENOMEM;
			goto out;
		}
		s->roots = p;
		s->roots_cap = cap;
	}
	s->roots[s->nroots++] = *root;
out:
	pthread_mutex_unlock(&s->roots_lock);
	return ret;
}

HALITE_EXPORT int halite_save_set_device_state(struct halite_save *s, const void *data,
					       uint64_t len)
{
	if (s->state != S_CREATED)
		return -HALITE_E_STATE;
	return halite_writer_set_device_state(s->w, data, len);
}

HALITE_EXPORT int halite_save_set_meta(struct halite_save *s, const char *key, const void *value,
				       uint32_t len)
{
	if (s->state != S_CREATED)
		return -HALITE_E_STATE;
	return halite_writer_set_meta(s->w, key, value, len);
}

/* Undo arming of regions [0, n): their pages go back where they were. */
/* The regions' files may lose pages again. */
static void allow_discards(struct halite_save *s)
{
	for (uint32_t i = 0; i < s->nregions; i++)
		halite_discard_release(s->regions[i].fd, &s->regions[i].discards_refused, &s->log,
				       s->regions[i].name);
}

/*
 * Shared memory, at the snapshot instant: a hole punched in the file before
 * a block is saved would lose the block (halite/src/discard.h), so the file
 * refuses punches until the save ends. Where it cannot, the pages holding
 * data now are noted, and copy_checked() holds every block to them.
 * hugetlbfs can do neither (no file flags, no SEEK_DATA): said once.
 */
static int guard_discards(struct halite_save *s, struct sregion *r)
{
	int ret;

	ret = s->test_no_refusal ? -EPERM : halite_discard_refuse(r->fd, &r->discards_refused);
	if (!ret)
		return 0;
	if (r->hpage) {
		halite_logf(&s->log, HALITE_LOG_WARN, "region '%s' (hugetlbfs): a hole punched in "
			    "its file during the save (a balloon or virtio-mem discard) can be "
			    "neither refused nor seen: its blocks not yet saved would be saved as "
			    "zeros", r->name);
		return 0;
	}
	halite_logf(&s->log, HALITE_LOG_INFO, "region '%s': its file cannot refuse hole punches "
		    "(%s): each block is checked against what the file held at the snapshot "
		    "instant instead", r->name, strerror(-ret));
	r->had_data = calloc(r->length / 4096 / 64 + 1, sizeof(*r->had_data));
	if (!r->had_data)
		return sfail(s, -ENOMEM, "region '%s': a bitmap of its pages", r->name);
	ret = halite_file_data_pages(r->fd, r->fd_off, r->length, 4096, r->had_data);
	return ret ? sfail(s, ret, "region '%s': which pages hold data (SEEK_DATA)", r->name) : 0;
}

static void disarm_regions(struct halite_save *s, uint32_t n)
{
	allow_discards(s);
	for (uint32_t i = 0; i < n; i++) {
		struct sregion *r = &s->regions[i];

		if (r->registered) {
			struct uffdio_range rg = { r->host, r->length };

			ioctl(s->uffd, UFFDIO_UNREGISTER, &rg);
			r->registered = false;
		}
		if (r->aside) {
			/* Another process's: its pages go back inside it, over the empty range. */
			uint64_t res;
			int ret = s->o.remap(s->o.drop_ctx, r->aside, r->length, r->host, &res);

			if (ret)
				halite_logf(&s->log, HALITE_LOG_ERROR, "region '%s': moving process %d's "
					    "pages back from 0x%llx: %s; they are still there", r->name,
					    (int)s->o.owner_pid, (unsigned long long)r->aside,
					    strerror(-ret));
			else
				r->aside = 0;
		} else if (r->shadow && r->kind == HALITE_MEM_ANON && !s->o.owner_pid) {
			/* Nothing was touched yet: move the pages straight back. */
			mremap(r->shadow, r->length, r->length, MREMAP_MAYMOVE | MREMAP_FIXED,
			       (void *)(uintptr_t)r->host);
			r->shadow = NULL;
		}
	}
}

static int arm_region(struct halite_save *s, struct sregion *r)
{
	bool shared = r->kind == HALITE_MEM_SHARED;
	struct uffdio_register reg = {
		.range = { r->host, r->length },
		.mode = shared ? UFFDIO_REGISTER_MODE_MINOR | UFFDIO_REGISTER_MODE_MISSING
			       : UFFDIO_REGISTER_MODE_MISSING,
	};
	uint64_t need = 1ull << (shared ? _UFFDIO_CONTINUE : _UFFDIO_COPY);
	struct uffdio_range rg = { r->host, r->length };
	int ret;

	/* A copy: nobody else writes it, nothing to trap. */
	if (r->kind == HALITE_MEM_COPY) {
		atomic_store_explicit(&r->armed, true, memory_order_release);
		return 0;
	}
	/*
	 * Memory another userfaultfd has (a save or a restore of it running)
	 * is refused here, before anything changes: registering says EBUSY.
	 * Then unregistered again until the region is ready: private memory's
	 * registration would follow its pages to the shadow (EVENT_REMAP), and
	 * shared memory would fault before its discard guard is in place. The
	 * guest is paused: nothing faults in between.
	 */
	if (ioctl(s->uffd, UFFDIO_REGISTER, &reg)) {
		if (errno == EBUSY)
			return sfail(s, -EBUSY, "region '%s' is already registered with another "
				     "userfaultfd: a save or restore of this memory is running",
				     r->name);
		return sfail(s, -errno, "region '%s': UFFDIO_REGISTER%s", r->name,
			     shared ? " MINOR|MISSING (shared memory on tmpfs/memfd?)" : "");
	}
	r->registered = true;
	if (!shared && s->o.owner_pid) {
		/*
		 * Another process's private memory: its pages move aside inside it
		 * while the range stays registered, so that any access from now on
		 * faults to us rather than finding a fresh zero page in the gap.
		 * Without EVENT_REMAP (open_uffd()) the registration stays with the
		 * range and the mremap does not wait for us.
		 */
		uint64_t aside = 0;
		int ret2 = s->o.remap(s->o.drop_ctx, r->host, r->length, 0, &aside);

		if (ret2 || !aside)
			return sfail(s, ret2 ? ret2 : -EIO, "region '%s': moving the owner's pages "
				     "aside (mremap MREMAP_DONTUNMAP inside process %d)", r->name,
				     (int)s->o.owner_pid);
		r->aside = aside;
		atomic_store_explicit(&r->armed, true, memory_order_release);
		goto registered;
	}
	if (ioctl(s->uffd, UFFDIO_UNREGISTER, &rg))
		return sfail(s, -errno, "region '%s': UFFDIO_UNREGISTER", r->name);
	r->registered = false;
	if (!shared) {
		/*
		 * glibc's mremap() passes a fifth argument whether or not there is
		 * one, and with MREMAP_DONTUNMAP this kernel refuses an unaligned
		 * new_address even without MREMAP_FIXED: leaving it out fails with
		 * EINVAL depending on what a register happens to hold.
		 */
		void *sh = mremap((void *)(uintptr_t)r->host, r->length, r->length,
				  MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);

		if (sh == MAP_FAILED)
			return sfail(s, -errno, "region '%s': mremap(MREMAP_DONTUNMAP) (private "
				     "anonymous memory in one mapping is required)", r->name);
		r->shadow = sh;
	} else {
		ret = guard_discards(s, r);
		if (ret)
			return ret;
	}
	/* What the fault thread reads of the region, published to it (serve_fault()). */
	atomic_store_explicit(&r->armed, true, memory_order_release);
	if (ioctl(s->uffd, UFFDIO_REGISTER, &reg))
		return sfail(s, -errno, "region '%s': UFFDIO_REGISTER", r->name);
	r->registered = true;
registered:
	if ((reg.ioctls & need) != need)
		return sfail(s, -HALITE_E_UNSUPPORTED, "region '%s': no UFFDIO_%s", r->name,
			     shared ? "CONTINUE" : "COPY");
	if (!shared)
		return 0;
	/*
	 * Registered first, then the owner's page-table entries go: from here
	 * every access, read or write, faults. The data stays in the file.
	 */
	if (s->o.owner_pid)
		ret = s->o.drop_ptes(s->o.drop_ctx, r->host, r->length);
	else
		ret = madvise((void *)(uintptr_t)r->host, r->length, MADV_DONTNEED) ? -errno : 0;
	if (ret)
		return sfail(s, ret, "region '%s': dropping the owner's page-table entries",
			     r->name);
	return 0;
}

HALITE_EXPORT int halite_save_arm(struct halite_save *s)
{
	int ret = 0;
	uint32_t i;

	if (s->state != S_CREATED)
		return -HALITE_E_STATE;
	s->arm_start_ns = halite_now_ns();
	/*
	 * The fault thread first: dropping the owner's page-table entries of a
	 * registered range raises a REMOVE event, and the madvise waits until
	 * someone reads it.
	 */
	ret = pthread_create(&s->fault_thr, NULL, fault_main, s);
	if (ret)
		return sfail(s, -ret, "starting the fault thread");
	for (i = 0; i < s->nregions && !ret; i++)
		ret = arm_region(s, &s->regions[i]);
	if (!ret) {
		atomic_store(&s->last_fault_ns, halite_now_ns());
		s->state = S_RUNNING;
		ret = -pthread_create(&s->writer_thr, NULL, writer_main, s);
		if (ret) {
			s->state = S_CREATED;
			sfail(s, ret, "starting threads");
		}
	}
	atomic_store(&s->arm_over, true);
	if (ret) {
		/* Nothing was given to the guest yet: the pages go straight back. */
		disarm_regions(s, i);
		eventfd_write(s->stop_fd, 2);
		pthread_join(s->fault_thr, NULL);
		return ret;
	}
	s->threads_started = true;
	/* No background thread to save the copies: they are saved here (tests). */
	if ((s->o.flags & HALITE_SAVE_NO_BACKGROUND) && (ret = save_copies(s))) {
		set_failed(s, ret);
		return halite_save_wait(s, -1);
	}
	if (!(s->o.flags & HALITE_SAVE_NO_BACKGROUND)) {
		ret = pthread_create(&s->bg_thr, NULL, bg_main, s);
		if (ret) {
			set_failed(s, sfail(s, -ret, "starting the background thread"));
			return halite_save_wait(s, -1);
		}
		s->bg_started = true;
	}
	/*
	 * All of it, thread starts included: the guest stands still until this
	 * returns. Under st_lock: the threads may already read stats.
	 */
	pthread_mutex_lock(&s->st_lock);
	s->arm_ns = halite_now_ns() - s->arm_start_ns;
	pthread_mutex_unlock(&s->st_lock);
	return 0;
}

/*
 * Another process's private memory, at the end: block @mb's snapshot bytes
 * into our shadow, from the pages moved aside, unless someone has (claimed
 * it). 0 or -errno.
 */
static int ensure_local(struct halite_save *s, const struct sregion *r, uint64_t mb)
{
	int t;

	if (!r->aside)
		return 0;
	if (!claim_block(s, mb)) {
		wait_ready(s, mb);
		return 0;
	}
	t = block_touched(s, r, mb);
	return t < 0 ? t : copy_claimed(s, r, mb, 1, t);
}

/*
 * The end, success or failure: make every block the guest's again, then drop
 * the registration and the shadows. On failure the file is left incomplete.
 */
static int teardown(struct halite_save *s)
{
	int ret = 0, e;

	if (!s->threads_started)
		return 0;
	atomic_store(&s->stopping, true);
	pthread_mutex_lock(&s->q_lock);
	pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
	if (s->bg_started)
		pthread_join(s->bg_thr, NULL);
	s->bg_started = false;
	pthread_join(s->writer_thr, NULL);
	/*
	 * Every block that has snapshot bytes in the shadow and is not yet the
	 * guest's goes back now, claimed or not: after a failure this is what
	 * leaves the guest's memory exactly as without the save. The fault
	 * thread keeps serving meanwhile.
	 */
	for (uint32_t i = 0; i < s->nregions; i++) {
		struct sregion *r = &s->regions[i];

		/* Shared memory never left the page cache: nothing to give back. */
		for (uint64_t mb = r->first_mb; r->kind == HALITE_MEM_ANON &&
						mb < r->first_mb + r->nmb && r->shadow; mb++) {
			int t = given_back(s, mb) ? 0 : ensure_local(s, r, mb);
			int g;

			if (!t && !given_back(s, mb))
				t = block_touched(s, r, mb);
			g = t > 0 ? give_back(s, r, mb, 0) : t;

			if (g && !ret)
				ret = sfail(s, g, "giving memory block %llu back at teardown",
					    (unsigned long long)mb);
		}
	}
	/* Where the memory is now (moves included); unregistering wakes its waiters. */
	e = halite_gmem_unregister(s->gm);
	if (e && !ret)
		ret = sfail(s, e, "UFFDIO_UNREGISTER");
	for (uint32_t i = 0; i < s->nregions; i++)
		s->regions[i].registered = false;
	allow_discards(s);
	eventfd_write(s->stop_fd, 2);
	pthread_join(s->fault_thr, NULL);
	/* Every block is the guest's again: the owner's pages moved aside can go. */
	for (uint32_t i = 0; i < s->nregions; i++) {
		struct sregion *r = &s->regions[i];

		if (r->aside && !ret) {
			e = s->o.unmap(s->o.drop_ctx, r->aside, r->length);
			if (e)
				ret = sfail(s, e, "region '%s': unmapping the pages moved aside in "
					    "process %d", r->name, (int)s->o.owner_pid);
			else
				r->aside = 0;
		}
	}
	/* Only now has the last task been queued: tasks read the shadows. */
	halite_pool_wait(s->pool);
	for (uint32_t i = 0; i < s->nregions; i++) {
		if (s->regions[i].shadow && s->regions[i].kind != HALITE_MEM_COPY)
			munmap(s->regions[i].shadow, s->regions[i].length);
		s->regions[i].shadow = NULL;
	}
	s->threads_started = false;
	return ret;
}

HALITE_EXPORT int halite_save_wait(struct halite_save *s, int timeout_ms)
{
	struct timespec dl;
	int ret = 0, state;

	if (timeout_ms >= 0)
		halite_deadline(&dl, (uint64_t)timeout_ms * 1000000);
	pthread_mutex_lock(&s->st_lock);
	if (s->state == S_CREATED) {
		pthread_mutex_unlock(&s->st_lock);
		return -HALITE_E_STATE;
	}
	while (s->state == S_RUNNING && ret != ETIMEDOUT)
		ret = timeout_ms < 0 ? pthread_cond_wait(&s->st_cond, &s->st_lock)
				     : pthread_cond_timedwait(&s->st_cond, &s->st_lock, &dl);
	state = s->state;
	pthread_mutex_unlock(&s->st_lock);
	if (state == S_RUNNING)
		return -ETIMEDOUT;
	ret = teardown(s);
	if (state == S_FAILED)
		return s->error;
	return ret;
}

HALITE_EXPORT int halite_save_cancel(struct halite_save *s)
{
	if (s->state == S_CREATED)
		return -HALITE_E_STATE;
	set_failed(s, sfail(s, -ECANCELED, "save cancelled"));
	return halite_save_wait(s, -1);
}

HALITE_EXPORT void halite_save_stats(struct halite_save *s, struct halite_save_stats *st)
{
	pthread_mutex_lock(&s->st_lock);
	*st = (struct halite_save_stats){
		.arm_ns = s->arm_ns,
		.duration_ns = s->done_ns ? s->done_ns - s->arm_start_ns
			       : s->arm_start_ns ? halite_now_ns() - s->arm_start_ns : 0,
		.mb_total = s->mb_total,
		.done = s->state == S_DONE,
		.error = s->state == S_FAILED ? s->error : 0,
	};
	pthread_mutex_unlock(&s->st_lock);
	st->mb_saved = atomic_load(&s->n_saved);
	st->mb_stored = atomic_load(&s->n_stored);
	st->mb_zero = atomic_load(&s->n_zero);
	st->mb_untouched = atomic_load(&s->n_untouched);
	st->faults = atomic_load(&s->n_faults);
	st->faults_vcpu = atomic_load(&s->n_faults_vcpu);
	st->faults_other = atomic_load(&s->n_faults_other);
	st->mb_background = atomic_load(&s->n_bg);
	st->raw_bytes = atomic_load(&s->raw_bytes);
	st->stored_bytes = atomic_load(&s->stored_bytes);
	st->file_bytes = atomic_load(&s->file_bytes);
	/* Quantiles of a histogram other threads add to are approximate until done. */
	st->fault_p50_ns = halite_hist_quantile(&s->fault_hist, 0.5);
	st->fault_p99_ns = halite_hist_quantile(&s->fault_hist, 0.99);
	st->fault_max_ns = halite_hist_quantile(&s->fault_hist, 1.0);
	st->fault_realtime = atomic_load(&s->fault_rt);
}

HALITE_EXPORT void halite_save_free(struct halite_save *s)
{
	struct item *it;

	if (!s)
		return;
	if (s->threads_started) {
		if (s->state == S_RUNNING)
			set_failed(s, sfail(s, -ECANCELED, "save freed while running"));
		teardown(s);
	}
	halite_pool_free(s->pool);
	while ((it = s->q_head)) {
		s->q_head = it->next;
		free(it);
	}
	while ((it = s->free_items)) {
		s->free_items = it->next;
		free(it);
	}
	if (s->w)
		halite_writer_free(s->w, s->state != S_DONE &&
					 !(s->o.flags & HALITE_SAVE_KEEP_INCOMPLETE));
	if (s->regions)
		allow_discards(s);
	for (uint32_t i = 0; s->regions && i < s->nregions; i++) {
		struct sregion *r = &s->regions[i];

		free(r->had_data);
		if (r->view)
			munmap(r->view, r->length);
		if (r->shadow && r->kind != HALITE_MEM_COPY)
			munmap(r->shadow, r->length);
		if (r->fd >= 0)
			close(r->fd);
		free(r->name);
	}
	halite_gmem_free(s->gm);
	free(s->huge_claimed);
	if (s->uffd >= 0)
		close(s->uffd);
	if (s->stop_fd >= 0)
		close(s->stop_fd);
	if (s->pagemap_fd >= 0)
		close(s->pagemap_fd);
	if (s->owner_pagemap_fd >= 0)
		close(s->owner_pagemap_fd);
	free((void *)s->o.vcpu_tids);
	free(s->regions);
	free((void *)s->claim);
	free((void *)s->given);
	free((void *)s->n_faults_by_vcpu);
	free(s->roots);
	free(s->path);
	pthread_mutex_destroy(&s->q_lock);
	pthread_cond_destroy(&s->q_cond);
	pthread_mutex_destroy(&s->st_lock);
	pthread_cond_destroy(&s->st_cond);
	pthread_mutex_destroy(&s->roots_lock);
	free(s);
}

HALITE_EXPORT const char *halite_save_errmsg(const struct halite_save *s)
{
	return s->errmsg;
}

void halite_save_test_fail_writes(struct halite_save *s, uint64_t after, int err)
{
	halite_writer_test_fail_writes(s->w, after, err);
}

void halite_save_test_fail_check(struct halite_save *s, uint64_t after)
{
	atomic_store(&s->test_check_after, after + 1);
}

void halite_save_test_defer_window(struct halite_save *s, uint32_t window)
{
	s->defer_window = window;
}

void halite_save_test_hold_deferred(struct halite_save *s, bool hold)
{
	atomic_store(&s->test_hold_deferred, hold);
}

bool halite_save_test_deferred_held(struct halite_save *s)
{
	return atomic_load(&s->deferred_held);
}

void halite_save_test_no_discard_refusal(struct halite_save *s)
{
	s->test_no_refusal = true;
}
