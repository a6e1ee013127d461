/* SPDX-License-Identifier: MIT */
/*
 * Shared by the programs that write a small snapshot and real restore traces
 * of it, this thread being the one vCPU: tests/inspect/mkrestore.c (traces
 * restore.sh checks exactly) and tests/fuzz/trace_seed_gen.c (trace.hlt and
 * the seed traces of the fuzz corpus). Each describes its snapshot in a
 * struct rg_snap and keeps its own layout and runs.
 *
 * Everything here dies on failure (a message prefixed with the program's
 * name, exit 1), so that the callers read as the steps they take.
 */
#ifndef HALITE_RESTORE_GEN_H
#define HALITE_RESTORE_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <halite/halite.h>
#include <halite/restore.h>

#define RG_PAGE 4096u
#define RG_MAX_MEMBERS 4u
/* rg_run_open() log level: no log at all, for runs meant to fail. */
#define RG_LOG_NONE (-1)

/* A snapshot of one region "ram" and one vCPU, and what its reader must say of it. */
struct rg_snap {
	uint8_t *image;	   /* len bytes: what rg_put() stores, what a restore gives back */
	size_t len;	   /* of region "ram", a multiple of mb_size */
	uint32_t mb_size;  /* a multiple of RG_PAGE */
	uint32_t nrandom;  /* random bytes at the start of each stored block; the rest zero */
	int codec;	   /* enum halite_codec */
	uint32_t lb_size;
	/* Checked by rg_read_layout(): */
	uint64_t lb_count, mb_stored, mb_zero, mb_untouched;
	const uint8_t *uuid; /* 16 bytes; NULL: any */
	/*
	 * Write format 1.0: a file re-sealed with another uuid (cu_reseal()
	 * knows 1.0's checksums; 1.1's index chunks are seeded by the uuid).
	 */
	bool v1_0;
};

/* One LB of the file as its reader tells it. */
struct rg_lb {
	uint32_t stream, seq, n;
	uint64_t mb[RG_MAX_MEMBERS];
};

/* A restore into private anonymous memory, this thread its vCPU. */
struct rg_run {
	const struct rg_snap *snap;
	struct halite_restore *r;
	uint8_t *mem;
	pid_t tid;
};

void rg_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Dies when @ret < 0, with what failed and halite_strerror(@ret). */
void rg_check(int ret, const char *what);

/*
 * Exits 77 (skip) without userfaultfd and its THREAD_ID feature, then arms a
 * 120 s alarm: this thread faults on guest memory, and a hung engine must
 * not hang the runner.
 */
void rg_begin(void);

/* A writer of @path for @snap: no sync, one vCPU; finish with rg_writer_finish(). */
struct halite_writer *rg_writer_create(const struct rg_snap *snap, const char *path);
/* Fills blocks @first..@first+@n-1 of the image and puts them into @stream. */
void rg_put(struct halite_writer *w, const struct rg_snap *snap, uint32_t stream, uint64_t first,
	    uint64_t n);
/* Finishes and frees @w. */
void rg_writer_finish(struct halite_writer *w);

/*
 * Opens @path, checks its counts against @snap's and reads its snap->lb_count
 * LBs into @lbs, each of 2 to RG_MAX_MEMBERS blocks. The runs are built on
 * this layout: any other dies.
 */
void rg_read_layout(const struct rg_snap *snap, const char *path, struct rg_lb *lbs);

/*
 * Starts a restore of @file into fresh memory with @flags, writing @trace
 * (removed first), logging to stderr up to @log_level (or RG_LOG_NONE).
 * Exits 77 when the engine says the kernel cannot.
 */
void rg_run_open(struct rg_run *run, const struct rg_snap *snap, const char *file,
		 const char *trace, unsigned flags, int log_level);
/* Frees the restore (a cancel if it runs) and its memory; dies when no @trace was written. */
void rg_run_close(struct rg_run *run, const char *trace);

/* Reads page @page of block @mb as the vCPU would: a fault while it is not in. */
void rg_touch(const struct rg_run *run, uint64_t mb, uint32_t page);

/*
 * Waits until @lbs LBs are in and @others blocks of them were installed
 * without a fault of their own (pool and prefetch; with @track,
 * TRACK_ACCESS, staged): the next touch then finds the engine at rest, so
 * its outcome, every count and the trace are what the run meant.
 */
void rg_settle(struct halite_restore *r, uint64_t lbs, uint64_t others, bool track);

#endif
