/* SPDX-License-Identifier: MIT */
/*
 * Private to the restore engine: its state, shared by its source files.
 *
 * restore.c   the engine: open, start, the LB states, demand readers, install
 *             pool, fault thread, prefetcher, the end (its top comment is the
 *             design)
 * huge.c      hugetlbfs regions, whose unit of installation is the huge page
 * learn.c     HALITE_RESTORE_LEARN: the guest's first touches, recorded
 * learned.c   the trace's writing and the template's reading of its touch
 *             lines, shared with the template source (learned.h)
 *
 * Locks and states are described at the top of restore.c.
 */
#ifndef HALITE_RESTORE_INT_H
#define HALITE_RESTORE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <halite/restore.h>

#include "gmem.h"
#include "io.h"
#include "learned.h"
#include "log_internal.h"
#include "pool.h"
#include "stats.h"

/* Stream readahead: the queue of LBs to read ahead. */
#define RA_QUEUE 256u

enum { MB_NONE, MB_CLAIMED, MB_INSTALLED, MB_STAGED };
enum { LB_IDLE, LB_READING, LB_CACHED, LB_DONE, LB_FAILED };
enum { HOW_NONE, HOW_DEMAND, HOW_PREFETCH };
/* Who installed a block: which counter it goes to. */
enum { BY_FAULT, BY_POOL, BY_PREFETCH };
enum { S_CREATED, S_RUNNING, S_DONE, S_FAILED };

struct rregion {
	char *name;
	uint64_t host, length;
	int kind;
	uint64_t first_mb, nmb; /* as in the file: regions are kept in file order */
	int fd;			/* SHARED: our dup of the file, else -1 */
	uint64_t fd_off;
	bool registered;
	bool discards_refused;	/* we made the file append-only: undo at the end */
	/* hugetlbfs (huge.c): */
	uint64_t hpage;		/* its page size, the unit of installation; 0: not hugetlbfs */
	uint64_t first_hp;	/* its first page in r->hps */
	uint8_t *map;		/* our shared mapping of its file range: blocks are decoded here */
};

/* A fault waiting for its LB's read. */
struct waiter {
	struct waiter *next;
	uint64_t mb;
	uint64_t t0; /* message read */
};

struct rlb {
	_Atomic uint8_t state;	 /* written under lk */
	uint8_t how;		 /* HOW_*: set when the read lands; under lk */
	uint32_t refs;		 /* holders of buf; under lk */
	uint8_t *buf;		 /* CACHED: verified bytes; under lk */
	struct waiter *waiters;	 /* READING: newest first; under lk */
	uint64_t t_ns;		 /* when the read landed, since ready; under lk */
	uint64_t fault_mb;	 /* DEMAND: the block whose fault read it; under lk */
	uint8_t *stage;		 /* TRACK_ACCESS demand LBs, any LB while learning: decoded
				    blocks, by member index */
	uint32_t staged;	 /* TRACK_ACCESS demand LBs: members - 1; under lk */
	_Atomic uint32_t accessed; /* ... of which the guest touched before the end */
};

/* A huge page of a hugetlbfs region (huge.c). */
struct rhp {
	_Atomic uint32_t written; /* stored blocks decoded into it */
	_Atomic uint32_t stored;  /* its stored blocks + 1 once counted; 0 before */
	_Atomic uint8_t alloc;	  /* allocated in the file */
	_Atomic uint8_t in;	  /* complete and mapped for the guest; set under lk */
	_Atomic uint8_t wanted;	  /* a fault waits for it; set under lk */
	struct waiter *waiters;	  /* faults to count as served when it comes in; under lk */
};

struct itask {
	struct halite_restore *r;
	uint64_t lb;
	uint8_t *buf;
};

struct halite_restore {
	struct halite_restore_opts o;
	char *path;
	struct halite_reader *rd;
	const struct halite_file_info *fi;
	struct rregion *regions; /* file order */
	uint32_t nregions;
	uint32_t *by_host;	 /* region indices sorted by host address */
	uint32_t mb_size, lb_size;
	uint64_t mb_total, lb_total, mb_zero;
	uint64_t page;		 /* host page size */
	bool external, has_shared, track, has_copy;
	bool has_huge;		 /* a region is on hugetlbfs */
	struct rhp *hps;	 /* the huge pages of hugetlbfs regions, regions in file order */
	uint64_t nhp;
	_Atomic uint8_t *mb;	 /* MB_* per memory block */
	struct rlb *lbs;

	int uffd, stop_fd, fd;	 /* fd: for dropping cached LB pages before a retry */
	struct halite_gmem *gm;	 /* every install and wake, and the uffd's events */
	struct halite_io *pf_io; /* the prefetcher's, NULL with NO_PREFETCH */
	struct halite_pool *pool;
	pthread_t fault_thr, pf_thr, *rd_thr;
	unsigned readers_started;
	bool fault_started, pf_started, started;
	uint8_t *fault_tmp;	 /* the fault thread's decode buffer */

	pthread_mutex_t lk;	 /* LB states, waiters, the demand and readahead queues */
	pthread_cond_t q_cond;
	uint64_t *q;		 /* demand queue: a ring of LB indices */
	size_t q_cap, q_head, q_len;
	/*
	 * Stream readahead: ra_next[lb] is 1 + the next LB of lb's stream (file
	 * order), 0 until looked up, UINT64_MAX for none (rs_ra_next()); raq a
	 * ring of LBs to read ahead,
	 * oldest dropped when full; ra_busy readers reading one now.
	 */
	uint64_t *ra_next;
	uint64_t raq[RA_QUEUE];
	size_t raq_head, raq_len;
	unsigned ra_busy, ra_readers;
	bool inline_reads;	 /* buffered, no added latency: read_cached() may read */
	_Atomic uint64_t lb_done, lbs_cached;

	pthread_mutex_t st_lock; /* state, error, errmsg */
	pthread_cond_t st_cond;
	int state, error;
	bool ending;
	_Atomic bool failed, stopping;
	_Atomic bool ended;	 /* finish() is unregistering: the restore is done */
	_Atomic uint64_t last_fault_ns;
	uint64_t open_ns, ready_at, ready_ns, done_ns;

	_Atomic uint64_t n_mb[3]; /* BY_* */
	uint64_t n_mb_present;	  /* ATTACH: found in memory at start */
	_Atomic uint64_t n_faults, n_faults_cached, n_faults_zero, n_faults_vcpu;
	_Atomic uint64_t n_lb_demand, n_lb_prefetch, n_lb_retries, n_bytes_read;
	_Atomic uint64_t n_staged, n_staged_accessed;
	struct halite_hist hist;
	/*
	 * A relayouted file's hot prefix (opts.hot_prefix_max): the prefetcher
	 * reads LBs 0..hot_lbs-1 first, unthrottled; n_lb_hot of them so far.
	 */
	uint64_t hot_lbs;
	_Atomic uint64_t n_lb_hot;

	/*
	 * HALITE_RESTORE_LEARN (learn.c). @learning from ready until the
	 * window ends or the restore does; the touches, @touched (one byte per
	 * MB: recorded) and @learning's clearing are under learn_lk.
	 */
	bool learn;
	_Atomic bool learning;
	bool learn_complete;	 /* the restore ended while learning */
	uint64_t learn_end_ns;	 /* the window's end, absolute; 0: until done */
	pthread_mutex_t learn_lk;
	uint8_t *touched;
	struct learn_touch *touches;
	size_t ntouches, touches_cap;

	struct halite_logger log;
	char errmsg[256];
};

#define ULL(x) ((unsigned long long)(x))

/* Where a fault is: its page (region index, offset), whether a write, when read. */
struct fault {
	uint32_t ri;
	uint64_t off;
	bool write;
	uint64_t t0;
};


/* ---- restore.c, for the engine's other files ---- */

/* The first message wins (save.c's sfail); returns -|err|. */
__attribute__((format(printf, 3, 4)))
int rs_fail(struct halite_restore *r, int err, const char *fmt, ...);
/* The first error wins; nothing is installed from here on. */
void rs_set_failed(struct halite_restore *r, int err);
const struct rregion *rs_region_of_mb(const struct halite_restore *r, uint64_t mb);
/* CAS of memory block @mb from @from to MB_CLAIMED. */
bool rs_claim(struct halite_restore *r, uint64_t mb, uint8_t from);
/* What a failed install says about itself; returns the error. */
int rs_install_failed(struct halite_restore *r, int ret, uint64_t mb, const char *how);
/* A claimed block is in: counted (BY_*), then MB_INSTALLED. */
void rs_installed(struct halite_restore *r, uint64_t mb, int by);
/* A fault served: its service time (message read to wake) into the histogram. */
void rs_fault_served(struct halite_restore *r, uint64_t t0);
/* Under lk: queue @lb (READING) for the demand readers. 0 or -ENOMEM. */
int rs_queue_push(struct halite_restore *r, uint64_t lb);
/* Under lk: stream readahead after a demand read of @lb; how many readers to signal. */
size_t rs_ra_push(struct halite_restore *r, uint64_t lb);
/* Under lk: @lb's successor in its stream, or UINT64_MAX (looked up on first use). */
uint64_t rs_ra_next(struct halite_restore *r, uint64_t lb);
/* The fault thread reads @lb (READING) itself if all of it is in the page cache. */
bool rs_read_cached(struct halite_restore *r, uint64_t lb);

/* Install a block claimed from STAGED, from its LB's stage (@flags: gmem). 0 or -errno. */
int rs_install_staged(struct halite_restore *r, uint64_t lb, uint64_t mb, unsigned flags);
/* The counter (BY_POOL, BY_PREFETCH) for a staged block of @lb, installed unasked. */
int rs_staged_by(struct halite_restore *r, uint64_t lb);

/* ---- learn.c: HALITE_RESTORE_LEARN ---- */

/* At open: the touch map. 0 or -ENOMEM. */
int rs_learn_init(struct halite_restore *r);
void rs_learn_free(struct halite_restore *r);
/* The fault thread: a fault on block @mb (@kind its state), from thread @tid, at @t0. */
void rs_learn_fault(struct halite_restore *r, uint64_t mb, int kind, uint32_t tid, uint64_t t0);
/* The fault thread's poll timeout while learning (ms, -1: none); ends the window when due. */
int rs_learn_tick(struct halite_restore *r);
/* The restore ends (done: @done): learning stops; the trace's "complete" says if it saw it. */
void rs_learn_stop(struct halite_restore *r, bool done);
/* docs/restore-trace.md's learn and touch lines. */
void rs_learn_write(struct halite_restore *r, FILE *f);

/* ---- huge.c: hugetlbfs regions ---- */

/*
 * At open, a shared region with its fd: on hugetlbfs, its page size (the
 * alignment checked) and our mapping of it. 0 (not hugetlbfs too) or -errno.
 */
int rs_huge_region(struct halite_restore *r, struct rregion *g);
/* After every region: the huge pages' records. 0 or -ENOMEM. */
int rs_huge_init(struct halite_restore *r);
void rs_huge_free(struct halite_restore *r);
/* At start: -EEXIST (with the message) when the file range holds a page. */
int rs_huge_check_empty(struct halite_restore *r, const struct rregion *g);
/* ATTACH: the pages the owner maps (@bits: one per host page of @g) are in. */
void rs_huge_attach(struct halite_restore *r, const struct rregion *g, const uint64_t *bits);
/*
 * Decode stored block @mb (claimed, of a hugetlbfs region) from verified LB
 * @lb_buf into its page and count it (@by); the page's last block makes
 * the page visible and wakes its faults. 0 or -errno (with the message).
 */
int rs_huge_write(struct halite_restore *r, uint64_t mb, const uint8_t *lb_buf, int by);
/* Does a fault wait for the huge page of @mb (false if not on hugetlbfs)? */
bool rs_huge_wanted(struct halite_restore *r, uint64_t mb);
/* Is the huge page of @mb (on hugetlbfs) complete and visible? */
bool rs_huge_in(struct halite_restore *r, uint64_t mb);
/* The fault thread: a fault on block @mb of a hugetlbfs region. */
void rs_huge_fault(struct halite_restore *r, uint64_t mb, const struct fault *f);

#endif
