/* SPDX-License-Identifier: MIT */
/*
 * Copy-on-access lazy save (the paper's section 7.1).
 *
 * The caller pauses the guest, arms the engine (cost O(regions), not
 * O(memory)) and resumes the guest at once. From then on the first access to
 * any memory block, read or write, by any thread, traps through userfaultfd:
 * the engine gives the block back to the guest with its snapshot-instant
 * contents kept aside, wakes the thread, and appends the block to the stream
 * of the vCPU that touched it (threads that are not vCPUs go to the "other"
 * stream). Compression and I/O happen in worker threads, never before the
 * wake. A throttled background thread saves the rest: first in guest-virtual
 * order by walking the guest's page tables (when roots are given), then in
 * guest-physical order.
 *
 * Memory kinds:
 * - private anonymous memory of this process: pages move to a shadow with
 *   mremap(MREMAP_DONTUNMAP), the range is registered MISSING, and a block is
 *   given back with UFFDIO_COPY from the shadow;
 * - private anonymous memory of another process (the owner): the range is
 *   registered MISSING and the owner's pages move aside inside it (the
 *   caller's remap callback: an mremap(MREMAP_DONTUNMAP) run in the owner);
 *   a claimed block is read from there (process_vm_readv) and given back
 *   with UFFDIO_COPY; the pages moved aside are unmapped at the end, on every
 *   way out. The owner must keep its copy of the userfaultfd: should this
 *   process die, its threads then block on the memory not given back
 *   (which only the pages moved aside hold) instead of reading zeros.
 * - shared memory (memfd, tmpfs, hugetlbfs file) of this process or of
 *   another one (the owner): the range is registered MINOR|MISSING and the
 *   owner's page-table entries are dropped (MADV_DONTNEED) while the data
 *   stays in the page cache; the engine copies a block through its own
 *   mapping of the file, then gives it back with UFFDIO_CONTINUE (holes:
 *   UFFDIO_COPY of zeros). For another process the caller supplies a
 *   userfaultfd created inside it and a way to drop its page-table entries
 *   (QEMU: ptrace injection; see docs/).
 * - a copy (HALITE_MEM_COPY), in this process whoever owns the rest: memory
 *   from outside the guest's RAM that the caller copied at the snapshot
 *   instant (a device's video memory, read from the VMM), at @host. It is
 *   not registered and never written: the engine reads it as it is, pages
 *   the caller never wrote (holes) as never-touched blocks. The background
 *   thread saves all of it first thing after arm (with
 *   HALITE_SAVE_NO_BACKGROUND, arm does). The caller keeps it mapped and
 *   unchanged until halite_save_wait() has returned (or halite_save_free()).
 *
 * Memory a save or restore is already working on (registered with another
 * userfaultfd) is refused at arm with -EBUSY, before anything changes.
 *
 * What the guest does to its memory during the save: a private page it
 * discards (MADV_DONTNEED, ...) reads as zeros from then on, whatever the
 * engine had done with it, and the file still gets the page as it was at the
 * snapshot instant; unmapped memory is saved as it was; a range it moves is
 * followed. A hole punched in a shared region's file (a VMM giving memory
 * back: virtio-balloon, free page reporting, virtio-mem) is refused while
 * the save runs: the file is made append-only (halite/src/discard.h, which
 * also records who did it so that a later engine can undo it should this
 * process die). Where the file cannot refuse (no CAP_LINUX_IMMUTABLE, or a
 * file system without the flag), a block punched before it was saved fails
 * the save with -ENODATA and a message naming where, never zeros in the
 * file; on hugetlbfs, which can neither refuse nor tell holes, a warning is
 * logged at arm.
 *
 * hugetlbfs: the kernel faults and maps whole huge pages, so a fault saves
 * every block of its huge page at once; region host address, length and
 * file offset must be multiples of the huge page size. hugetlbfs cannot
 * tell holes, so never-touched memory there is saved as zero blocks.
 *
 * The file is written under a temporary name in the target's directory and
 * renamed over the target only once complete (halite_writer_create()): an
 * older snapshot at the path stays, byte for byte, until the new one
 * replaces it whole, and survives every failure.
 *
 * Failure (ENOSPC, EIO, cancel, an internal check that fails with
 * HALITE_E_INTERNAL): every block not yet given back is given back, so the
 * guest's memory is exactly what it would have been without the save; the
 * target path is left as it was (the older file, or nothing); the partial
 * file, which has no footer (incomplete), is removed, or with
 * HALITE_SAVE_KEEP_INCOMPLETE kept as "PATH.incomplete".
 */
#ifndef HALITE_SAVE_H
#define HALITE_SAVE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <halite/format.h>
#include <halite/memory.h>

#ifdef __cplusplus
extern "C" {
#endif

struct halite_save;

struct halite_save_region {
	const char *name;   /* as in the file: "pc.ram", ... */
	uint64_t gpa;	    /* guest-physical base */
	uint64_t length;    /* bytes, a multiple of the memory-block size */
	uint64_t host;	    /* where the memory is mapped in the owner's address space
			       (COPY: in this process) */
	int kind;	    /* enum halite_mem_kind */
	int fd;		    /* SHARED: the file; the engine maps it itself. Not taken over */
	uint64_t fd_offset; /* SHARED: offset of the region in @fd */
};

/*
 * Drop the owner's page-table entries for [addr, addr+len) of its address
 * space (MADV_DONTNEED on a shared mapping: the data stays in the file), so
 * that every later access faults. 0 or -errno.
 */
typedef int (*halite_drop_ptes_fn)(void *ctx, uint64_t addr, uint64_t len);

/*
 * Another process's private memory: move the owner's pages of [@addr,
 * @addr + @len) inside it, with mremap(): @to 0, aside (MREMAP_MAYMOVE |
 * MREMAP_DONTUNMAP: the range stays mapped, empty) and *@res gets where they
 * went; @to not 0, back there (MREMAP_MAYMOVE | MREMAP_FIXED). 0 or -errno.
 */
typedef int (*halite_remap_fn)(void *ctx, uint64_t addr, uint64_t len, uint64_t to,
			       uint64_t *res);
/* Unmap [@addr, @addr + @len) inside the owner (the pages moved aside, at the end). */
typedef int (*halite_unmap_fn)(void *ctx, uint64_t addr, uint64_t len);

#define HALITE_SAVE_KEEP_INCOMPLETE 0x1u /* keep a failed save's partial file as PATH.incomplete */
#define HALITE_SAVE_NO_SYNC 0x2u	 /* no fdatasync at the end (tests) */
#define HALITE_SAVE_NO_BACKGROUND 0x4u	 /* only faults save (tests); finish needs every block touched */
/* The fault thread stays an ordinary thread (by default SCHED_FIFO where allowed). */
#define HALITE_SAVE_NO_REALTIME 0x8u
/*
 * Locality blocks bypass the page cache (HALITE_WRITER_DIRECT, as virsh save
 * --bypass-cache): a large save does not push the host's cache out. A file
 * system that refuses O_DIRECT fails halite_save_create().
 */
#define HALITE_SAVE_DIRECT 0x10u
#define HALITE_SAVE_FLAGS_ALL 0x1fu

struct halite_save_opts {
	size_t sz;
	/* The file (see struct halite_writer_opts). */
	int codec;
	int level;
	uint32_t mb_pages;
	uint32_t lb_size;
	unsigned flags;		   /* HALITE_SAVE_* */
	/* vCPU threads: a fault from vcpu_tids[i] goes to stream vCPU i. */
	const pid_t *vcpu_tids;
	uint32_t nvcpus;
	unsigned workers;	   /* compression threads; 0 = online CPUs */
	/*
	 * Another process owns the memory (owner_pid != 0): @owner_uffd is a
	 * userfaultfd created inside the owner (the engine does the UFFDIO_API
	 * handshake on it and keeps a dup); @drop_ptes drops the owner's
	 * page-table entries of SHARED regions; @remap and @unmap (at the end
	 * of these options) move the owner's pages of ANON regions. All get
	 * @drop_ctx.
	 */
	pid_t owner_pid;
	int owner_uffd;
	halite_drop_ptes_fn drop_ptes;
	void *drop_ctx;
	/*
	 * Background throttle (paper, section 6): the background thread holds
	 * back while the guest faults (the save is progressing by itself) and
	 * runs once no fault has come for bg_idle_us; it never falls below
	 * bg_min_rate bytes per second, so the save finishes.
	 */
	uint32_t bg_idle_us;	   /* 0 = 2000 */
	uint64_t bg_min_rate;	   /* 0 = 64 MiB/s */
	halite_log_fn log;
	void *log_ctx;
	int log_level;
	/* Locality-block writes (see struct halite_writer_opts). */
	int io_backend;		   /* HALITE_IO_BACKEND_*; 0 = io_uring, else libaio, else pwrite */
	unsigned queue_depth;	   /* writes in flight at most; 0 = 8 */
	/* Another process's ANON regions (see owner_pid above). */
	halite_remap_fn remap;
	halite_unmap_fn unmap;
};

struct halite_save_stats {
	uint64_t arm_ns;	    /* time halite_save_arm() took */
	uint64_t duration_ns;	    /* arm to file complete */
	uint64_t mb_total;
	uint64_t mb_saved;	    /* memory blocks saved so far (stored, zero or untouched) */
	uint64_t mb_stored, mb_zero, mb_untouched;
	uint64_t faults;	    /* first-touch faults served */
	/*
	 * Memory blocks those faults saved, by the thread that touched them:
	 * into its vCPU's stream, or (any other thread) into "other". On small
	 * pages one per fault that claimed its block; a fault on a huge page
	 * saves all the huge page's blocks. With mb_background they add up to
	 * mb_saved.
	 */
	uint64_t faults_vcpu;
	uint64_t faults_other;
	uint64_t mb_background;	    /* blocks saved by the background thread (and the copies) */
	uint64_t fault_p50_ns;	    /* fault service time: message read to wake */
	uint64_t fault_p99_ns;
	uint64_t raw_bytes;	    /* bytes of stored memory blocks */
	uint64_t stored_bytes;	    /* after compression */
	uint64_t file_bytes;	    /* size of the complete file, once done (0 before) */
	bool done;
	int error;		    /* 0, or why the save failed */
	uint64_t fault_max_ns;	    /* the slowest fault service */
	bool fault_realtime;	    /* the fault thread ran SCHED_FIFO */
};

/*
 * Create the file and the engine; nothing is armed yet. The regions are
 * copied. -HALITE_E_UNSUPPORTED when the kernel lacks a userfaultfd feature
 * the engine needs (the log says which).
 */
int halite_save_create(struct halite_save **s, const char *path,
		       const struct halite_save_region *regions, uint32_t nregions,
		       const struct halite_save_opts *opts);

/*
 * A page-table root of the guest (CR3 and paging mode) for the background
 * walk; may be called before arm and while the save runs. Thread-safe.
 */
int halite_save_add_root(struct halite_save *s, const struct halite_root *root);

/* Attach the hypervisor's device state, stored verbatim. Before arm. */
int halite_save_set_device_state(struct halite_save *s, const void *data, uint64_t len);

/*
 * A metadata entry of the file (halite_writer_set_meta(): key 1..255 bytes,
 * value up to 1 MiB, each key once), e.g. which hypervisor and machine the
 * memory belongs to. Before arm; copied.
 */
int halite_save_set_meta(struct halite_save *s, const char *key, const void *value, uint32_t len);

/*
 * The snapshot instant: call with the guest paused. Arms copy-on-access on
 * every region and starts the engine's threads; returns so the caller can
 * resume the guest at once.
 */
int halite_save_arm(struct halite_save *s);

/*
 * Wait until the save completes (0) or fails (< 0, the guest's memory left as
 * if no save had happened). @timeout_ms < 0 waits forever; -ETIMEDOUT if
 * still running after it.
 */
int halite_save_wait(struct halite_save *s, int timeout_ms);

/* Stop a running save as a failure (-ECANCELED) and wait for it. */
int halite_save_cancel(struct halite_save *s);

/* A consistent copy of the statistics, at any time. Thread-safe. */
void halite_save_stats(struct halite_save *s, struct halite_save_stats *st);

/* Free; a running save is cancelled first. NULL is fine. */
void halite_save_free(struct halite_save *s);

/* Detail of the failure, "" if none. */
const char *halite_save_errmsg(const struct halite_save *s);

#ifdef __cplusplus
}
#endif
#endif /* HALITE_SAVE_H */
