/* SPDX-License-Identifier: MIT */
/*
 * Private: the save engine's shared state, for its files (save.c, arm.c,
 * background.c, fault.c, stream.c, state.c): the engine, its regions and queued
 * blocks, the claim protocol's helpers the fault path inlines, and the
 * calls one file makes into another.
 */
#ifndef HALITE_SAVE_INT_H
#define HALITE_SAVE_INT_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <halite/save.h>

#include "defer.h"
#include "endian_util.h"
#include "gmem.h"
#include "log_internal.h"
#include "pool.h"
#include "stats.h"
#include "save_test.h"

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

/*
 * Claiming: each block has one claim byte, taken once by whichever of the
 * two producers gets there first; only the claimer queues it, so every block
 * is saved exactly once. Anonymous: the shadow is never written, so a fault
 * on a block the background claimed is answered from the shadow at once (the
 * background's copy then fails with EEXIST, a normal race). Shared: the
 * claim goes FREE -> COPYING -> READY, and a fault on a COPYING block waits
 * for the claimer's memcpy (bounded, no I/O) before giving the block back:
 * the guest must not write a page before its snapshot bytes are copied.
 * Once the writer has stored a block it marks it SAVED.
 */
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

static inline const struct sregion *region_of_mb(const struct halite_save *s, uint64_t mb)
{
	return &s->regions[halite_find_first_mb(s->regions, s->nregions, sizeof(s->regions[0]),
						offsetof(struct sregion, first_mb), mb)];
}

static inline bool given_back(const struct halite_save *s, uint64_t mb)
{
	return atomic_load(&s->given[mb / 64]) & (1ull << (mb % 64));
}

/*
 * Take the claim on @mb: true if this thread saves it. Shared memory: the
 * claimer copies the block to the shadow before marking it READY; a thread
 * that lost waits for READY before the block may be given back.
 */
static inline bool claim_block(struct halite_save *s, uint64_t mb)
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
static inline void backoff(unsigned *turns)
{
	struct timespec ts = { 0, 20000 };

	if ((*turns)++ < 16)
		sched_yield();
	else
		nanosleep(&ts, NULL);
}

static inline void wait_ready(struct halite_save *s, uint64_t mb)
{
	unsigned turns = 0;

	/* The claimer is inside a memcpy of one block: no I/O, no lock. */
	while (atomic_load(&s->claim[mb]) == CLAIM_COPYING)
		backoff(&turns);
}

static inline size_t item_size(const struct halite_save *s)
{
	return sizeof(struct item) + s->mb_size;
}

/*
 * Internal checks (SAVE_CHECK) guard the invariants a bug would break; a
 * failed check fails the save like an I/O error, with HALITE_E_INTERNAL,
 * and the guest's memory is given back exactly as for any other failure.
 * Tests make a check fail on purpose with halite_save_test_fail_check().
 */
#define SAVE_CHECK(s, cond, ...) \
	((cond) && !check_injected(s) ? 0 : sfail(s, -HALITE_E_INTERNAL, __VA_ARGS__))

static inline bool check_injected(struct halite_save *s)
{
	uint64_t n = atomic_load_explicit(&s->test_check_after, memory_order_relaxed);

	return n && atomic_fetch_sub(&s->test_check_after, 1) == 1;
}

/* Calls between the files, each file calling only those listed after it. */

/* arm.c: a region's set-up at create, arming it, and undoing that. */
int save_map_view(struct halite_save *s, struct sregion *r);
int save_open_uffd(struct halite_save *s, uint64_t *missing);
int save_make_gmem(struct halite_save *s);
int save_arm_region(struct halite_save *s, struct sregion *r);
void save_disarm_regions(struct halite_save *s, uint32_t n);
void save_allow_discards(struct halite_save *s);

/* background.c */
int save_copies(struct halite_save *s);
void *save_bg_main(void *arg);

/* fault.c: the fault thread, and a block's snapshot bytes and give-back. */
void *save_fault_main(void *arg);
int save_block_touched(struct halite_save *s, const struct sregion *r, uint64_t mb);
int save_give_back(struct halite_save *s, const struct sregion *r, uint64_t mb, unsigned flags);
int save_read_huge(const struct sregion *r, uint64_t off, void *dst, uint64_t len);
int save_read_aside(struct halite_save *s, const struct sregion *r, uint64_t off, void *dst,
		    uint64_t len);
int save_copy_claimed(struct halite_save *s, const struct sregion *r, uint64_t mb, uint64_t n,
		      int touched);

/* stream.c: queueing blocks for the compression pool and the writer. */
struct item *save_item_new(struct halite_save *s, uint64_t mb, uint32_t stream, bool touched);
int save_enqueue(struct halite_save *s, struct item *it);
void save_release_block(struct halite_save *s, uint64_t mb);
void *save_writer_main(void *arg);

/* state.c: the first failure, and what the engine reports. */
__attribute__((format(printf, 3, 4)))
int sfail(struct halite_save *s, int err, const char *fmt, ...);
void save_set_failed(struct halite_save *s, int err);

#endif
