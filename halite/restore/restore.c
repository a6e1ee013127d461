/* SPDX-License-Identifier: MIT */
/*
 * Userfaultfd lazy restore engine (include/halite/restore.h).
 *
 * Open reads the file's header, sections and index (halite_reader_open) and
 * allocates one state byte per memory block (MB) and one small record per
 * locality block (LB); nothing is read from the LBs and nothing registered,
 * so open-to-ready costs the same for 1 GiB as for 1 TiB: those arrays are
 * mmap'ed (zalloc.h), their pages appearing only as they are used, and a
 * format 1.1 file's index (MB map, LB table, member lists) is read chunk by
 * chunk as lookups need it (docs/format.md 5.7; the first fault of a chunk
 * pays for it, about 64 KiB read and hashed).
 *
 * MB states (one atomic byte each):
 *   NONE      not installed, nobody working on it
 *   CLAIMED   one thread won the CAS from NONE (or STAGED) and is installing it
 *   INSTALLED in guest memory (UFFDIO_COPY done), or zero-paged
 *   STAGED    TRACK_ACCESS or LEARN (learn.c): decoded into the LB's stage,
 *             not installed
 * A block moves NONE -> CLAIMED -> INSTALLED (or NONE -> STAGED -> CLAIMED ->
 * INSTALLED) exactly once, so exactly one thread installs it and counts it in
 * exactly one of mb_fault / mb_pool / mb_prefetch: the invariant
 * mb_fault + mb_pool + mb_prefetch + mb_zero == mb_total at done is the claim
 * protocol, not bookkeeping. Zero and never-touched blocks are counted in
 * mb_zero from the start: they are never read, and those never faulted stay
 * holes, which read as zeros once the ranges are unregistered.
 *
 * LB states (under r->lk; the byte is atomic so the prefetcher can skip
 * without the lock):
 *   IDLE      not read
 *   READING   one read in flight (a demand reader's or the prefetcher's);
 *             faults on its blocks queue as waiters on the LB
 *   CACHED    verified bytes in memory; @refs counts the threads holding the
 *             buffer (the install task, the lander, the fault thread while it
 *             decodes a cached block). The install task claims every block
 *             still NONE, so when the last reference goes, every block is
 *             installed (or staged): the buffer is freed and the LB is
 *             DONE. When all LBs are DONE the restore finishes.
 *   DONE      all its blocks installed or staged
 *   FAILED    every read failed; the restore has failed
 *
 * Threads:
 * - fault thread: reads userfaultfd messages in batches and never waits for
 *   a device.
 *   Zero or never-touched block: UFFDIO_ZEROPAGE (a write fault gets
 *   UFFDIO_COPY of zeros instead, which saves the copy-on-write fault that
 *   would follow). Stored block: installed or being installed -> wake (see
 *   the wake rules below); staged -> installed from the stage; LB cached ->
 *   decoded from the buffer and installed; LB being read -> the fault waits
 *   for that one read; LB idle -> read by the fault thread itself if all of
 *   it is in the page cache and nobody is queued for the readers (buffered
 *   reads, no added latency: read_cached, RWF_NOWAIT), else handed to the
 *   demand readers.
 * - demand readers (opts.demand_readers): read a whole LB with one read
 *   (halite_reader_read_lb, which verifies the checksum), install the blocks
 *   faults wait for, faulting block first, then pass the rest to the pool.
 *   Stream readahead: a demand read of an LB also queues the next
 *   opts.readahead LBs of its stream (ra_next), which half of the readers
 *   at most read when no demand read is queued. A stream holds what the
 *   guest touched next during the save (a vCPU's accesses, the page-table
 *   walk), so after a demand read the guest is likely to want those next;
 *   they count as prefetched. The prefetcher below works from the front of
 *   the file and holds back while faults come, so without this a vCPU
 *   whose stream is far into the file reads every LB on demand.
 * - install pool (opts.workers): one task per LB decodes and installs (or,
 *   for TRACK_ACCESS demand LBs, stages) every block no fault took.
 * - prefetcher: reads the LBs nobody has read, in file order (the order the
 *   save filled them: the guest's access order), queue_depth reads in flight
 *   on its own halite_io handle, throttled (paper, section 6): it holds back
 *   while faults come (one within prefetch_idle_us), except to keep up
 *   prefetch_min_rate, and while too many LBs wait for the pool. Prefetched
 *   LBs go to the same pool as demand-read ones: decoding is the CPU-heavy
 *   part and parallelizes across workers, while the prefetcher's one job is
 *   keeping reads in flight; one install path serves both.
 *   A relayouted file's hot prefix (its first hot_lbs LBs: what earlier
 *   restores' guests touched first, hot_init()) is read first and not
 *   throttled: those are the LBs the guest is about to fault on, so holding
 *   them back while faults come would turn each into a demand read. It
 *   starts with the fault thread, as the guest resumes, rather than before
 *   start returns: reading it first would delay the resume by the whole
 *   prefix, while the guest's first faults want only part of it and wait
 *   for the read in flight (a fault on an LB being read waits for it). On
 *   the QEMU HTTP guest at 1 ms per read (bench/qemu.py --learn) the first
 *   answer came after 440-620 of its 2370 hot LBs had been read, about a
 *   quarter of the prefix, which took 0.6 s in all.
 *
 * Wake rules. Every UFFDIO_COPY and UFFDIO_ZEROPAGE here wakes (never
 * DONTWAKE). The kernel's wake after a copy is a full barrier plus a look at
 * the wait queues, taking their lock only when some thread waits, and a
 * faulting thread re-checks the page table after queueing itself; so a thread
 * that faulted on a block before its copy completed is woken by that copy,
 * and one that faulted after finds the page. That lets the fault thread leave
 * a fault on a CLAIMED block alone: whoever claimed it will wake it. With
 * DONTWAKE the fault thread would have to mark such blocks and the installer
 * to check the mark after each copy; the saving (no wait-queue walk while
 * other vCPUs wait on other blocks) is a few hundred nanoseconds per block.
 * A fault on an INSTALLED block raced its install (or the guest discarded
 * the page since, MADV_DONTNEED): it gets UFFDIO_ZEROPAGE on that page, which
 * fails with EEXIST in the race (then UFFDIO_WAKE) and gives a discarded page
 * the zeros a discard means, instead of waking the thread into the same fault
 * forever.
 *
 * Every install and wake goes through halite/src/gmem.h, which also reads
 * the userfaultfd's events: a private page the guest discards or any page it
 * unmaps is "gone" from then on (never installed again; a fault on it gets
 * zeros), a range it moves is followed, a block that crosses mappings is
 * installed page by page, a page already there is kept (EEXIST), and an
 * install that finds a page neither mapped nor known gone fails the restore.
 * Installs for a fault fill the block's gone pages with zeros; the pool's
 * leave them missing and wake the block, so its faults come again.
 *
 * Failure: an LB whose read or checksum fails is read again up to
 * read_retries times (its page-cache copy dropped first, so a retry reaches
 * the device); then the restore fails. From then on no LB is published: one
 * that verified before is still installed whole (its install task runs to
 * its end, whatever fails meanwhile), one that lands after is dropped, so
 * each LB is either all in memory or not at all. Faults on memory not in
 * stay blocked (the fault thread no longer installs anything, it only wakes
 * faults on blocks already in), so no thread ever runs on a byte that was
 * not verified. halite_restore_free() of a failed in-process restore makes the
 * regions PROT_NONE before closing the userfaultfd: closing wakes the
 * blocked threads, which then take SIGSEGV instead of reading zeros.
 *
 * Shared memory: while the restore runs, the file of each shared region
 * refuses hole punches (halite/src/discard.h): a discard of a page not yet
 * restored would otherwise be undone by its install, and no event tells.
 *
 * hugetlbfs (huge.c): the guest sees a huge page whole, so its blocks are
 * decoded into the page cache through the engine's own mapping (MB_INSTALLED
 * then means written there, not visible) and the page is mapped for the
 * guest (UFFDIO_CONTINUE) by whoever writes its last block. A fault there
 * queues every LB holding a block of its page; a reader landing an LB
 * writes the blocks of pages a fault waits for before the pool gets the
 * rest. The claims, LB states, threads and counts are the ones above.
 *
 * Learning (HALITE_RESTORE_LEARN, learn.c): until its window ends every LB
 * read is staged, the prefetcher holds back and readahead queues nothing,
 * so each first touch of a block is a fault, which the fault thread records.
 *
 * Taking over (HALITE_RESTORE_ATTACH): the regions are registered again on
 * the owner's descriptor (allowed: the same context), the blocks found in
 * memory are marked installed (attach_scan()), their LBs done, and every
 * region is woken so the faults the dead handler had read come again.
 *
 * Copies (HALITE_MEM_COPY): memory of this process, not registered (a
 * placeholder in gmem keeps the region numbers). Start fills them before
 * any thread runs (fill_copies()): each LB holding one of their stored
 * blocks is read and verified there, its copy blocks decoded straight into
 * the caller's memory, and the LB then lands as a prefetched one, so the
 * pool installs its other blocks and every LB is still read once. Nobody
 * else can hold those LBs yet, so no copy block is left to anyone else.
 *
 * Locks: r->lk (LB states, waiters, the demand queue) and r->st_lock (state,
 * error message) are never held together. Nothing slow happens under lk
 * except writing the trace at the end.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <halite/restore.h>

#include "discard.h"
#include "endian_util.h"
#include "export.h"
#include "fault_loop.h"
#include "gmem.h"
#include "io.h"
#include "log_internal.h"
#include "opts.h"
#include "pool.h"
#include "relayout_meta.h"
#include "restore_int.h"
#include "stats.h"
#include "uffd.h"
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
/* The prefetcher naps this long when held back with nothing in flight (save.c's bg nap). */
#define PREFETCH_NAP_NS 200000L
/* ... and while learning (learn.c), when it cannot run at all until the window ends. */
#define LEARN_NAP_NS 10000000L
/*
 * Prefetched LBs waiting for the pool, at most this many per read in flight:
 * bounds the memory held when reads outrun decoding.
 */
#define PREFETCH_BACKLOG_PER_QD 4u
#define MINCORE_CHUNK_PAGES 65536u
/* Stream readahead: LBs after a demand-read one (0 = this). */
#define READAHEAD_DEFAULT 8u
#define READAHEAD_MAX 64u
/*
 * The hot prefix read first (opts.hot_prefix_max = 0): 256 MiB at 1 GB/s is
 * a quarter of a second of reads running beside the guest's faults. The
 * QEMU HTTP guest, whose verifier re-reads 256 MiB in a loop, touched 149
 * MB of its 186 MB file in a 15 s learning window; a bound well under that
 * would cut what its client's requests touch late in the window.
 */
#define HOT_PREFIX_DEFAULT (256ull << 20)


static void set_errmsg_level(struct halite_restore *r, const char *msg, int level)
{
	bool first;

	pthread_mutex_lock(&r->st_lock);
	first = !r->errmsg[0];
	if (first)
		snprintf(r->errmsg, sizeof(r->errmsg), "%s", msg);
	pthread_mutex_unlock(&r->st_lock);
	/* Once failed, every thread's next install fails too: one error is news. */
	halite_logf(&r->log, first ? level : HALITE_LOG_DEBUG, "%s", msg);
}

static void set_errmsg(struct halite_restore *r, const char *msg)
{
	set_errmsg_level(r, msg, HALITE_LOG_ERROR);
}

int rs_fail(struct halite_restore *r, int err, const char *fmt, ...)
{
	char msg[sizeof(r->errmsg)];
	va_list ap;

	va_start(ap, fmt);
	halite_vformat_error(msg, sizeof(msg), err, fmt, ap);
	va_end(ap);
	set_errmsg(r, msg);
	return err < 0 ? err : -err;
}

static void end_restore(struct halite_restore *r, int err);

void rs_set_failed(struct halite_restore *r, int err)
{
	atomic_store(&r->failed, true);
	end_restore(r, err);
}

static uint64_t since_ready(const struct halite_restore *r)
{
	uint64_t now = halite_now_ns();

	return now > r->ready_at ? now - r->ready_at : 0;
}

const struct rregion *rs_region_of_mb(const struct halite_restore *r, uint64_t mb)
{
	return &r->regions[halite_find_first_mb(r->regions, r->nregions, sizeof(r->regions[0]),
						offsetof(struct rregion, first_mb), mb)];
}

/* Memory block @mb as gmem sees it: its region's index and the offset in it. */
static uint32_t mb_region(const struct halite_restore *r, uint64_t mb, uint64_t *off)
{
	const struct rregion *g = rs_region_of_mb(r, mb);

	*off = (mb - g->first_mb) * r->mb_size;
	return (uint32_t)(g - r->regions);
}

static bool is_vcpu(const struct halite_restore *r, uint32_t tid)
{
	for (uint32_t i = 0; i < r->o.nvcpus; i++)
		if ((uint32_t)r->o.vcpu_tids[i] == tid)
			return true;
	return false;
}

bool rs_claim(struct halite_restore *r, uint64_t mb, uint8_t from)
{
	return atomic_compare_exchange_strong(&r->mb[mb], &from, MB_CLAIMED);
}

/* Is @mb in a hugetlbfs region (installed by huge page, huge.c)? */
static bool mb_huge(const struct halite_restore *r, uint64_t mb)
{
	return r->has_huge && rs_region_of_mb(r, mb)->hpage;
}

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
		k += mbs[i] != fault_mb && !mb_huge(r, mbs[i]);
	return k;
}

/* ---- installs (halite/src/gmem.h) ---- */

/*
 * Fill memory block @mb with a copy of @src, or with zeros (@src NULL), and
 * wake its faults. Page by page where it must be (gmem.h): a page already
 * there is left as it is, a page the guest discarded is left to read zeros
 * (@flags HALITE_GMEM_ZERO_GONE fills it with them: a fault waits on it).
 * 0 or -errno.
 */
static int mb_fill(struct halite_restore *r, uint64_t mb, const uint8_t *src, unsigned flags)
{
	uint64_t off;
	uint32_t ri = mb_region(r, mb, &off);
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
	return halite_gmem_fill(r->gm, ri, off, halite_reader_mb_bytes(r->rd, mb), src,
				src ? HALITE_GMEM_COPY : HALITE_GMEM_ZERO, flags);
}

static int mb_wake(struct halite_restore *r, uint64_t mb)
{
	uint64_t off;
	uint32_t ri = mb_region(r, mb, &off);

	if (r->regions[ri].kind == HALITE_MEM_COPY)
		return 0; /* no thread waits on a copy */
	return halite_gmem_wake(r->gm, ri, off, halite_reader_mb_bytes(r->rd, mb));
}

/* What a failed install says about itself. */
int rs_install_failed(struct halite_restore *r, int ret, uint64_t mb, const char *how)
{
	uint64_t off;
	uint32_t ri = mb_region(r, mb, &off);

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
 * A fault on page @off of region @ri of an installed block: see the wake
 * rules at the top.
 */
static int wake_installed(struct halite_restore *r, uint32_t ri, uint64_t off, bool write)
{
	return halite_gmem_fill(r->gm, ri, off, r->page, NULL, HALITE_GMEM_ZERO,
				HALITE_GMEM_ZERO_GONE | (write ? HALITE_GMEM_WRITE : 0));
}

/*
 * Decode verified block @mb from @lb_buf into @tmp and install it (@flags:
 * mb_fill()). 0 or -errno.
 */
static int install_from_lb(struct halite_restore *r, uint64_t mb, const uint8_t *lb_buf,
			   uint8_t *tmp, unsigned flags)
{
	int ret = halite_reader_decode_mb(r->rd, mb, lb_buf, tmp);

	if (ret)
		return rs_fail(r, ret, "memory block %llu does not decode", ULL(mb));
	ret = mb_fill(r, mb, tmp, flags);
	return ret ? rs_install_failed(r, ret, mb, "UFFDIO_COPY") : 0;
}

/* Counted before the state says so: whoever sees MB_INSTALLED sees the count (finish). */
void rs_installed(struct halite_restore *r, uint64_t mb, int by)
{
	atomic_fetch_add(&r->n_mb[by], 1);
	atomic_store(&r->mb[mb], MB_INSTALLED);
}

void rs_fault_served(struct halite_restore *r, uint64_t t0)
{
	halite_hist_add(&r->hist, halite_now_ns() - t0);
}

/* TRACK_ACCESS: a block read with a demand fault, other than the faulting one, was touched. */
static void count_accessed(struct halite_restore *r, struct rlb *b)
{
	atomic_fetch_add(&b->accessed, 1);
	atomic_fetch_add(&r->n_staged_accessed, 1);
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

/* Install a block claimed from STAGED, from its LB's stage (@flags: mb_fill()). */
int rs_install_staged(struct halite_restore *r, uint64_t lb, uint64_t mb, unsigned flags)
{
	const uint8_t *src = r->lbs[lb].stage + (size_t)member_index(r, lb, mb) * r->mb_size;
	int ret = mb_fill(r, mb, src, flags);

	return ret ? rs_install_failed(r, ret, mb, "UFFDIO_COPY from the stage") : 0;
}

/* Whose count a staged block of @lb goes to: learning stages prefetched LBs' too. */
int rs_staged_by(struct halite_restore *r, uint64_t lb)
{
	int how;

	pthread_mutex_lock(&r->lk);
	how = r->lbs[lb].how;
	pthread_mutex_unlock(&r->lk);
	return how == HOW_DEMAND ? BY_POOL : BY_PREFETCH;
}

/* ---- LB lifetime ---- */

static void finish(struct halite_restore *r);
static void allow_discards(struct halite_restore *r);

static void finish_task(void *arg)
{
	finish(arg);
}

/* Drop a reference to a cached LB; the last one frees its bytes. */
static void lb_release(struct halite_restore *r, uint64_t lb)
{
	struct rlb *b = &r->lbs[lb];
	uint8_t *buf = NULL;

	pthread_mutex_lock(&r->lk);
	if (--b->refs == 0) {
		buf = b->buf;
		b->buf = NULL;
		atomic_store(&b->state, LB_DONE);
	}
	pthread_mutex_unlock(&r->lk);
	if (!buf)
		return;
	halite_reader_free_lb(buf);
	atomic_fetch_sub(&r->lbs_cached, 1);
	/* After a failure some blocks may be left: done then means nothing. */
	if (atomic_fetch_add(&r->lb_done, 1) + 1 == r->lb_total && !atomic_load(&r->failed)) {
		if (halite_pool_submit(r->pool, finish_task, r))
			finish(r);
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

	pthread_mutex_lock(&r->lk);
	by = b->how == HOW_DEMAND ? BY_POOL : BY_PREFETCH;
	stage = (r->track && b->how == HOW_DEMAND) || atomic_load(&r->learning);
	pthread_mutex_unlock(&r->lk);
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
		bool huge = mb_huge(r, mb);

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
			ret = rs_huge_write(r, mb, t->buf, by);
			continue;
		}
		ret = install_from_lb(r, mb, t->buf, tmp, 0);
		if (!ret)
			rs_installed(r, mb, by);
	}
	if (ret)
		rs_set_failed(r, ret);
	halite_io_free(tmp);
	lb_release(r, t->lb);
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
static void lb_landed(struct halite_restore *r, uint64_t lb, uint8_t *buf, int how, uint8_t *tmp)
{
	struct rlb *b = &r->lbs[lb];
	struct waiter *w, *fifo = NULL;
	struct itask *t;
	const uint64_t *mbs;
	uint64_t fault_mb;
	uint32_t n, staged = 0;
	int ret = 0;

	/* After a failure nothing more is published; what was is installed whole. */
	if (atomic_load(&r->failed)) {
		halite_reader_free_lb(buf);
		return;
	}
	halite_reader_lb_members(r->rd, lb, &mbs, &n);
	atomic_fetch_add(&r->lbs_cached, 1);
	pthread_mutex_lock(&r->lk);
	atomic_store(&b->state, LB_CACHED);
	b->buf = buf;
	b->refs = 1;
	b->how = (uint8_t)how;
	b->t_ns = since_ready(r);
	fault_mb = b->fault_mb;
	if (r->track && how == HOW_DEMAND)
		b->staged = staged = lb_stageable(r, lb, fault_mb);
	while ((w = b->waiters)) {
		b->waiters = w->next;
		w->next = fifo;
		fifo = w;
	}
	pthread_mutex_unlock(&r->lk);
	atomic_fetch_add(how == HOW_DEMAND ? &r->n_lb_demand : &r->n_lb_prefetch, 1);
	atomic_fetch_add(&r->n_staged, staged);
	while ((w = fifo)) {
		fifo = w->next;
		if (!ret) {
			if (rs_claim(r, w->mb, MB_NONE)) {
				ret = install_from_lb(r, w->mb, buf, tmp, HALITE_GMEM_ZERO_GONE);
				if (!ret) {
					rs_installed(r, w->mb, BY_FAULT);
					rs_fault_served(r, w->t0);
					if (r->track && how == HOW_DEMAND && w->mb != fault_mb)
						count_accessed(r, b);
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
		if (rs_huge_wanted(r, mbs[i]) && rs_claim(r, mbs[i], MB_NONE))
			ret = rs_huge_write(r, mbs[i], buf, BY_FAULT);
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

/* Every read of @lb failed: the restore fails; its waiters stay blocked. */
static void lb_failed(struct halite_restore *r, uint64_t lb, int err, unsigned reads)
{
	struct halite_lb_info li;
	char msg[sizeof(r->errmsg)];

	pthread_mutex_lock(&r->lk);
	atomic_store(&r->lbs[lb].state, LB_FAILED);
	pthread_mutex_unlock(&r->lk);
	halite_reader_lb_info(r->rd, lb, &li);
	snprintf(msg, sizeof(msg), "locality block %llu at offset %llu: %s after %u read%s",
		 ULL(lb), ULL(li.offset),
		 err == -HALITE_E_LB_CHECKSUM ? "checksum mismatch" : halite_strerror(err), reads,
		 reads == 1 ? "" : "s");
	set_errmsg(r, msg);
	rs_set_failed(r, err);
}

/*
 * Before reading an LB again: drop its page-cache copy (clean pages only),
 * so the retry reaches the device rather than the same cached bytes.
 */
static void lb_retrying(struct halite_restore *r, uint64_t lb, int err, unsigned reads)
{
	struct halite_lb_info li;

	halite_reader_lb_info(r->rd, lb, &li);
	atomic_fetch_add(&r->n_lb_retries, 1);
	halite_logf(&r->log, HALITE_LOG_WARN,
		    "locality block %llu at offset %llu: %s; reading it again (%u of %u)",
		    ULL(lb), ULL(li.offset), halite_strerror(err), reads + 1,
		    r->o.read_retries + 1);
	posix_fadvise(r->fd, (off_t)li.offset, r->lb_size, POSIX_FADV_DONTNEED);
}

/*
 * One LB into @buf, verified, read again up to read_retries times if it
 * fails (each time from the device: lb_retrying()). 0, or the last
 * failure, with *@reads saying how many reads it took.
 */
static int read_lb_retrying(struct halite_restore *r, uint64_t lb, uint8_t *buf, unsigned *reads)
{
	int ret;

	for (*reads = 1;; (*reads)++) {
		ret = halite_reader_read_lb(r->rd, lb, buf);
		if (!ret || ret == -HALITE_E_LB_CHECKSUM)
			atomic_fetch_add(&r->n_bytes_read, r->lb_size);
		if (!ret || *reads > r->o.read_retries || atomic_load(&r->failed))
			return ret;
		lb_retrying(r, lb, ret, *reads);
	}
}

/* ---- demand readers ---- */

/*
 * Under lk. The caller signals q_cond after unlocking: a reader woken under
 * the lock would run, find lk held and sleep again, two context switches
 * on the fault's path (on 2 cores, measured by halite-bench fault).
 */
int rs_queue_push(struct halite_restore *r, uint64_t lb)
{
	if (r->q_len == r->q_cap) {
		size_t cap = r->q_cap ? 2 * r->q_cap : 64;
		uint64_t *q = malloc(cap * sizeof(*q));

		if (!q)
			return -ENOMEM;
		for (size_t i = 0; i < r->q_len; i++)
			q[i] = r->q[(r->q_head + i) % r->q_cap];
		free(r->q);
		r->q = q;
		r->q_cap = cap;
		r->q_head = 0;
	}
	r->q[(r->q_head + r->q_len++) % r->q_cap] = lb;
	return 0;
}

/*
 * Under lk, after a demand read of @lb: the next LBs of its stream, those
 * nobody has read, to be read ahead. They are claimed only when a reader
 * takes them (ra_take), so dropping the oldest of a full queue loses
 * nothing but the hint. Returns how many readers may start on them now: the
 * caller signals q_cond that often once it has unlocked.
 */
size_t rs_ra_push(struct halite_restore *r, uint64_t lb)
{
	/* Learning: nothing comes in unasked (learn.c). */
	if (atomic_load(&r->learning))
		return 0;
	for (unsigned i = 0; i < r->o.readahead && r->ra_next; i++) {
		lb = rs_ra_next(r, lb);
		if (lb == UINT64_MAX)
			break;
		if (atomic_load(&r->lbs[lb].state) != LB_IDLE)
			continue;
		if (r->raq_len == RA_QUEUE) {
			r->raq_head = (r->raq_head + 1) % RA_QUEUE;
			r->raq_len--;
		}
		r->raq[(r->raq_head + r->raq_len++) % RA_QUEUE] = lb;
	}
	return HALITE_MIN(r->raq_len, (size_t)(r->ra_readers - r->ra_busy));
}

/* A reader is through with its readahead read: another may take one. */
static void ra_done(struct halite_restore *r, bool ahead)
{
	bool more;

	if (!ahead)
		return;
	pthread_mutex_lock(&r->lk);
	r->ra_busy--;
	more = r->raq_len > 0;
	pthread_mutex_unlock(&r->lk);
	if (more)
		pthread_cond_signal(&r->q_cond);
}

/*
 * Under lk: an LB to read ahead, now READING, or UINT64_MAX. Readahead
 * takes at most ra_readers readers at a time, so the others stay free for
 * demand reads, which a queued fault is waiting for.
 */
static uint64_t ra_take(struct halite_restore *r)
{
	while (r->raq_len && r->ra_busy < r->ra_readers) {
		uint64_t lb = r->raq[r->raq_head];

		r->raq_head = (r->raq_head + 1) % RA_QUEUE;
		r->raq_len--;
		if (atomic_load(&r->lbs[lb].state) == LB_IDLE) {
			atomic_store(&r->lbs[lb].state, LB_READING);
			r->ra_busy++;
			return lb;
		}
	}
	return UINT64_MAX;
}

static void *reader_main(void *arg)
{
	struct halite_restore *r = arg;
	uint8_t *tmp = halite_io_alloc(r->mb_size);

	pthread_setname_np(pthread_self(), "halite-rread");
	for (;;) {
		uint64_t lb = UINT64_MAX;
		bool ahead = false;
		uint8_t *buf;
		unsigned reads;
		int ret;

		pthread_mutex_lock(&r->lk);
		/* Demand first: a fault waits for it. */
		while (!atomic_load(&r->stopping) && !r->q_len &&
		       (lb = ra_take(r)) == UINT64_MAX)
			pthread_cond_wait(&r->q_cond, &r->lk);
		if (atomic_load(&r->stopping)) {
			if (lb != UINT64_MAX)
				r->ra_busy--; /* left READING: nothing is read any more */
			pthread_mutex_unlock(&r->lk);
			break;
		}
		if (lb != UINT64_MAX) {
			ahead = true;
		} else {
			lb = r->q[r->q_head];
			r->q_head = (r->q_head + 1) % r->q_cap;
			r->q_len--;
		}
		pthread_mutex_unlock(&r->lk);
		if (atomic_load(&r->failed)) {
			ra_done(r, ahead);
			continue;
		}
		buf = tmp ? halite_reader_alloc_lb(r->rd) : NULL;
		if (!buf) {
			ra_done(r, ahead);
			rs_set_failed(r, rs_fail(r, -ENOMEM, "locality block %llu: read buffer", ULL(lb)));
			continue;
		}
		ret = read_lb_retrying(r, lb, buf, &reads);
		ra_done(r, ahead);
		if (ret) {
			halite_reader_free_lb(buf);
			lb_failed(r, lb, ret, reads);
			continue;
		}
		/* Read ahead, it is prefetched: its blocks are the pool's, nobody asked. */
		lb_landed(r, lb, buf, ahead ? HOW_PREFETCH : HOW_DEMAND, tmp);
	}
	halite_io_free(tmp);
	return NULL;
}

/* ---- fault thread ---- */

static void serve_zero(struct halite_restore *r, uint64_t mb, const struct fault *f)
{
	uint64_t t0 = f->t0;
	int ret;

	atomic_fetch_add(&r->n_faults_zero, 1);
	/* Only this thread installs zero blocks: the claim cannot be contended. */
	if (rs_claim(r, mb, MB_NONE)) {
		/* A write would copy-on-write the zero page at once: give it its own. */
		ret = mb_fill(r, mb, NULL, HALITE_GMEM_ZERO_GONE |
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

/*
 * The fault thread reads @lb (READING, its waiters queued) itself when the
 * whole LB is in the page cache: preadv2(RWF_NOWAIT) copies it or fails at
 * once, never waiting for a device. That saves handing the fault to a
 * reader thread and back, the largest cost of a fault on cached data after
 * the copy itself (halite-bench fault). Verified like any read, then landed
 * as a demand read, with readahead queued as the readers' path does. False
 * when not all of it is cached or it does not verify: the readers then read
 * it as usual (retries included; this attempt is not counted). Only for
 * buffered reads with no added latency (inline_reads).
 */
bool rs_read_cached(struct halite_restore *r, uint64_t lb)
{
	struct halite_lb_info li;
	struct iovec iov;
	size_t wake;
	uint8_t *buf = halite_reader_alloc_lb(r->rd);
	ssize_t n;

	if (!buf)
		return false;
	halite_reader_lb_info(r->rd, lb, &li);
	iov = (struct iovec){ buf, r->lb_size };
	n = preadv2(r->fd, &iov, 1, (off_t)li.offset, RWF_NOWAIT);
	if (n != (ssize_t)r->lb_size || halite_reader_verify_lb(r->rd, lb, buf)) {
		halite_reader_free_lb(buf);
		return false;
	}
	atomic_fetch_add(&r->n_bytes_read, r->lb_size);
	pthread_mutex_lock(&r->lk);
	wake = rs_ra_push(r, lb);
	pthread_mutex_unlock(&r->lk);
	while (wake--)
		pthread_cond_signal(&r->q_cond);
	lb_landed(r, lb, buf, HOW_DEMAND, r->fault_tmp);
	return true;
}

static void serve_stored(struct halite_restore *r, uint64_t mb, uint64_t lb,
			 const struct fault *f)
{
	struct rlb *b = &r->lbs[lb];
	uint64_t t0 = f->t0;

	for (;;) {
		uint8_t s = atomic_load(&r->mb[mb]);
		struct waiter *w;
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
				count_accessed(r, b);
			rs_fault_served(r, t0);
			return;
		}
		pthread_mutex_lock(&r->lk);
		switch (atomic_load(&b->state)) {
		case LB_IDLE:
		case LB_READING:
			w = malloc(sizeof(*w));
			if (!w) {
				pthread_mutex_unlock(&r->lk);
				rs_set_failed(r, rs_fail(r, -ENOMEM, "memory block %llu: waiter",
						    ULL(mb)));
				return;
			}
			*w = (struct waiter){ b->waiters, mb, t0 };
			b->waiters = w;
			ret = 0;
			if (atomic_load(&b->state) == LB_IDLE) {
				atomic_store(&b->state, LB_READING);
				b->fault_mb = mb;
				/* Nobody queued ahead: try the page cache first (read_cached). */
				if (r->inline_reads && !r->q_len) {
					pthread_mutex_unlock(&r->lk);
					if (rs_read_cached(r, lb))
						return;
					pthread_mutex_lock(&r->lk);
				}
				ret = rs_queue_push(r, lb);
				if (!ret)
					wake = 1 + rs_ra_push(r, lb);
			}
			pthread_mutex_unlock(&r->lk);
			/* A reader for the demand read, and one per readahead read it may start. */
			while (wake--)
				pthread_cond_signal(&r->q_cond);
			if (ret)
				rs_set_failed(r, rs_fail(r, ret, "locality block %llu: demand queue",
						    ULL(lb)));
			return;
		case LB_CACHED:
			b->refs++;
			buf = b->buf;
			how = b->how;
			fault_mb = b->fault_mb;
			pthread_mutex_unlock(&r->lk);
			if (!rs_claim(r, mb, MB_NONE)) {
				lb_release(r, lb);
				continue; /* the pool took it meanwhile */
			}
			ret = install_from_lb(r, mb, buf, r->fault_tmp, HALITE_GMEM_ZERO_GONE);
			if (!ret) {
				rs_installed(r, mb, BY_FAULT);
				atomic_fetch_add(&r->n_faults_cached, 1);
				if (r->track && how == HOW_DEMAND && mb != fault_mb)
					count_accessed(r, b);
				rs_fault_served(r, t0);
			}
			lb_release(r, lb);
			if (ret)
				rs_set_failed(r, ret);
			return;
		case LB_FAILED:
			pthread_mutex_unlock(&r->lk);
			return; /* the restore has failed: the thread stays blocked */
		default:
			/* DONE: every block was claimed since the load above. */
			s = atomic_load(&r->mb[mb]);
			pthread_mutex_unlock(&r->lk);
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

	if (!halite_gmem_lookup(r->gm, addr, &f.ri, &f.off)) {
		/* Left behind by a move, or read before it: what the mapping holds. */
		ret = halite_gmem_serve_stray(r->gm, m);
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
		if (g->hpage && rs_huge_in(r, mb))
			halite_gmem_wake(r->gm, f.ri, f.off - f.off % g->hpage, g->hpage);
		else if (!g->hpage && atomic_load(&r->mb[mb]) == MB_INSTALLED)
			halite_gmem_wake(r->gm, f.ri, f.off, r->page);
		return;
	}
	atomic_store(&r->last_fault_ns, t0);
	atomic_fetch_add(&r->n_faults, 1);
	if (is_vcpu(r, m->arg.pagefault.feat.ptid))
		atomic_fetch_add(&r->n_faults_vcpu, 1);
	/* A 1.1 file's index chunks come in here on first use; damaged, it fails. */
	ret = halite_reader_mb_lookup(r->rd, mb, &loc);
	if (ret) {
		rs_set_failed(r, rs_fail(r, ret, "memory block %llu: %s", ULL(mb),
					 halite_reader_errmsg(r->rd)));
		return;
	}
	if (r->learn)
		rs_learn_fault(r, mb, loc.state, m->arg.pagefault.feat.ptid, t0);
	if (g->hpage)
		rs_huge_fault(r, mb, &f);
	else if (loc.state != HALITE_MB_STORED)
		serve_zero(r, mb, &f);
	else
		serve_stored(r, mb, loc.lb, &f);
}

static int fault_timeout(void *ctx)
{
	struct halite_restore *r = ctx;

	/* Learning: woken when its window ends (learn.c). */
	return r->learn ? rs_learn_tick(r) : -1;
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

static void *fault_main(void *arg)
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

/* ---- prefetcher ---- */

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
	uint64_t now = halite_now_ns();
	double owed;

	/* Learning: nothing comes in unasked (learn.c). */
	if (atomic_load(&r->learning))
		return true;
	if (atomic_load(&r->lbs_cached) >= (uint64_t)PREFETCH_BACKLOG_PER_QD * r->o.queue_depth)
		return true;
	/* The hot prefix: the guest's faults want these next. */
	if (hot)
		return false;
	if (now - atomic_load(&r->last_fault_ns) >= (uint64_t)r->o.prefetch_idle_us * 1000)
		return false;
	owed = (double)(now - start) * (double)r->o.prefetch_min_rate / 1e9;
	return (double)issued >= owed;
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
		lb_landed(r, s->lb, s->buf, HOW_PREFETCH, tmp);
		s->buf = NULL;
		return true;
	}
	if (s->reads <= r->o.read_retries && !atomic_load(&r->failed)) {
		lb_retrying(r, s->lb, ret, s->reads);
		s->reads++;
		ret = pf_submit(r, s, tag);
		if (!ret)
			return false;
	}
	halite_reader_free_lb(s->buf);
	s->buf = NULL;
	lb_failed(r, s->lb, ret, s->reads);
	return true;
}

static void *prefetch_main(void *arg)
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

/* ---- the end ---- */

static void fill_stats(struct halite_restore *r, struct halite_restore_stats *st)
{
	uint64_t staged, acc, done_ns, ready_at;

	pthread_mutex_lock(&r->st_lock);
	*st = (struct halite_restore_stats){
		.ready_ns = r->ready_ns,
		.done = r->state == S_DONE,
		.error = r->state == S_FAILED ? r->error : 0,
	};
	done_ns = r->done_ns;
	ready_at = r->ready_at;
	pthread_mutex_unlock(&r->st_lock);
	if (ready_at)
		st->duration_ns = (done_ns ? done_ns : halite_now_ns()) - ready_at;
	st->mb_total = r->mb_total;
	st->mb_fault = atomic_load(&r->n_mb[BY_FAULT]);
	st->mb_pool = atomic_load(&r->n_mb[BY_POOL]);
	st->mb_prefetch = atomic_load(&r->n_mb[BY_PREFETCH]);
	st->mb_zero = r->mb_zero;
	st->mb_present = r->n_mb_present;
	if (r->gm) {
		struct halite_gmem_stats gs;

		halite_gmem_stats(r->gm, &gs);
		st->pages_discarded = gs.pages_discarded;
		st->pages_unmapped = gs.pages_unmapped;
	}
	st->faults = atomic_load(&r->n_faults);
	st->faults_cached = atomic_load(&r->n_faults_cached);
	st->faults_zero = atomic_load(&r->n_faults_zero);
	st->faults_vcpu = atomic_load(&r->n_faults_vcpu);
	st->lb_total = r->lb_total;
	st->lb_demand = atomic_load(&r->n_lb_demand);
	st->lb_prefetch = atomic_load(&r->n_lb_prefetch);
	st->lb_hot = atomic_load(&r->n_lb_hot);
	st->lb_retries = atomic_load(&r->n_lb_retries);
	st->bytes_read = atomic_load(&r->n_bytes_read);
	staged = atomic_load(&r->n_staged);
	acc = atomic_load(&r->n_staged_accessed);
	if (r->track) {
		st->mb_staged = staged;
		st->mb_staged_accessed = acc;
	}
	st->vm_access_pct = r->track && staged ? 100.0 * (double)acc / (double)staged : -1.0;
	/* Approximate while faults are still being added; exact once done. */
	st->fault_p50_ns = halite_hist_quantile(&r->hist, 0.5);
	st->fault_p99_ns = halite_hist_quantile(&r->hist, 0.99);
}

/* docs/restore-trace.md. Written to a temporary file, then renamed over @trace_path. */
static int write_trace(struct halite_restore *r, const struct halite_restore_stats *st)
{
	struct trace_out o;
	FILE *f;
	/* Version 2 only when learning: version 1 readers keep reading the rest. */
	int ret = trace_out_begin(&o, r->o.trace_path, r->learn ? 2 : 1, r->fi->uuid);

	if (ret)
		return ret;
	f = o.f;
#define STAT(name) fprintf(f, "stat " #name " %llu\n", ULL(st->name))
	STAT(ready_ns);
	STAT(duration_ns);
	STAT(mb_total);
	STAT(mb_fault);
	STAT(mb_pool);
	STAT(mb_prefetch);
	STAT(mb_zero);
	STAT(faults);
	STAT(faults_cached);
	STAT(faults_zero);
	STAT(faults_vcpu);
	STAT(lb_total);
	STAT(lb_demand);
	STAT(lb_prefetch);
	STAT(lb_retries);
	STAT(bytes_read);
	STAT(mb_staged);
	STAT(mb_staged_accessed);
	fprintf(f, "stat vm_access_pct %.2f\n", st->vm_access_pct);
	STAT(fault_p50_ns);
	STAT(fault_p99_ns);
	fprintf(f, "stat done %d\nstat error %d\n", st->done ? 1 : 0, st->error);
	/* Added later: after the others, which version 1 readers know (they skip this). */
	STAT(lb_hot);
#undef STAT
	pthread_mutex_lock(&r->lk);
	for (uint64_t lb = 0; lb < r->lb_total; lb++) {
		const struct rlb *b = &r->lbs[lb];
		char fmb[24] = "-";

		if (b->how == HOW_NONE)
			continue;
		if (b->how == HOW_DEMAND)
			snprintf(fmb, sizeof(fmb), "%llu", ULL(b->fault_mb));
		fprintf(f, "lb %llu %s %llu %s %u %u\n", ULL(lb),
			b->how == HOW_DEMAND ? "demand" : "prefetch", ULL(b->t_ns), fmb,
			r->track ? b->staged : 0, r->track ? atomic_load(&b->accessed) : 0);
	}
	pthread_mutex_unlock(&r->lk);
	if (r->learn)
		rs_learn_write(r, f);
	return trace_out_end(&o, 0);
}

/*
 * Done (@err 0) or failed: the trace is written before the state changes, so
 * that a caller woken by halite_restore_wait() finds it complete.
 */
static void end_restore(struct halite_restore *r, int err)
{
	struct halite_restore_stats st;
	int ret;

	pthread_mutex_lock(&r->st_lock);
	if (r->ending || r->state != S_RUNNING) {
		pthread_mutex_unlock(&r->st_lock);
		return;
	}
	r->ending = true;
	r->done_ns = halite_now_ns();
	pthread_mutex_unlock(&r->st_lock);
	rs_learn_stop(r, !err);
	if (r->o.trace_path) {
		fill_stats(r, &st);
		st.done = !err;
		st.error = err;
		ret = write_trace(r, &st);
		if (ret)
			halite_logf(&r->log, HALITE_LOG_WARN, "restore trace %s: %s",
				    r->o.trace_path, halite_strerror(ret));
	}
	pthread_mutex_lock(&r->st_lock);
	r->state = err ? S_FAILED : S_DONE;
	r->error = err;
	pthread_cond_broadcast(&r->st_cond);
	pthread_mutex_unlock(&r->st_lock);
	atomic_store(&r->stopping, true);
	pthread_mutex_lock(&r->lk);
	pthread_cond_broadcast(&r->q_cond);
	pthread_mutex_unlock(&r->lk);
	if (!err)
		halite_logf(&r->log, HALITE_LOG_INFO, "restore of %s done in %.1f ms", r->path,
			    (double)(r->done_ns - r->ready_at) / 1e6);
}

/* Every stored block is in: install what is staged, unregister, done. */
static void finish(struct halite_restore *r)
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
				       !atomic_load(&r->failed))
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
	if (atomic_load(&r->failed))
		return;
	atomic_store(&r->ended, true);
	/*
	 * Unregistering (where the memory is now, moves included) wakes every
	 * waiter; holes then read as zeros. Every block is in: the guest may
	 * discard what it likes again.
	 */
	ret = halite_gmem_unregister(r->gm);
	if (ret)
		halite_logf(&r->log, HALITE_LOG_WARN, "UFFDIO_UNREGISTER: %s", strerror(-ret));
	for (uint32_t i = 0; i < r->nregions; i++)
		r->regions[i].registered = false;
	allow_discards(r);
	end_restore(r, 0);
}

/* ---- open, start, wait, free ---- */

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

/*
 * ra_next: each LB's successor in its stream. The writer fills a stream's
 * LBs in order, so in file order each stream's LBs come by rising seq, and
 * a file has a few streams (one per vCPU, virtual, physical, other) that
 * interleave: the successor is a few LBs on. It is looked up when first
 * needed, scanning at most RA_SCAN entries (none found: no readahead, a
 * hint), and kept. Open only allocates (calloc: pages appear as used), so it
 * does not read the whole LB table (a 1.1 file's chunks come in on use).
 */
#define RA_SCAN 256u

static int ra_build(struct halite_restore *r)
{
	if (!r->o.readahead || !r->lb_total)
		return 0;
	r->ra_next = halite_zalloc(r->lb_total * sizeof(*r->ra_next));
	return r->ra_next ? 0 : -ENOMEM;
}

uint64_t rs_ra_next(struct halite_restore *r, uint64_t lb)
{
	struct halite_lb_info li, ln;
	uint64_t next = UINT64_MAX;

	if (r->ra_next[lb])
		return r->ra_next[lb] == UINT64_MAX ? UINT64_MAX : r->ra_next[lb] - 1;
	if (!halite_reader_lb_info(r->rd, lb, &li))
		for (uint64_t k = lb + 1; k < r->lb_total && k <= lb + RA_SCAN; k++)
			if (!halite_reader_lb_info(r->rd, k, &ln) && ln.stream == li.stream) {
				next = k;
				break;
			}
	r->ra_next[lb] = next == UINT64_MAX ? UINT64_MAX : next + 1;
	return next;
}

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

HALITE_EXPORT int halite_restore_open(struct halite_restore **rp, const char *path,
				      const struct halite_restore_region *regions,
				      uint32_t nregions, const struct halite_restore_opts *opts)
{
	HALITE_OPTS(halite_reader_opts, ro);
	HALITE_OPTS(halite_io_opts, io);
	struct halite_restore *r;
	char rerr[256] = "";
	bool want_trace;
	int ret;

	if (!rp || !path || !regions || !nregions)
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->open_ns = halite_now_ns();
	r->uffd = r->stop_fd = r->fd = -1;
	pthread_mutex_init(&r->lk, NULL);
	pthread_cond_init(&r->q_cond, NULL);
	pthread_mutex_init(&r->st_lock, NULL);
	pthread_mutex_init(&r->learn_lk, NULL);
	halite_cond_init_mono(&r->st_cond);
	halite_hist_init(&r->hist);
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
	r->ra_readers = r->o.demand_readers / 2 ? r->o.demand_readers / 2 : 1;
	r->inline_reads = !(r->o.flags & HALITE_RESTORE_DIRECT) && !r->o.read_latency_us;
	if (!r->o.read_retries)
		r->o.read_retries = READ_RETRIES_DEFAULT;
	if (!r->o.prefetch_idle_us)
		r->o.prefetch_idle_us = IDLE_US_DEFAULT;
	if (!r->o.prefetch_min_rate)
		r->o.prefetch_min_rate = MIN_RATE_DEFAULT;
	r->external = r->o.owner_pid != 0;
	r->track = r->o.flags & HALITE_RESTORE_TRACK_ACCESS;
	r->learn = r->o.flags & HALITE_RESTORE_LEARN;
	if (r->o.nvcpus) {
		pid_t *t = malloc(r->o.nvcpus * sizeof(*t));

		if (t)
			memcpy(t, r->o.vcpu_tids, r->o.nvcpus * sizeof(*t));
		r->o.vcpu_tids = t;
	}
	want_trace = r->o.trace_path != NULL;
	if (want_trace)
		r->o.trace_path = strdup(r->o.trace_path);
	r->path = strdup(path);
	if ((r->o.nvcpus && !r->o.vcpu_tids) || (want_trace && !r->o.trace_path) || !r->path) {
		ret = -ENOMEM;
		goto err;
	}

	ro.flags = (r->o.flags & HALITE_RESTORE_DIRECT) ? HALITE_READER_DIRECT : 0;
	ro.read_latency_us = r->o.read_latency_us;
	ro.errbuf = rerr;
	ro.errbuf_len = sizeof(rerr);
	/* No log: LB read failures are reported (and retried) here, once each. */
	ret = halite_reader_open(&r->rd, path, &ro);
	if (ret) {
		/* The reader's message names the reason already. */
		if (rerr[0])
			set_errmsg(r, rerr);
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
	ret = match_regions(r, regions, nregions);
	if (!ret)
		ret = rs_huge_init(r);
	if (ret)
		goto err;
	/* O(1) whatever the memory size (zalloc.h); pages appear as used. */
	r->mb = halite_zalloc(r->mb_total);
	r->lbs = halite_zalloc(r->lb_total * sizeof(*r->lbs));
	r->fault_tmp = halite_io_alloc(r->mb_size);
	r->rd_thr = calloc(r->o.demand_readers, sizeof(*r->rd_thr));
	if (!r->mb || !r->lbs || !r->fault_tmp || !r->rd_thr) {
		ret = -ENOMEM;
		goto err;
	}
	ret = ra_build(r);
	if (!ret)
		ret = rs_learn_init(r);
	if (ret)
		goto err;
	hot_init(r);
	r->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (r->fd < 0) {
		ret = rs_fail(r, -errno, "%s: cannot open", path);
		goto err;
	}
	/*
	 * HALITE_LOCK_PROTOCOL (format.h): while this restore reads the file, a
	 * save refuses to replace it. Advisory: a failure only loses that check.
	 */
	if (flock(r->fd, LOCK_SH | LOCK_NB) && errno != EWOULDBLOCK)
		halite_logf(&r->log, HALITE_LOG_DEBUG, "%s: flock: %s", path, strerror(errno));
	if (!(r->o.flags & HALITE_RESTORE_NO_PREFETCH)) {
		io.backend = r->o.io_backend;
		io.queue_depth = r->o.queue_depth;
		io.flags = (r->o.flags & HALITE_RESTORE_DIRECT) ? HALITE_IO_DIRECT : 0;
		io.read_latency_us = r->o.read_latency_us;
		ret = halite_io_open(&r->pf_io, path, O_RDONLY | O_CLOEXEC, 0, &io);
		if (ret) {
			ret = rs_fail(r, ret, "%s: opening for prefetch reads (%s%s)", path,
				    r->o.io_backend ? halite_io_backend_name(r->o.io_backend)
						    : "default backend",
				    io.flags ? ", O_DIRECT" : "");
			goto err;
		}
	}
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

/*
 * Memory already populated would never fault, and would keep whatever it
 * holds instead of the snapshot: refused. Shared memory: data anywhere in
 * the file range (the page cache, or swap: SEEK_DATA counts both). This
 * process's anonymous memory, and copies (which the engine writes only
 * where the file has data): mincore() sees pages mapped here (the zero
 * page of a read included); a page swapped out is not seen. Another
 * process's anonymous memory: its page tables and swap, through
 * /proc/PID/pagemap (which needs ptrace rights over it).
 */
static int present_pages(struct halite_restore *r, const struct rregion *g, uint64_t *bits);

/* PAGEMAP_SCAN (linux/fs.h since 6.7; Debian 12's headers predate it). */
#ifndef PAGEMAP_SCAN
struct page_region {
	uint64_t start, end, categories;
};

struct pm_scan_arg {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PAGE_IS_PRESENT (1 << 3)
#define PAGE_IS_SWAPPED (1 << 4)
#endif

/*
 * The first page of [@start, @start + @len) of process @pid (0: this one)
 * in a category of @mask (PAGE_IS_*), by PAGEMAP_SCAN, which walks only the
 * page tables there are: an untouched range costs the same at 1 GiB and
 * 64 GiB, where mincore() fills a byte per page (16 MiB at 64 GiB, ~10 ms)
 * and /proc/PID/pagemap reads 8 bytes per page (128 MiB at 64 GiB). 0 none,
 * 1 with *@first, -errno when the kernel cannot (the caller then reads page
 * by page); another process's needs ptrace rights over it.
 */
static int first_present(pid_t pid, uint64_t start, uint64_t len, uint64_t mask, uint64_t *first)
{
	struct page_region reg;
	struct pm_scan_arg a = {
		.size = sizeof(a), .start = start, .end = start + len,
		.vec = (uint64_t)(uintptr_t)&reg, .vec_len = 1, .max_pages = 1,
		.category_anyof_mask = mask, .return_mask = mask,
	};
	char path[64];
	int fd, n;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/pagemap");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = ioctl(fd, PAGEMAP_SCAN, &a);
	n = n < 0 ? -errno : n;
	close(fd);
	if (n > 0)
		*first = reg.start;
	return n < 0 ? n : n > 0;
}

/*
 * The first page of region @g (this process's memory) that is populated,
 * into *@first: 1, 0 none, or the failure. PAGEMAP_SCAN where the kernel has
 * it, else mincore() chunk by chunk.
 */
static int first_populated(struct halite_restore *r, const struct rregion *g, uint64_t *first)
{
	size_t vlen = MINCORE_CHUNK_PAGES;
	unsigned char *vec;
	int ret = first_present(0, g->host, g->length, PAGE_IS_PRESENT, first);

	if (ret >= 0)
		return ret;
	vec = malloc(vlen);
	if (!vec)
		return -ENOMEM;
	ret = 0;
	for (uint64_t off = 0; off < g->length && !ret; off += vlen * r->page) {
		uint64_t len = HALITE_MIN(g->length - off, (uint64_t)vlen * r->page);

		if (mincore((void *)(uintptr_t)(g->host + off), len, vec)) {
			ret = rs_fail(r, -errno, "region '%s': mincore at 0x%llx (is it mapped?)",
				    g->name, ULL(g->host + off));
			break;
		}
		for (uint64_t i = 0; i < len / r->page && !ret; i++) {
			if (vec[i] & 1) {
				*first = g->host + off + i * r->page;
				ret = 1;
			}
		}
	}
	free(vec);
	return ret;
}

/* first_populated() for another process's memory, without PAGEMAP_SCAN. */
static int first_in_pagemap(struct halite_restore *r, const struct rregion *g, uint64_t *first)
{
	uint64_t npages = g->length / r->page;
	uint64_t *bits = calloc(npages / 64 + 1, sizeof(*bits));
	int ret;

	if (!bits)
		return -ENOMEM;
	ret = present_pages(r, g, bits);
	for (uint64_t p = 0; !ret && p < npages; p++)
		if (bits[p / 64] & (1ull << (p % 64))) {
			*first = g->host + p * r->page;
			ret = 1;
		}
	free(bits);
	return ret;
}

static int check_unpopulated(struct halite_restore *r, const struct rregion *g)
{
	uint64_t first = 0;
	int ret;

	if (g->hpage)
		return rs_huge_check_empty(r, g);
	if (g->kind == HALITE_MEM_SHARED) {
		off_t d = lseek(g->fd, (off_t)g->fd_off, SEEK_DATA);

		if (d < 0 && errno != ENXIO)
			return rs_fail(r, -errno, "region '%s': SEEK_DATA in its file", g->name);
		if (d >= 0 && (uint64_t)d < g->fd_off + g->length)
			return rs_fail(r, -EEXIST, "region '%s': its file already holds data at "
				     "offset %llu of the region; a restore needs an empty range (punch "
				     "a hole first)", g->name, ULL((uint64_t)d - g->fd_off));
		return 0;
	}
	if (r->external && g->kind != HALITE_MEM_COPY) {
		/*
		 * Another process's memory: its page tables and swap, by
		 * PAGEMAP_SCAN on its pagemap where the kernel has it (halite-qemu's
		 * path for QEMU's default RAM: the cost of the pages mapped, not of
		 * memory's size), else its pagemap read page by page.
		 */
		ret = first_present(r->o.owner_pid, g->host, g->length,
				    PAGE_IS_PRESENT | PAGE_IS_SWAPPED, &first);
		if (ret < 0)
			ret = first_in_pagemap(r, g, &first);
		if (ret > 0)
			return rs_fail(r, -EEXIST, "region '%s': the page at offset %llu is already "
				       "populated in process %d; a restore needs memory that was never "
				       "touched", g->name, ULL(first - g->host), (int)r->o.owner_pid);
		return ret < 0 ? rs_fail(r, ret, "region '%s': which pages are populated (pagemap)",
					 g->name) : 0;
	}
	ret = first_populated(r, g, &first);
	if (ret > 0)
		return rs_fail(r, -EEXIST, "region '%s': the page at offset %llu is already "
			       "populated; a restore needs mapped memory that was never touched",
			       g->name, ULL(first - g->host));
	return ret;
}

static int open_uffd(struct halite_restore *r)
{
	uint64_t want = UFFD_FEATURE_THREAD_ID | HALITE_GMEM_EVENTS, missing = 0, have = 0;
	char names[128];
	int ret;

	if (r->has_shared)
		want |= UFFD_FEATURE_MISSING_SHMEM;
	/* hugetlbfs faults report the huge page's address unless asked not to. */
	if (r->has_huge)
		want |= UFFD_FEATURE_MISSING_HUGETLBFS | UFFD_FEATURE_MINOR_HUGETLBFS |
			UFFD_FEATURE_EXACT_ADDRESS;
	if (!r->external) {
		r->uffd = halite_uffd_open(want, &missing);
		ret = r->uffd < 0 ? r->uffd : 0;
	} else {
		/*
		 * Our dup of the owner's: the owner keeps its copy, so if this
		 * process dies the owner's faults block rather than the ranges
		 * losing their registration and reading zeros.
		 */
		r->uffd = fcntl(r->o.owner_uffd, F_DUPFD_CLOEXEC, 0);
		if (r->uffd < 0)
			return rs_fail(r, -errno, "owner_uffd %d", r->o.owner_uffd);
		if ((r->o.flags & HALITE_RESTORE_ATTACH) &&
		    halite_uffd_handshaken(r->uffd, &have) == 1) {
			/* The dead handler's handshake stands; it must have asked for ours. */
			missing = want & ~have;
			ret = missing ? -HALITE_E_UNSUPPORTED : 0;
		} else {
			ret = halite_uffd_api(r->uffd, want, &missing);
			/* The handshake may only be done once, and is ours to do. */
			if (ret == -EINVAL)
				ret = -HALITE_E_STATE;
		}
	}
	if (ret)
		return rs_fail(r, ret, "userfaultfd%s%s", missing ? " lacks " : "",
			     missing ? halite_uffd_feature_names(missing, names, sizeof(names)) : "");
	return 0;
}

static int register_region(struct halite_restore *r, struct rregion *g)
{
	struct uffdio_register reg = {
		.range = { g->host, g->length },
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	uint64_t need = 1ull << _UFFDIO_COPY | 1ull << _UFFDIO_ZEROPAGE | 1ull << _UFFDIO_WAKE;

	/*
	 * hugetlbfs: a page being assembled in the page cache faults MINOR
	 * until UFFDIO_CONTINUE shows it (huge.c); no zero page there.
	 */
	if (g->hpage) {
		reg.mode |= UFFDIO_REGISTER_MODE_MINOR;
		need = 1ull << _UFFDIO_COPY | 1ull << _UFFDIO_CONTINUE | 1ull << _UFFDIO_WAKE;
	}
	/* Registering again with the same descriptor (ATTACH) is allowed. */
	if (ioctl(r->uffd, UFFDIO_REGISTER, &reg)) {
		if (errno == EBUSY)
			return rs_fail(r, -EBUSY, "region '%s' is already registered with another "
				     "userfaultfd: a save or restore of this memory is running",
				     g->name);
		return rs_fail(r, -errno, "region '%s': UFFDIO_REGISTER %s (private anonymous "
			     "or shared memfd/tmpfs/hugetlbfs memory?)", g->name,
			     g->hpage ? "MISSING|MINOR" : "MISSING");
	}
	g->registered = true;
	if ((reg.ioctls & need) != need)
		return rs_fail(r, -HALITE_E_UNSUPPORTED, "region '%s': no UFFDIO_COPY and %s on "
			     "this memory", g->name, g->hpage ? "UFFDIO_CONTINUE" : "UFFDIO_ZEROPAGE");
	return 0;
}

static void unregister_all(struct halite_restore *r)
{
	for (uint32_t i = 0; i < r->nregions; i++) {
		struct rregion *g = &r->regions[i];
		struct uffdio_range rg = { g->host, g->length };

		if (g->registered && !ioctl(r->uffd, UFFDIO_UNREGISTER, &rg))
			g->registered = false;
	}
}

/* Shared regions' files refuse hole punches while the restore needs them (discard.h). */
static void refuse_discards(struct halite_restore *r)
{
	for (uint32_t i = 0; i < r->nregions; i++) {
		struct rregion *g = &r->regions[i];
		int ret;

		if (g->kind != HALITE_MEM_SHARED)
			continue;
		if (g->hpage) {
			/* No file flags there: said, not refused (docs/failure-model.md). */
			halite_logf(&r->log, HALITE_LOG_INFO, "region '%s' (hugetlbfs): a hole "
				    "punched in its file during the restore cannot be refused: a huge "
				    "page discarded before it is in would be filled again", g->name);
			continue;
		}
		ret = halite_discard_refuse(g->fd, &g->discards_refused);
		if (ret)
			halite_logf(&r->log, HALITE_LOG_WARN, "region '%s': its file cannot refuse "
				    "hole punches (%s): a discard (balloon, virtio-mem) of a page "
				    "not yet restored would be filled again by the restore", g->name,
				    strerror(-ret));
	}
}

static void allow_discards(struct halite_restore *r)
{
	for (uint32_t i = 0; i < r->nregions; i++)
		halite_discard_release(r->regions[i].fd, &r->regions[i].discards_refused, &r->log,
				       r->regions[i].name);
}

/*
 * ATTACH: which pages are in already, one bit per page of @g into @bits.
 * Shared memory: what its file holds. Private memory and hugetlbfs (whose
 * page cache may hold pages being assembled, huge.c): what the owner's page
 * tables or swap hold (/proc/PID/pagemap).
 */
#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)

static int present_pages(struct halite_restore *r, const struct rregion *g, uint64_t *bits)
{
	uint64_t npages = g->length / r->page;
	char path[64];
	int fd, ret = 0;

	if (g->kind == HALITE_MEM_SHARED && !g->hpage)
		return halite_file_data_pages(g->fd, g->fd_off, g->length, r->page, bits);
	snprintf(path, sizeof(path), "/proc/%d/pagemap", r->external ? (int)r->o.owner_pid :
		 (int)getpid());
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (uint64_t p = 0; p < npages && !ret;) {
		uint64_t e[512];
		uint64_t n = HALITE_MIN(npages - p, (uint64_t)HALITE_ARRAY_SIZE(e));
		ssize_t got = pread(fd, e, n * sizeof(e[0]),
				    (off_t)((g->host / r->page + p) * sizeof(e[0])));

		if (got != (ssize_t)(n * sizeof(e[0]))) {
			ret = got < 0 ? -errno : -EIO;
			break;
		}
		for (uint64_t i = 0; i < n; i++, p++)
			if (e[i] & (PM_PRESENT | PM_SWAPPED))
				bits[p / 64] |= 1ull << (p % 64);
	}
	close(fd);
	return ret;
}

/*
 * ATTACH: a stored block all of whose pages are in is installed (mb_present);
 * an LB all of whose blocks are is done. A block partly in is installed
 * again later, page by page: the pages there are kept (EEXIST), whatever
 * the guest wrote to them since.
 */
static int attach_scan(struct halite_restore *r)
{
	uint32_t ppm = r->mb_size / (uint32_t)r->page;

	for (uint32_t i = 0; i < r->nregions; i++) {
		const struct rregion *g = &r->regions[i];
		uint64_t *bits;
		int ret;

		/* A copy is this process's, new: fill_copies() fills it again. */
		if (g->kind == HALITE_MEM_COPY)
			continue;
		bits = calloc((g->length / r->page + 63) / 64 + 1, sizeof(*bits));
		if (!bits)
			return -ENOMEM;
		ret = present_pages(r, g, bits);
		if (ret) {
			free(bits);
			return rs_fail(r, ret, "region '%s': which pages are in already", g->name);
		}
		if (g->hpage)
			rs_huge_attach(r, g, bits);
		for (uint64_t k = 0; k < g->nmb; k++) {
			uint64_t mb = g->first_mb + k, p0 = k * ppm;
			struct halite_mb_loc loc;
			bool all = true;

			/* A 1.1 file's index chunk comes in here; damaged, the take-over fails. */
			ret = halite_reader_mb_lookup(r->rd, mb, &loc);
			if (ret) {
				free(bits);
				return rs_fail(r, ret, "memory block %llu: %s", ULL(mb),
					       halite_reader_errmsg(r->rd));
			}
			if (loc.state != HALITE_MB_STORED)
				continue;
			for (uint64_t p = p0; p < p0 + ppm && all; p++)
				all = (bits[p / 64] >> (p % 64)) & 1;
			if (all) {
				atomic_store(&r->mb[mb], MB_INSTALLED);
				r->n_mb_present++;
			}
		}
		free(bits);
	}
	for (uint64_t lb = 0; lb < r->lb_total; lb++) {
		const uint64_t *mbs;
		uint32_t n, k;
		int ret = halite_reader_lb_members(r->rd, lb, &mbs, &n);

		if (ret)
			return rs_fail(r, ret, "locality block %llu: %s", ULL(lb),
				       halite_reader_errmsg(r->rd));
		for (k = 0; k < n && atomic_load(&r->mb[mbs[k]]) == MB_INSTALLED; k++)
			;
		if (k == n) {
			atomic_store(&r->lbs[lb].state, LB_DONE);
			atomic_fetch_add(&r->lb_done, 1);
		}
	}
	halite_logf(&r->log, HALITE_LOG_INFO, "attach: %llu memory blocks and %llu locality "
		    "blocks already in", ULL(r->n_mb_present), ULL(atomic_load(&r->lb_done)));
	return 0;
}

static int make_gmem(struct halite_restore *r)
{
	struct halite_gmem_region *gr = calloc(r->nregions, sizeof(*gr));
	int ret;

	if (!gr)
		return -ENOMEM;
	for (uint32_t i = 0; i < r->nregions; i++) {
		bool copy = r->regions[i].kind == HALITE_MEM_COPY;

		/* A copy is no memory of the descriptor's: a placeholder. */
		gr[i] = (struct halite_gmem_region){ copy ? 0 : r->regions[i].host,
						     copy ? 0 : r->regions[i].length,
						     (uint32_t)(r->regions[i].hpage ? r->regions[i].hpage :
								r->page),
						     r->regions[i].kind == HALITE_MEM_SHARED };
	}
	ret = halite_gmem_create(&r->gm, r->uffd, gr, r->nregions);
	free(gr);
	return ret ? rs_fail(r, ret, "guest memory map") : 0;
}

/* The copies' blocks of verified LB @lb, decoded straight into the caller's memory. */
static int decode_copies(struct halite_restore *r, uint64_t lb, const uint8_t *buf)
{
	const uint64_t *mbs;
	uint32_t n;

	halite_reader_lb_members(r->rd, lb, &mbs, &n);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t off;
		const struct rregion *g = &r->regions[mb_region(r, mbs[i], &off)];
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

/*
 * The copies, at start, before any thread reads an LB: each LB holding a
 * stored block of one is read and verified here, its copies' blocks
 * decoded into place, and it lands as prefetched, so the pool installs its
 * other blocks as for any prefetched LB. Zero and never-touched blocks
 * need nothing: the caller's memory reads zeros (check_unpopulated()).
 * 0, or the failure (the restore has failed).
 */
static int fill_copies(struct halite_restore *r)
{
	uint8_t *tmp;
	int ret = 0;

	if (!r->has_copy)
		return 0;
	tmp = halite_io_alloc(r->mb_size);
	if (!tmp)
		return rs_fail(r, -ENOMEM, "decode buffer");
	for (uint32_t i = 0; i < r->nregions && !ret; i++) {
		const struct rregion *g = &r->regions[i];

		for (uint64_t mb = g->first_mb; g->kind == HALITE_MEM_COPY &&
						mb < g->first_mb + g->nmb && !ret; mb++) {
			struct halite_mb_loc loc;
			uint8_t *buf;
			unsigned reads;
			bool mine = false;

			ret = halite_reader_mb_lookup(r->rd, mb, &loc);
			if (ret) {
				ret = rs_fail(r, ret, "%s", halite_reader_errmsg(r->rd));
				rs_set_failed(r, ret);
				break;
			}
			if (loc.state != HALITE_MB_STORED)
				continue;
			pthread_mutex_lock(&r->lk);
			if (atomic_load(&r->lbs[loc.lb].state) == LB_IDLE) {
				atomic_store(&r->lbs[loc.lb].state, LB_READING);
				mine = true;
			}
			pthread_mutex_unlock(&r->lk);
			if (!mine)
				continue; /* read here for an earlier block */
			buf = halite_reader_alloc_lb(r->rd);
			if (!buf) {
				ret = rs_fail(r, -ENOMEM, "locality block %llu: read buffer", ULL(loc.lb));
				rs_set_failed(r, ret);
				break;
			}
			ret = read_lb_retrying(r, loc.lb, buf, &reads);
			if (ret) {
				halite_reader_free_lb(buf);
				lb_failed(r, loc.lb, ret, reads);
				break;
			}
			ret = decode_copies(r, loc.lb, buf);
			if (ret) {
				halite_reader_free_lb(buf);
				rs_set_failed(r, ret);
				break;
			}
			lb_landed(r, loc.lb, buf, HOW_PREFETCH, tmp);
		}
	}
	halite_io_free(tmp);
	return ret;
}

/* Library threads take no signals meant for the application. */
static int start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	int ret;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	ret = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return -ret;
}

/* Stop and join every thread; the pool finishes its tasks first. */
static void stop_threads(struct halite_restore *r)
{
	atomic_store(&r->stopping, true);
	pthread_mutex_lock(&r->lk);
	pthread_cond_broadcast(&r->q_cond);
	pthread_mutex_unlock(&r->lk);
	if (r->pf_started)
		pthread_join(r->pf_thr, NULL);
	r->pf_started = false;
	for (unsigned i = 0; i < r->readers_started; i++)
		pthread_join(r->rd_thr[i], NULL);
	r->readers_started = 0;
	/*
	 * The fault thread before the pool: it submits install tasks too (an
	 * LB it read from the page cache), and a task submitted to a freed
	 * pool is a crash. Pool tasks need no fault thread: an install that
	 * finds an event pending reads it itself (gmem.h).
	 */
	if (r->fault_started) {
		eventfd_write(r->stop_fd, 1);
		pthread_join(r->fault_thr, NULL);
	}
	r->fault_started = false;
	/* The tasks may submit finish; the pool runs those too before it goes. */
	halite_pool_free(r->pool);
	r->pool = NULL;
}

HALITE_EXPORT int halite_restore_start(struct halite_restore *r)
{
	bool attach, nothing;
	int ret;

	pthread_mutex_lock(&r->st_lock);
	ret = r->state != S_CREATED || r->started ? -HALITE_E_STATE : 0;
	r->started = true;
	pthread_mutex_unlock(&r->st_lock);
	if (ret)
		return ret;
	attach = r->o.flags & HALITE_RESTORE_ATTACH;
	ret = open_uffd(r);
	for (uint32_t i = 0; i < r->nregions && !ret && !attach; i++)
		ret = check_unpopulated(r, &r->regions[i]);
	for (uint32_t i = 0; i < r->nregions && !ret; i++)
		if (r->regions[i].kind != HALITE_MEM_COPY)
			ret = register_region(r, &r->regions[i]);
	if (!ret)
		ret = make_gmem(r);
	if (!ret && attach)
		ret = attach_scan(r);
	if (!ret)
		refuse_discards(r);
	if (!ret) {
		r->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (r->stop_fd < 0)
			ret = rs_fail(r, -errno, "eventfd");
	}
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
	pthread_mutex_lock(&r->st_lock);
	r->state = S_RUNNING;
	r->ready_at = halite_now_ns();
	r->ready_ns = r->ready_at - r->open_ns;
	pthread_mutex_unlock(&r->st_lock);
	/* Before the copies land: their LBs' other blocks are staged too. */
	if (r->learn && r->o.learn_window_ms)
		r->learn_end_ns = r->ready_at + (uint64_t)r->o.learn_window_ms * 1000000;
	atomic_store(&r->learning, r->learn);
	atomic_store(&r->last_fault_ns, r->ready_at);
	/* Before the copies: their LBs' installs may finish the restore themselves. */
	nothing = atomic_load(&r->lb_done) == r->lb_total;
	ret = fill_copies(r);
	if (ret) {
		/* LBs that landed are being installed: that ends before the ranges go. */
		halite_pool_wait(r->pool);
		goto fail;
	}
	ret = start_thread(&r->fault_thr, fault_main, r);
	r->fault_started = !ret;
	for (unsigned i = 0; i < r->o.demand_readers && !ret; i++) {
		ret = start_thread(&r->rd_thr[i], reader_main, r);
		if (!ret)
			r->readers_started++;
	}
	if (!ret && r->pf_io) {
		ret = start_thread(&r->pf_thr, prefetch_main, r);
		r->pf_started = !ret;
	}
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
	for (uint32_t i = 0; i < r->nregions && attach; i++) {
		if (r->regions[i].kind == HALITE_MEM_COPY)
			continue;
		ret = halite_gmem_wake(r->gm, i, 0, r->regions[i].length);
		if (ret)
			halite_logf(&r->log, HALITE_LOG_WARN, "region '%s': UFFDIO_WAKE: %s",
				    r->regions[i].name, strerror(-ret));
	}
	/* Nothing to read: a file of zero and never-touched blocks, or all in already. */
	if (nothing && halite_pool_submit(r->pool, finish_task, r))
		finish(r);
	return 0;
fail:
	allow_discards(r);
	/* Taken over: the registration is the owner's, and its threads wait on it. */
	if (!attach)
		unregister_all(r);
	pthread_mutex_lock(&r->st_lock);
	r->state = S_FAILED;
	r->error = ret;
	pthread_mutex_unlock(&r->st_lock);
	return ret;
}

HALITE_EXPORT int halite_restore_wait(struct halite_restore *r, int timeout_ms)
{
	struct timespec dl;
	int ret = 0, state, err;

	if (timeout_ms >= 0)
		halite_deadline(&dl, (uint64_t)timeout_ms * 1000000);
	pthread_mutex_lock(&r->st_lock);
	if (!r->started) {
		pthread_mutex_unlock(&r->st_lock);
		return -HALITE_E_STATE;
	}
	while (r->state == S_RUNNING && ret != ETIMEDOUT)
		ret = timeout_ms < 0 ? pthread_cond_wait(&r->st_cond, &r->st_lock)
				     : pthread_cond_timedwait(&r->st_cond, &r->st_lock, &dl);
	state = r->state;
	err = r->error;
	pthread_mutex_unlock(&r->st_lock);
	if (state == S_RUNNING)
		return -ETIMEDOUT;
	return state == S_FAILED ? err : 0;
}

HALITE_EXPORT void halite_restore_stats(struct halite_restore *r, struct halite_restore_stats *st)
{
	fill_stats(r, st);
}

static void protect_none(void *ctx, uint32_t ri, uint64_t host, uint64_t len)
{
	struct halite_restore *r = ctx;

	if (mprotect((void *)(uintptr_t)host, len, PROT_NONE))
		halite_logf(&r->log, HALITE_LOG_ERROR, "region '%s': mprotect(PROT_NONE) after a "
			    "failed restore: %s", r->regions[ri].name, strerror(errno));
}

HALITE_EXPORT void halite_restore_free(struct halite_restore *r)
{
	bool failed;

	if (!r)
		return;
	if (r->started) {
		pthread_mutex_lock(&r->st_lock);
		failed = r->state == S_RUNNING && !r->ending;
		pthread_mutex_unlock(&r->st_lock);
		if (failed) {
			/* The caller's decision, not a fault: no error in the log. */
			set_errmsg_level(r, "restore cancelled: freed while running",
					 HALITE_LOG_INFO);
			rs_set_failed(r, -ECANCELED);
		}
		stop_threads(r);
		pthread_mutex_lock(&r->st_lock);
		failed = r->state != S_DONE;
		pthread_mutex_unlock(&r->st_lock);
		/*
		 * Closing the userfaultfd wakes every blocked thread and drops
		 * the registration: unrestored memory would then read as zeros.
		 * PROT_NONE first turns that into SIGSEGV. Another process's
		 * memory stays registered with the owner's descriptor instead.
		 */
		for (uint32_t i = 0; failed && !r->external && i < r->nregions; i++)
			if (r->regions[i].registered) {
				/* Where the memory is now: moves included. */
				halite_gmem_ranges(r->gm, protect_none, r);
				break;
			}
		allow_discards(r);
	}
	halite_pool_free(r->pool);
	for (uint64_t lb = 0; r->lbs && lb < r->lb_total; lb++) {
		struct rlb *b = &r->lbs[lb];
		struct waiter *w;

		while ((w = b->waiters)) {
			b->waiters = w->next;
			free(w);
		}
		halite_reader_free_lb(b->buf);
		free(b->stage);
	}
	halite_io_close(r->pf_io);
	rs_huge_free(r);
	rs_learn_free(r);
	halite_gmem_free(r->gm);
	if (r->uffd >= 0)
		close(r->uffd);
	if (r->stop_fd >= 0)
		close(r->stop_fd);
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
	free(r->q);
	halite_zfree(r->ra_next);
	free(r->rd_thr);
	halite_io_free(r->fault_tmp);
	free((void *)r->o.vcpu_tids);
	free((void *)r->o.trace_path);
	free(r->path);
	pthread_mutex_destroy(&r->lk);
	pthread_cond_destroy(&r->q_cond);
	pthread_mutex_destroy(&r->st_lock);
	pthread_mutex_destroy(&r->learn_lk);
	pthread_cond_destroy(&r->st_cond);
	free(r);
}

HALITE_EXPORT const char *halite_restore_errmsg(const struct halite_restore *r)
{
	return r->errmsg;
}
