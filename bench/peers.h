/* SPDX-License-Identifier: MIT */
/*
 * Restore methods, measured alike by halite-bench (bench/micro.c): the ways
 * of bringing one snapshot's memory into a guest that issue 5 compares.
 *
 * Every method restores the same contents into guest memory it maps itself
 * (method_prepare), before the synthetic guest exists: the bench then creates
 * the guest on that memory (SYNTH_F_ATTACH with synth_opts.mem_host), seeks
 * its vCPUs to where the snapshot left them, calls method_start() and
 * resumes the vCPUs the moment it returns. The clock runs from just before
 * method_start(): a method's own preparation (reading everything, loading a
 * working set, opening a file) is part of its restore time.
 *
 * "Storage" is the file a method reads. Each read request it issues counts
 * once in storage_reads (a 64 KiB locality block is one, a 4 KiB page is
 * one); for mmap-private, where the kernel reads, bytes_read is the page
 * cache that mapping brought in, and storage_reads is, cold or with read
 * latency, the read requests the FUSE file system serving the file answered
 * (exact), and warm without latency the major faults taken on the mapping
 * (0: the file is cached). See peers.c for every method's counts.
 * read_latency_us applies to every read request, in every
 * method the same way and as the engine applies it (halite/src/io.c): a
 * read completes no earlier than read_latency_us after it was issued, so it
 * costs max(device time, latency); for mmap-private the file is served
 * through a FUSE file system that does this (bench/delayfs.c), because the
 * kernel's reads cannot be delayed or counted otherwise (FUSE adds its own
 * cost per request, some microseconds). cold: the file's page cache is dropped first
 * (fdatasync, POSIX_FADV_DONTNEED, in method_prepare()) and methods that
 * read themselves use O_DIRECT.
 */
#ifndef HALITE_BENCH_PEERS_H
#define HALITE_BENCH_PEERS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <halite/restore.h>

enum method_kind {
	/* The Halite restore engine on one of the organisation files (bench/relayout.h). */
	METHOD_HALITE,
	/* Read the whole raw image, install it, then resume (QEMU loadvm, mapped-ram). */
	METHOD_EAGER,
	/* userfaultfd, one 4 KiB page read per fault from the raw image, one handler
	 * thread (the paper's ESXi baseline; Firecracker's example uffd handler). */
	METHOD_4K,
	/* MAP_PRIVATE of the raw image: the kernel's paging and readahead
	 * (Firecracker's File backend). */
	METHOD_MMAP,
	/* REAP-style: the pages first touched during the save window (the vCPU
	 * streams) read from a working-set file and installed before resume, the
	 * rest 4 KiB per fault from the raw image. */
	METHOD_WS,
};

/*
 * The working-set file METHOD_WS loads (written by bench/relayout.c): the
 * pages of the memory blocks in the snapshot's vCPU streams (first touched
 * during the save window), in stream order, vCPU 0's stream first, zero
 * pages left out: records of WS_REC bytes, a little-endian u64 guest-physical
 * address then the 4096 bytes of the page. No header; the size is the count.
 */
#define WS_PAGE 4096u
#define WS_REC (8u + WS_PAGE)

struct method_cfg {
	int kind;			/* enum method_kind */
	const char *hlt_path;		/* METHOD_HALITE: the file restored */
	const char *raw_path;		/* the raw image: guest memory in physical order,
					   holes where zero or never touched */
	const char *ws_path;		/* METHOD_WS: the working-set file (relayout.h) */
	const char *region;		/* METHOD_HALITE: the file's region name */
	uint64_t mem_bytes;		/* guest memory, one region at GPA 0 */
	uint32_t read_latency_us;	/* added to every read request */
	bool cold;			/* drop the file's page cache first; O_DIRECT */
	unsigned halite_flags;		/* METHOD_HALITE: HALITE_RESTORE_* (TRACK_ACCESS) */
	const pid_t *vcpu_tids;		/* METHOD_HALITE: for per-vCPU fault counts; not
					   copied: read at method_start(), so it may be
					   filled in after method_prepare() */
	unsigned nvcpus;
	const char *fuse_dir;		/* METHOD_MMAP with latency: an empty directory
					   to mount the delaying file system on */
};

struct method_result {
	uint64_t storage_reads;		/* read requests to storage (see above) */
	/*
	 * Of those, the reads a fault waited for: halite the LBs read on demand
	 * (first reads; retries are in storage_reads only), 4k-on-demand and working-set the 4 KiB fault
	 * reads, eager none, mmap-private all (the kernel's reads for faults
	 * and its readahead cannot be told apart).
	 */
	uint64_t demand_reads;
	uint64_t bytes_read;
	uint64_t demand_faults;		/* faults the method served (mmap: major faults) */
	double vm_access_pct;		/* < 0: not measured or does not apply */
	double start_s;			/* method_start(): until the guest may resume */
	double done_s;			/* from method_start() until all memory was in;
					   < 0 if the method has no such moment
					   (4k-on-demand, working-set, mmap) */
	/* METHOD_HALITE: the engine's own statistics (fault p50/p99, staging, ...). */
	bool have_engine;
	struct halite_restore_stats engine;
};

struct method;

/*
 * Map guest memory for @cfg (mem_bytes, private, never touched) and get
 * ready; *mem is where the guest must live. 0 or -errno, with a message on
 * stderr naming what failed.
 */
int method_prepare(struct method **m, const struct method_cfg *cfg, void **mem);

/*
 * Bring in what must be in before the guest resumes and start serving its
 * faults; returns when the guest may resume. 0 or -errno.
 */
int method_start(struct method *m);

/*
 * After the guest finished its run: wait (at most @timeout_ms) until the
 * method has brought everything in, stop its threads, fill @res. 0 or
 * -errno (-ETIMEDOUT, with @res filled with the counts so far). Memory
 * 4k-on-demand and working-set never brought in (the guest did not touch
 * it) reads as zeros after this: compare memory with the snapshot before.
 */
int method_finish(struct method *m, int timeout_ms, struct method_result *res);

/* Stop everything, unmap guest memory (after synth_free() of its guest). NULL is fine. */
void method_free(struct method *m);

const char *method_name(int kind);

#endif
