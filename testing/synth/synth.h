/* SPDX-License-Identifier: MIT */
/*
 * Private: the synthetic guest, a library that behaves like a VM from a
 * snapshot engine's point of view. Used by the save and restore engines'
 * tests and benchmarks; not part of libhalite's ABI.
 *
 * A guest has one memory region "pc.ram" at GPA 0, backed by private
 * anonymous memory or by a memfd. Inside that memory are real x86-64 page
 * tables (4- or 5-level), one address space per vCPU (or one shared), built
 * by a frame allocator that fragments physical memory on purpose. Each vCPU
 * is a thread that translates virtual addresses by walking those tables in
 * guest memory (a software MMU: every walk is real reads of guest memory,
 * which a snapshot engine sees) and then reads or read-modify-writes a 64-bit
 * word at the resulting guest-physical address.
 *
 * The workload is the one of the Halite paper's microbenchmark (section
 * 8.1): each vCPU sequentially over its own region, memory filled with data
 * of a chosen compressibility and allocated with a 16-page stride.
 *
 * Frame allocator. With N frames of memory, the 1 GiB pages come first
 * (frames [0, 2^18 * n1g)), then the 2 MiB pages, both naturally aligned;
 * the rest, frames [H, N) with M = N - H, is the small-frame region. Small
 * frame number k (k = 0, 1, ... in allocation order) is
 *
 *	H + r + j * stride, for the k-th pair (r, j) of
 *	r = 0 .. stride - 1 (a pass), j = 0, 1, ... while r + j * stride < M
 *
 * i.e. consecutive allocations are exactly @stride frames apart, and each
 * pass starts over one frame further on. It is a bijection onto [H, N) for
 * every stride >= 1 (no co-prime fix-up needed, unlike k * stride mod M, and
 * so the paper's stride 16 stays 16); stride 1 is contiguous. Page-table
 * pages and mapped 4 KiB data pages are allocated interleaved, in the order
 * the builder needs them: per vCPU the root, then in virtual-address order
 * each data page preceded by any table page its mapping needs. Then the
 * unmapped data pages ("the rest of the guest's memory", filled), and the
 * last floor(N * untouched_pct / 100) frames of the sequence are never
 * touched.
 *
 * Virtual layout of vCPU v: from vbase + v * vspan (vspan = that extent
 * rounded up to 1 GiB): the 4 KiB pages (every hole_every-th virtual page a
 * hole), padding to 2 MiB, the 2 MiB pages, padding to 1 GiB, the 1 GiB
 * pages. "Units" are the mapped 4 KiB virtual pages (huge pages count 512 or
 * 262144 units) in virtual-address order; the working set is the first
 * ws_bytes / 4096 units.
 *
 * Accesses. Access i of a vCPU with pattern seq touches unit i mod ws_units
 * at word ((i / ws_units) * 8) mod 4096 of that page (each lap moves on a
 * word); random picks the unit and the 8-byte-aligned word uniformly from a
 * per-vCPU xorshift seeded from (seed, vcpu); trace replays recorded
 * (vcpu, vaddr, write) records in order. A write adds SYNTH_WRITE_ADD to the
 * word (so k writes always change it); a read only loads it. A translation
 * that fails (non-present entry, out-of-memory GPA) counts a fault and no
 * memory is touched.
 *
 * Conventions: fallible calls return 0 (or a count) or -errno; out
 * parameters are written only on success; synth_free(NULL) is fine. Control
 * calls (start, pause, resume, stop) may come from any thread and are
 * serialized; nothing may be called concurrently with or after synth_free.
 * In child mode every call is a round trip over a socket, serialized.
 */
#ifndef HALITE_SYNTH_H
#define HALITE_SYNTH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <halite/log.h>

#define SYNTH_MAX_VCPUS 16
#define SYNTH_PAGE_SIZE 4096u
#define SYNTH_REGION_NAME "pc.ram"
/* What a write adds to its 64-bit word: odd, so k writes never cancel out. */
#define SYNTH_WRITE_ADD 0x9e3779b97f4a7c15ull

struct synth_guest;

enum synth_backing {
	SYNTH_MEM_ANON = 0,	/* mmap MAP_PRIVATE | MAP_ANONYMOUS (THP off) */
	SYNTH_MEM_SHARED = 1,	/* memfd_create + mmap MAP_SHARED */
};

enum synth_pattern {
	SYNTH_PAT_SEQ = 0,
	SYNTH_PAT_RANDOM = 1,
	SYNTH_PAT_TRACE = 2,
};

enum synth_log_mode {
	SYNTH_LOG_OFF = 0,
	SYNTH_LOG_ALL = 1,	/* every access (and walk, with SYNTH_F_LOG_WALK) */
	SYNTH_LOG_FIRST = 2,	/* only the first touch of each frame, by any vCPU */
};

/* Run the whole guest in a forked child; the API drives it over a socket. */
#define SYNTH_F_CHILD		(1u << 0)
/* One address space (one CR3) for all vCPUs, like threads of one process. */
#define SYNTH_F_SHARED_AS	(1u << 1)
/* Non-present entries (holes, unused slots) carry junk bits instead of 0. */
#define SYNTH_F_NP_JUNK		(1u << 2)
/*
 * Entries start with A and D clear and the MMU sets them like the hardware
 * does (locked OR), so accesses also write page-table pages. Without it
 * present entries are built with A (and D on leaves) already set and the
 * tables are only ever read.
 */
#define SYNTH_F_AD_BITS		(1u << 3)
/* Trace replay starts over at the end instead of finishing. */
#define SYNTH_F_TRACE_LOOP	(1u << 4)
/* The log also gets the page-table frames each walk reads (SYNTH_LOG_PT). */
#define SYNTH_F_LOG_WALK	(1u << 5)
/*
 * Attach to memory someone else fills: guest memory is mapped but never
 * written (every page a hole, unpopulated), while everything about the
 * layout is computed exactly as for the same options without the flag: the
 * CR3s, the units (synth_vcpu_pages), the frame kinds and every synth_info
 * count. So a guest created with the options of one that was snapshotted,
 * plus this flag, is the empty target of a restore of that snapshot: its
 * vCPUs, once started, walk the page tables the restore brings in. Started
 * before the memory holds them, translations fail (counted as faults).
 */
#define SYNTH_F_ATTACH		(1u << 6)

/* Log entries: a page frame number with these flags. */
#define SYNTH_LOG_PT		(1ull << 63)	/* a page-table frame read by a walk */
#define SYNTH_LOG_WRITE		(1ull << 62)	/* a data access that wrote */
#define SYNTH_LOG_PFN(e)	((e) & ((1ull << 62) - 1))

/*
 * Creation options. Zero means default for every field; set sz (or use
 * SYNTH_OPTS) so older and newer callers both work, see halite_opts_copy.
 */
struct synth_opts {
	size_t sz;
	uint64_t mem_bytes;	/* multiple of 2 MiB, 4 MiB .. 1 TiB; 0 = 1 GiB */
	unsigned nvcpus;	/* 1 .. SYNTH_MAX_VCPUS; 0 = 4 */
	unsigned flags;		/* SYNTH_F_* */
	unsigned backing;	/* enum synth_backing */
	unsigned paging_levels;	/* 4 or 5; 0 = 4 */
	unsigned stride;	/* small-frame allocation stride, >= 1; 0 = 16 */
	unsigned hole_every;	/* 0: no holes; n >= 2: every n-th 4 KiB VA page a hole */
	unsigned huge_2m;	/* 2 MiB pages per vCPU, part of map_bytes */
	unsigned huge_1g;	/* 1 GiB pages per vCPU, part of map_bytes */
	/*
	 * Per vCPU, multiples of 4 KiB: map_bytes mapped in its address space
	 * and filled, of which the first ws_bytes are accessed. ws 0 =
	 * map_bytes if given, else mem_bytes / 4 / nvcpus (the paper: 256 MiB
	 * of 1 GiB over 4 vCPUs); map 0 = ws. nvcpus * map_bytes must fit in
	 * memory with the page tables and the untouched share (-EINVAL).
	 */
	uint64_t map_bytes;
	uint64_t ws_bytes;
	uint64_t vbase;		/* 1 GiB aligned; 0 = 0x7f0000000000 (5-level: 0x7f000000000000) */
	/*
	 * Data: each 256-byte run of a data page has compress_pct percent
	 * random bytes, the rest a pattern, so a page compresses to about
	 * compress_pct percent (t_fill's scheme); 1 .. 100, 0 = 50.
	 * floor(data_pages * zero_pct / 100) data pages are zeroed instead
	 * (written, so populated), chosen uniformly at random; exactly
	 * floor(N * untouched_pct / 100) frames are never touched.
	 */
	unsigned compress_pct;
	unsigned zero_pct;
	unsigned untouched_pct;
	unsigned write_pct;	/* share of accesses that write, 0 .. 100 */
	unsigned pattern;	/* enum synth_pattern */
	uint64_t seed;		/* data, junk, random pattern, writes; 0 = 1 */
	uint64_t max_accesses;	/* per vCPU, then it parks as done; 0 = no limit */
	unsigned tlb_entries;	/* direct-mapped per-vCPU TLB; 0 = walk every access */
	unsigned log_mode;	/* enum synth_log_mode */
	uint64_t log_entries;	/* per-vCPU log capacity; 0 = 65536 when logging */
	const char *trace_in;	/* SYNTH_PAT_TRACE: the trace to replay */
	const char *trace_out;	/* record every access to this file (any pattern) */
	halite_log_fn log_fn;	/* error details; NULL: silent */
	void *log_ctx;
	/*
	 * Guest memory mapped by the caller (mem_bytes, page aligned, private:
	 * anonymous, or MAP_PRIVATE of an image file), used instead of mapping
	 * some: only with SYNTH_F_ATTACH in this process and backing ANON. The
	 * guest never unmaps it; the caller does, after synth_free(). Lets a
	 * restore method choose how memory comes in (a userfaultfd range, a
	 * file's pages through the kernel's paging, an eager copy).
	 */
	void *mem_host;
};

#define SYNTH_OPTS(name, ...) struct synth_opts name = { .sz = sizeof(struct synth_opts), __VA_ARGS__ }

/*
 * Create a guest, paused: memory mapped and filled, page tables built, vCPU
 * threads started and parked (their tids known). With SYNTH_F_CHILD all of
 * that happens in a forked child, which closes every inherited descriptor
 * but stdio and its socket; fork while this process has no other threads
 * if it runs under ThreadSanitizer. Returns 0 or -errno: -EINVAL
 * for bad options (details through log_fn), -ENOMEM, errors from mmap,
 * memfd_create, the trace files, fork.
 */
int synth_create(struct synth_guest **g, const struct synth_opts *opts);

/*
 * Stop (if running), join the vCPUs, unmap, close. In child mode waits up to
 * 10 s for the child to exit, then kills it: close (or keep serving) any
 * userfaultfd armed on the guest first, or a vCPU blocked in a fault holds
 * the child up. NULL is fine.
 */
void synth_free(struct synth_guest *g);

/*
 * Control. start: created -> running (-EALREADY after). pause: returns once
 * every vCPU is parked between two accesses (an access is never split);
 * 0 when already paused. pause_timed: the same, -ETIMEDOUT after
 * @timeout_ms (the guest stays pausing: vCPUs park as soon as they can, e.g.
 * when a userfault they are blocked in is resolved). resume: paused ->
 * running, 0 when running, -EINVAL before start. stop: vCPUs finish their
 * access and exit, the trace is flushed; memory stays readable until free;
 * idempotent. After stop, start/pause/resume return -ESRCH.
 */
int synth_start(struct synth_guest *g);
/*
 * Before synth_start(): let @vcpu begin at step @accesses of its pattern
 * instead of 0, exactly where a guest with the same options was after that
 * many accesses (its random state advanced to match), as a restored vCPU
 * resumes where the snapshot left it. max_accesses still counts from 0.
 * 0, -EINVAL (no such vCPU), -EBUSY once started, -ENOTSUP in child mode.
 */
int synth_vcpu_seek(struct synth_guest *g, unsigned vcpu, uint64_t accesses);
/*
 * While the guest is not running (created or paused):
 * @vcpu is done once it has made @accesses accesses (0: no limit), instead
 * of max_accesses. A vCPU done by its old limit runs on when resumed, so a
 * run can be stopped at an exact step and continued (halite-bench micro
 * --trace snapshots a trace at its exact midpoint). 0, -EINVAL (no such
 * vCPU), -EBUSY while running, -ENOTSUP in child mode.
 */
int synth_vcpu_limit(struct synth_guest *g, unsigned vcpu, uint64_t accesses);
int synth_pause(struct synth_guest *g);
int synth_pause_timed(struct synth_guest *g, unsigned timeout_ms);
int synth_resume(struct synth_guest *g);
int synth_stop(struct synth_guest *g);

/*
 * Wait until every vCPU is done (max_accesses reached or trace finished):
 * 0, -ETIMEDOUT after @timeout_ms (0 = forever), -EINVAL if no vCPU can
 * finish (no max_accesses, looping or no trace).
 */
int synth_wait_done(struct synth_guest *g, unsigned timeout_ms);

struct synth_info {
	void *host_addr;	/* the memory in the owner process (the child's in child mode) */
	void *local_addr;	/* readable here: host_addr, the memfd mapped in the
				 * parent (child mode, shared) or NULL (child mode, anon) */
	uint64_t mem_bytes;
	uint64_t gpa_base;	/* 0: one region, SYNTH_REGION_NAME */
	int memfd;		/* shared backing; owned by the guest, valid until free; else -1 */
	pid_t owner_pid;	/* process holding the memory and the vCPU threads */
	unsigned nvcpus;
	unsigned paging_levels;
	unsigned backing;
	unsigned stride;
	uint64_t huge1g_base_pfn, huge2m_base_pfn;
	uint64_t small_base_pfn;	/* H above */
	uint64_t small_frames;		/* M */
	uint64_t small_used;		/* allocations for page tables and mapped pages */
	uint64_t pt_frames;		/* page-table frames */
	uint64_t data_frames;		/* mapped + unmapped data frames (zeroed ones included) */
	uint64_t zero_frames;		/* data frames left all-zero */
	uint64_t untouched_frames;
};

/* Fill *info. 0 or -EINVAL (NULL). Thread-safe. */
int synth_info(const struct synth_guest *g, struct synth_info *info);

struct synth_vcpu_info {
	pid_t tid;		/* gettid() of the vCPU thread, in the owner process */
	uint64_t cr3;		/* root table GPA (PML4, or PML5 with 5-level paging);
				 * may be 0: vCPU 0's root is the first small frame */
	unsigned paging_levels;	/* 4 or 5 */
	uint64_t vbase;		/* first VA of the vCPU's mapping */
	uint64_t vspan;		/* VA extent reserved for it (a multiple of 1 GiB) */
	uint64_t map_units;	/* mapped 4 KiB virtual pages */
	uint64_t ws_units;	/* of which the first ws_units are accessed */
};

/* Fill *info for @vcpu: 0 or -EINVAL. Thread-safe. */
int synth_vcpu_info(const struct synth_guest *g, unsigned vcpu, struct synth_vcpu_info *info);

/*
 * The builder's record (not a walk) of @vcpu's units first .. first+n-1:
 * virtual address and the GPA it maps to. Either array may be NULL. Returns
 * the number written (0 past the end) or -EINVAL.
 */
int synth_vcpu_pages(struct synth_guest *g, unsigned vcpu, uint64_t first,
		     uint64_t *va, uint64_t *gpa, size_t n);

/* What a frame was made at creation: */
enum synth_frame_kind {
	SYNTH_FRAME_UNTOUCHED = 0,	/* never written */
	SYNTH_FRAME_PT = 1,		/* a page-table page */
	SYNTH_FRAME_MAPPED = 2,		/* data mapped in a vCPU's address space */
	SYNTH_FRAME_UNMAPPED = 3,	/* data mapped nowhere */
};
#define SYNTH_FRAME_ZERO 0x80		/* or-ed into a data kind: zeroed */

/* Kinds of frames first .. first+n-1 into kinds[]: count written or -EINVAL. */
int synth_frame_kinds(struct synth_guest *g, uint64_t first, uint8_t *kinds, size_t n);

struct synth_vcpu_stats {
	uint64_t accesses;	/* steps taken, faults included */
	uint64_t writes;
	uint64_t faults;	/* translations that failed */
	uint64_t walks;		/* page-table walks (accesses minus TLB hits) */
	uint64_t log_len;
	uint64_t log_dropped;	/* entries that did not fit */
	int done;
};

/* Counters of @vcpu, read atomically one by one. Any time. 0 or -EINVAL. */
int synth_vcpu_stats(struct synth_guest *g, unsigned vcpu, struct synth_vcpu_stats *st);

/*
 * Copy @vcpu's log entries off .. off+max-1 (see SYNTH_LOG_*) to out[].
 * Returns the number copied. Entries are appended while running; what is
 * returned is a consistent prefix.
 */
int synth_log_read(struct synth_guest *g, unsigned vcpu, uint64_t off, uint64_t *out, size_t max);

/* Empty every log and the first-touch set. Not while running (-EBUSY). */
int synth_log_reset(struct synth_guest *g);

/* Write buffered trace records out. Not while running (-EBUSY). */
int synth_trace_flush(struct synth_guest *g);

/*
 * Snapshot ground truth: copy guest memory [gpa, gpa+len) (page aligned) to
 * buf as it is now. Not while running (-EBUSY): pause first, that is the
 * snapshot instant. Never-touched memory reads as zeros and stays
 * unpopulated (anon: mincore / the child's pagemap; shared: pread on the
 * memfd, which does not fill holes). In child mode through the memfd or
 * process_vm_readv.
 */
int synth_copy_range(struct synth_guest *g, uint64_t gpa, uint64_t len, void *buf);
int synth_copy_memory(struct synth_guest *g, void *buf);

/*
 * For engines working from outside. synth_get_uffd: a userfaultfd created
 * in the owner process (O_CLOEXEC | O_NONBLOCK, no UFFDIO_API done: the
 * caller does it), passed over SCM_RIGHTS in child mode; the caller owns it.
 * -EPERM/-ENOSYS when the kernel refuses. synth_madvise_dontneed: the owner
 * does madvise(MADV_DONTNEED) on its mapping of [gpa, gpa+len) (page
 * aligned): with shared backing the data stays in the memfd and only the
 * owner's page-table entries go (what arming minor faults needs); with anon
 * backing the data is gone.
 */
int synth_get_uffd(struct synth_guest *g);
int synth_madvise_dontneed(struct synth_guest *g, uint64_t gpa, uint64_t len);

/*
 * Trace file: a 32-byte header, "HSYNTRC1", u32 version 1, u32 record size
 * 16, u32 nvcpus, u32 0, u64 0; then records: u64 vaddr, u32 vcpu, u32
 * flags (bit 0 write, others 0); all little-endian. Records of one vCPU are
 * in its access order; vCPUs' records interleave in chunks.
 */
#define SYNTH_TRACE_MAGIC "HSYNTRC1"
#define SYNTH_TRACE_HDR 32u
#define SYNTH_TRACE_REC 16u
#define SYNTH_TRACE_WRITE 1u

const char *synth_pattern_name(unsigned pattern);

#endif
