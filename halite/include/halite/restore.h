/* SPDX-License-Identifier: MIT */
/*
 * Userfaultfd lazy restore (the paper's section 7.2).
 *
 * The caller maps empty guest memory, opens the file (header, sections and
 * index only: open-to-ready does not depend on the memory size), starts the
 * engine and resumes the guest at once. From then on:
 * - a fault on a memory block not yet restored reads the whole locality block
 *   (LB) holding it with one read, verifies its checksum, decompresses the
 *   faulting memory block first, installs it (UFFDIO_COPY) and wakes the
 *   thread; a thread pool installs the LB's other blocks. A fault on a block
 *   whose LB is already in memory (being installed, or prefetched) is answered
 *   from it; concurrent faults on one LB wait for one read. Zero and
 *   never-touched blocks are never read: a fault on one is answered with
 *   UFFDIO_ZEROPAGE, and those never faulted stay holes, which read as zeros
 *   once the range is unregistered.
 * - a demand read also reads ahead the next LBs of the same stream (what the
 *   guest touched after that LB during the save), counted as prefetched;
 * - a background prefetcher reads the remaining LBs in file order (the order
 *   the save wrote them, i.e. the guest's access order) with several reads in
 *   flight, throttled: it holds back while demand faults are busy and runs
 *   when they are quiet, never below a minimum rate, so the restore finishes.
 * - when every block is in, the ranges are unregistered and the restore is
 *   done.
 *
 * Failure: an LB that fails its checksum or cannot be read is read again
 * (read_retries times) and never installed; if it still fails the restore
 * fails with a message naming it, its file offset and the reason
 * ("locality block 17 at offset 1183744: checksum mismatch after 3 reads").
 * From then on nothing more is installed, except that an LB verified before
 * the failure is installed whole: every LB is either all in memory or not at
 * all. Threads faulting on memory not yet restored stay blocked (they never
 * see an unverified byte); the caller must then stop the guest.
 * halite_restore_free() of a failed restore of this process's memory makes
 * the regions inaccessible (PROT_NONE, whole regions) before dropping the
 * userfaultfd, so a blocked thread gets SIGSEGV, never zeros. For another
 * process's memory, that process holds the userfaultfd: after a failure, and
 * if the restoring process dies, the owner's faulting threads block until the
 * owner exits.
 *
 * Memory: each region must be mapped and never touched, private anonymous or
 * a shared mapping of memfd/tmpfs/hugetlbfs, host-page aligned.
 * A copy (HALITE_MEM_COPY) is memory of this process outside the guest's
 * RAM, whoever owns the rest (halite-qemu: video memory, which it then
 * writes into QEMU itself): it is not registered, and it is filled before
 * halite_restore_start() returns, every block read, verified and decoded,
 * its zero and never-touched blocks left as they are (zeros). Its blocks
 * count as prefetched, as does each LB read for them (the LB's other
 * blocks are installed as for any prefetched LB: every LB is still read
 * once).
 * halite_restore_start() refuses memory with a page already populated
 * (shared memory: data in the file range; anonymous memory: mincore() here,
 * /proc/PID/pagemap for another process's), since such a page would never
 * fault and keep its bytes.
 *
 * hugetlbfs: the kernel maps a huge page whole, so there the unit of
 * installation is the huge page (its size taken from the file system: 2 MiB,
 * or 1 GiB, where one fault then waits for a whole GiB): the guest sees a
 * huge page only once every stored block of it is decoded and verified, its
 * zero and never-touched blocks reading as the zeros of a fresh page. A
 * fault reads every LB holding a block of its huge page (the faulting
 * block's first); the blocks are decoded straight into the page cache
 * through the engine's own mapping of the file, and the page is mapped for
 * the guest with UFFDIO_CONTINUE once its last block is in (the region is
 * registered MISSING and MINOR, so a page being assembled faults like a
 * hole until then). The region's host address, length and file offset must
 * be multiples of the huge page size; its file descriptor open for reading
 * and writing; the engine's mapping reserves the range's huge pages at open
 * (-ENOMEM when too few are free).
 * Memory already registered with another userfaultfd (a save or restore of
 * it running) is refused with -EBUSY before anything changes.
 *
 * What the guest does meanwhile: a private page it discards (MADV_DONTNEED
 * and the like) reads as zeros from then on, whatever the restore had done
 * with it; unmapped memory is left alone; a range it moves (mremap) is
 * restored where it went. Hole punches in a shared region's file are
 * refused while the restore runs (the file is made append-only, see
 * docs/failure-model.md), so a balloon or virtio-mem discard cannot make a
 * page read zeros that the restore then fills again.
 *
 * Installs are page by page where a block crosses mappings (a VMA split by
 * madvise); a page that is neither mapped nor known to be gone fails the
 * restore (never silently left empty).
 *
 * The file is only read: many restores of one file may run at once (clones).
 * A trace of what was read when (docs/restore-trace.md) can be written at
 * the end.
 */
#ifndef HALITE_RESTORE_H
#define HALITE_RESTORE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <halite/format.h>
#include <halite/memory.h>

#ifdef __cplusplus
extern "C" {
#endif

struct halite_restore;

struct halite_restore_region {
	const char *name; /* the file's region of that name; every one given exactly once */
	uint64_t host;	  /* target in the owner's address space (COPY: in this process):
			     mapped, never touched, host-page aligned */
	uint64_t length;  /* must equal the file region's length */
	int kind;	  /* enum halite_mem_kind: ANON (private), SHARED (memfd, tmpfs,
			     hugetlbfs) or COPY */
	/*
	 * SHARED: the file mapped at @host (not taken over), and where in it:
	 * the engine checks it is empty, refuses hole punches (discards) in it
	 * while restoring, and reads from it which pages are in when it takes
	 * over a restore (HALITE_RESTORE_ATTACH). On hugetlbfs (no hole
	 * punch can be refused there), open for writing: the engine decodes
	 * the huge pages into it. Ignored for ANON.
	 */
	int fd;
	uint64_t fd_offset;
};

/* No background prefetcher (tests, measurements); with NO_READAHEAD, demand reads only. */
#define HALITE_RESTORE_NO_PREFETCH 0x1u
#define HALITE_RESTORE_DIRECT 0x2u	 /* read LBs with O_DIRECT (cold-cache measurements) */
/*
 * Measure the paper's "VM access %": the other blocks of an LB read for a
 * demand fault are decoded and staged, not installed; the guest's first
 * access to one is answered from the stage and counted. Staged blocks the
 * guest never touched are installed at the end. Costs one minor fault per
 * staged block the guest touches. Blocks of hugetlbfs regions are never
 * staged (the guest touches a huge page whole): not measured there.
 */
#define HALITE_RESTORE_TRACK_ACCESS 0x4u
/* No stream readahead (opts.readahead). */
#define HALITE_RESTORE_NO_READAHEAD 0x8u
/*
 * Take over a restore whose handler died (owner_uffd from the owner, where
 * the dead handler's registration lives on): the descriptor's UFFDIO_API
 * handshake may have been done already (its features are read from
 * /proc/self/fdinfo and must include what the engine needs), the regions
 * may be registered already (registering again is harmless), and memory
 * may be partly in. Pages found in memory (SHARED: in the file; ANON: in
 * the owner's page tables or swap) are kept, never overwritten; blocks all
 * of whose pages are in count as mb_present and are not read. At start
 * every region's waiting threads are woken, so faults the dead handler had
 * read but not served come again. A page the guest discarded after the
 * dead handler installed it cannot be told from one never installed, and
 * for private memory would get its snapshot bytes again: shared memory is
 * immune, since discards are refused while a restore runs.
 */
#define HALITE_RESTORE_ATTACH 0x10u
/*
 * Learn the guest (docs/restore-trace.md, version 2): record the order in
 * which the guest first touches each memory block after resume, per vCPU,
 * for opts.learn_window_ms after ready or until the restore is done, into
 * the trace (trace_path required). While learning, no block reaches guest
 * memory before the guest touches it, so each first touch is a fault: the
 * other blocks of every LB read are staged as with TRACK_ACCESS (decoded
 * and kept by the engine, installed at the first touch), and the background
 * prefetcher and stream readahead pause (memory comes in by faults only;
 * what is held is what the guest's faults read). When the window ends the
 * staged blocks are installed and prefetch resumes; with TRACK_ACCESS too,
 * the staged blocks of demand-read LBs stay staged to the end as without
 * LEARN, so vm_access_pct counts the guest's touches of them until then,
 * exactly as TRACK_ACCESS alone would. Zero and never-touched
 * blocks are recorded too. On hugetlbfs the unit is the huge page: the
 * first faulting block of each page is recorded, and a page completed by
 * LBs read for other pages is mapped without a fault, unrecorded. Not with
 * ATTACH (the first touches happened under the dead handler).
 */
#define HALITE_RESTORE_LEARN 0x20u
/* Do not read a relayouted file's hot prefix first (opts.hot_prefix_max): measurements. */
#define HALITE_RESTORE_NO_HOT 0x40u
#define HALITE_RESTORE_FLAGS_ALL 0x7fu

struct halite_restore_opts {
	size_t sz;
	unsigned flags;		   /* HALITE_RESTORE_* */
	int io_backend;		   /* HALITE_IO_BACKEND_* (format.h), for prefetch reads; 0 =
				      default; one the kernel refuses fails open */
	unsigned queue_depth;	   /* prefetch reads in flight at most; 0 = 8, at most 4096 */
	uint32_t read_latency_us;  /* added to every LB read: slow disks, remote storage */
	unsigned workers;	   /* install threads; 0 = online CPUs, at most 256 */
	unsigned demand_readers;   /* threads reading LBs for faults (and readahead);
				      0 = 16, at most 256 */
	unsigned read_retries;	   /* extra attempts at an LB that fails; 0 = 2 */
	/* vCPU threads, for per-vCPU fault counts; optional */
	const pid_t *vcpu_tids;
	uint32_t nvcpus;
	/*
	 * Another process owns the memory (owner_pid != 0): @owner_uffd is a
	 * userfaultfd created inside the owner; the engine does the UFFDIO_API
	 * handshake on it and keeps a dup.
	 */
	pid_t owner_pid;
	int owner_uffd;
	/*
	 * Prefetch throttle (paper, section 6): prefetch reads start only once
	 * no demand fault has come for prefetch_idle_us, and never fall below
	 * prefetch_min_rate bytes per second.
	 */
	uint32_t prefetch_idle_us; /* 0 = 2000 */
	uint64_t prefetch_min_rate; /* 0 = 64 MiB/s */
	/*
	 * If set, a restore trace (docs/restore-trace.md) is written here when
	 * the restore ends, done or failed, before halite_restore_wait()
	 * returns; written to a temporary file in the same directory and
	 * renamed, so a reader never sees half of one. Failing to write it
	 * only logs a warning. Copied. Version 1 unless HALITE_RESTORE_LEARN
	 * (then version 2, with the first touches; required for LEARN).
	 */
	const char *trace_path;
	halite_log_fn log;
	void *log_ctx;
	int log_level;
	/*
	 * Stream readahead: a demand read of an LB also reads the next
	 * @readahead LBs of its stream (what the guest touched next during the
	 * save), on at most half the demand readers, counted as prefetched.
	 * 0 = 8, at most 64.
	 */
	unsigned readahead;
	/*
	 * HALITE_RESTORE_LEARN: how long to learn, in ms from ready; 0 = until
	 * the restore is done (prefetch then never runs: memory comes in only
	 * as the guest touches it, and the restore is done once it has touched
	 * a block of every LB). Set without LEARN: refused.
	 */
	uint32_t learn_window_ms;
	/*
	 * A relayouted file (halite-inspect relayout: metadata
	 * "halite.relayout" with hot-lbs=K) holds what earlier restores'
	 * guests touched first in its first K LBs, its hot prefix. The
	 * prefetcher reads those first, from ready on, concurrently with the
	 * guest's resume and its faults: unthrottled (prefetch_idle_us and
	 * prefetch_min_rate apply only after them), queue_depth reads in
	 * flight, the LBs a fault reads first counted as demand reads as
	 * usual. At most @hot_prefix_max bytes of them (whole LBs; 0 =
	 * 256 MiB, UINT64_MAX = all K). Not with HALITE_RESTORE_NO_HOT
	 * (off), NO_PREFETCH (no prefetcher), nor while learning (LEARN:
	 * read after the window, before the rest). A file without the
	 * metadata restores as before; a value that is not "hot-lbs=K" with
	 * K at most the file's LB count is ignored with a warning (only the
	 * order of reads depends on it: every LB is verified anyway).
	 */
	uint64_t hot_prefix_max;
	/*
	 * An open reader of @path (halite_reader_opts.same_as), or NULL: the
	 * caller has looked into the file already, and the restore reads the
	 * same version without opening it anew (an object: no request to
	 * open it again). Only read during halite_restore_open().
	 */
	const struct halite_reader *same_as;
};

struct halite_restore_stats {
	uint64_t ready_ns;	  /* open to ready (registered, threads starting) */
	uint64_t duration_ns;	  /* ready to done or failed (or to now) */
	uint64_t mb_total;
	/*
	 * Every memory block is counted in exactly one of these once done
	 * (mb_fault + mb_pool + mb_prefetch + mb_zero == mb_total), by
	 * whoever installed it:
	 */
	uint64_t mb_fault;	  /* stored blocks installed for a fault on them (the one that
				     caused a read, those that waited for it, those answered
				     from an LB in memory or from the stage; hugetlbfs: the
				     blocks of the faulting huge page a demand read brought) */
	uint64_t mb_pool;	  /* other blocks of demand-read LBs, installed by the pool
				     (TRACK_ACCESS: staged blocks installed at the end;
				     LEARN: staged blocks installed when the window ends, or at
				     the end, with TRACK_ACCESS at the end; those of prefetched
				     LBs count in mb_prefetch) */
	uint64_t mb_prefetch;	  /* other blocks of prefetched LBs, installed by the pool, and the
				     copies' blocks, filled at start */
	uint64_t mb_zero;	  /* zero or never-touched: zero page on fault, else left a hole;
				     all of them from the start (never read) */
	uint64_t faults;	  /* missing-page faults handled (not those after a failure) */
	uint64_t faults_cached;	  /* ... on stored blocks whose LB was in memory: answered
				     from it or from the stage, or raced with an install
				     (hugetlbfs: on a huge page all of whose LBs were in
				     memory or being read, or complete) */
	uint64_t faults_zero;	  /* ... on zero or never-touched blocks (hugetlbfs: on huge
				     pages without a stored block) */
	uint64_t faults_vcpu;	  /* ... from the vCPU threads given */
	uint64_t lb_total;
	uint64_t lb_demand;	  /* LBs read for a fault (each LB is read once: demand +
				     prefetch == lb_total when done) */
	uint64_t lb_prefetch;	  /* LBs read by the prefetcher (or at start, for the copies) */
	uint64_t lb_retries;	  /* re-reads after a checksum or read failure */
	uint64_t bytes_read;	  /* every LB read that returned its bytes, retries included */
	/*
	 * TRACK_ACCESS: blocks staged (the blocks of each demand-read LB but
	 * the one whose fault read it), and of those, how many the guest
	 * touched before the end (including faults that waited for the read).
	 */
	uint64_t mb_staged, mb_staged_accessed;
	double vm_access_pct;	  /* 100 * accessed / staged; < 0 when not measured (no
				     TRACK_ACCESS, or nothing staged) */
	uint64_t fault_p50_ns;	  /* fault service, message read to wake, over the faults the
				     engine woke itself (not those raced with an install) */
	uint64_t fault_p99_ns;
	bool done;
	int error;		  /* the failure (< 0), else 0 */
	/*
	 * HALITE_RESTORE_ATTACH: stored blocks found in memory at start, never
	 * read (mb_fault + mb_pool + mb_prefetch + mb_zero + mb_present ==
	 * mb_total once done; 0 without ATTACH).
	 */
	uint64_t mb_present;
	/*
	 * What the guest did to its memory meanwhile (userfaultfd events):
	 * private pages it discarded, which read as zeros from then on whatever
	 * the restore had done with them, and pages it unmapped.
	 */
	uint64_t pages_discarded;
	uint64_t pages_unmapped;
	/*
	 * LBs of a relayouted file's hot prefix read by the prefetcher ahead
	 * of the rest (opts.hot_prefix_max), counted in lb_prefetch too; the
	 * hot LBs a fault read first are in lb_demand only.
	 */
	uint64_t lb_hot;
};

/*
 * Open @path and check it against @regions (every file region named exactly
 * once, same length): header, sections and index are read and verified,
 * nothing is registered yet, no locality block is read; the cost beyond that
 * is one byte per memory block and a few words per locality block. The
 * regions and options (vCPU ids, trace path) are copied. Returns 0, the
 * reader's code for a bad file (halite_reader_open()), -EINVAL for bad
 * arguments, or -errno; *r is written only on success.
 */
int halite_restore_open(struct halite_restore **r, const char *path,
			const struct halite_restore_region *regions, uint32_t nregions,
			const struct halite_restore_opts *opts);

/* The file's device state (before or after start), or -HALITE_E_NOT_FOUND. */
int halite_restore_device_state(struct halite_restore *r, const void **data, uint64_t *len);

/* The file being restored, for its metadata. Owned by the engine. */
struct halite_reader *halite_restore_reader(struct halite_restore *r);

/*
 * Register the regions (userfaultfd MISSING), fill the copies (COPY regions:
 * their LBs read, verified and decoded here, so a failing LB fails the
 * start naming it), start the fault thread, the pools and the prefetcher;
 * returns so the caller can resume the guest at once. Once only. -HALITE_E_UNSUPPORTED when the kernel lacks a needed
 * feature, -EEXIST when memory of this process is already populated,
 * -HALITE_E_STATE when called twice (or, from outside, when owner_uffd had
 * its handshake already). After a failed start only free (and wait, which
 * returns the error) are valid.
 */
int halite_restore_start(struct halite_restore *r);

/*
 * Wait until every block is in and the ranges are unregistered (0), or the
 * restore fails (its error, < 0). @timeout_ms < 0 waits forever; -ETIMEDOUT
 * if still running after it; -HALITE_E_STATE before start; -EINVAL for a
 * NULL restore. Thread-safe.
 */
int halite_restore_wait(struct halite_restore *r, int timeout_ms);

/*
 * A copy of the statistics, at any time; while running, counters read a
 * moment apart (the sums hold once done). Thread-safe.
 */
void halite_restore_stats(struct halite_restore *r, struct halite_restore_stats *st);

/*
 * Stop and free. A restore still running is cancelled (-ECANCELED) and
 * treated as failed: see the failure notes above. NULL is fine. Not while
 * another thread is in a call on @r.
 */
void halite_restore_free(struct halite_restore *r);

/* Detail of the failure (the first one), "" if none. Valid until free. */
const char *halite_restore_errmsg(const struct halite_restore *r);

#ifdef __cplusplus
}
#endif
#endif /* HALITE_RESTORE_H */
