/* SPDX-License-Identifier: MIT */
/*
 * Private to the restore engine: its state, shared by its source files.
 *
 * A single restore is a session (guest_session.h: the userfaultfd, the
 * regions, gmem, the fault thread, the counters, the error and the end)
 * over a snapshot source (source.h), with the copy install strategy:
 *
 * restore.c   the lifecycle: open, start (copies filled), wait, free
 * state.c     the error and the end, through the session
 * install.c   installs, stages, the install pool, an LB landing, the finish
 * fault.c     the copy strategy's fault path (the session's gs_ops)
 * prefetch.c  what the restore asks of its snapshot source (source.h: the
 *             LB states, readers, readahead, page-cache reads, retries, the
 *             prefetcher): its callbacks, the hot prefix read first
 * report.c    stats and the trace
 * register.c  what the session registers (modes, features), discards
 * attach.c    what memory holds at start: populated refused, or taken over
 * huge.c      hugetlbfs regions, whose unit of installation is the huge page
 * learn.c     HALITE_RESTORE_LEARN: the guest's first touches, recorded
 * learned.c   the trace's writing and the template's reading of its touch
 *             lines, shared with the template source (learned.h)
 *
 * The design (states, locks, threads, wake rules) is docs/architecture.md.
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

#include "endian_util.h"
#include "gmem.h"
#include "guest_session.h"
#include "io.h"
#include "learned.h"
#include "log_internal.h"
#include "pool.h"
#include "source.h"
#include "stats.h"

enum { MB_NONE, MB_CLAIMED, MB_INSTALLED, MB_STAGED };
/* How an LB came in: the source's SRC_* (nothing yet: HOW_NONE). */
enum { HOW_NONE, HOW_DEMAND = SRC_DEMAND, HOW_PREFETCH = SRC_PREFETCH };
/* Who installed a block: which counter it goes to. */
enum { BY_FAULT, BY_POOL, BY_PREFETCH };

struct rregion {
	char *name;
	uint64_t host, length;
	int kind;
	uint64_t first_mb, nmb; /* as in the file: regions are kept in file order */
	int fd;			/* SHARED: our dup of the file, else -1 */
	uint64_t fd_off;
	bool discards_refused;	/* we made the file append-only: undo at the end */
	/* hugetlbfs (huge.c): */
	uint64_t hpage;		/* its page size, the unit of installation; 0: not hugetlbfs */
	uint64_t first_hp;	/* its first page in r->hps */
	uint8_t *map;		/* our shared mapping of its file range: blocks are decoded here */
	/* The session's region of the same number (r->gs.regions[i]) says where it is registered. */
};

/* A fault waiting for its LB's read. */
struct fault_waiter {
	struct fault_waiter *next;
	uint64_t mb;
	uint64_t t0; /* message read */
};

/* What the restore keeps per LB beside its state (r->src.st[lb]); "lk" is r->src.lk. */
struct rlb {
	uint8_t how;		 /* HOW_*: set when the read lands; under lk */
	uint32_t refs;		 /* holders of buf; under lk */
	uint8_t *buf;		 /* CACHED: verified bytes; under lk */
	struct fault_waiter *waiters;	 /* READING: newest first; under lk */
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
	struct fault_waiter *waiters;	  /* faults to count as served when it comes in; under lk */
};

struct itask {
	struct halite_restore *r;
	uint64_t lb;
	uint8_t *buf;
};

struct rs_strategy;
struct rs_observer;

struct halite_restore {
	/*
	 * The guest: its userfaultfd, regions (file order, as r->regions),
	 * gmem, vCPUs, fault thread, fault counters and histogram, error,
	 * state and end. Its ops are the copy strategy (fault.c).
	 */
	struct gsession gs;
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
	const struct rs_strategy *huge; /* its strategy (huge.c), NULL without */
	const struct rs_observer *obs;	 /* learning (learn.c), NULL without */
	struct rhp *hps;	 /* the huge pages of hugetlbfs regions, regions in file order */
	uint64_t nhp;
	_Atomic uint8_t *mb;	 /* MB_* per memory block */
	struct rlb *lbs;

	int fd;			 /* the source's page-cache reads and drops, the lock */
	struct halite_pool *pool;
	bool started;		 /* under gs.mu */
	uint8_t *fault_tmp;	 /* the fault thread's decode buffer */

	/*
	 * The snapshot source: the LB states, the demand and readahead
	 * queues, the readers and the prefetcher. Its lock (src.lk, "lk" in
	 * comments) guards the states and struct rlb's fields marked so.
	 */
	struct src src;
	_Atomic uint64_t lb_done, lbs_cached;

	_Atomic bool ended;	 /* rs_finish() is unregistering: the restore is done */
	/* Open is gs.start_ns, ready gs.running_ns (faults served from there). */
	uint64_t ready_ns;	 /* ready - open */

	_Atomic uint64_t n_mb[3]; /* BY_* */
	uint64_t n_mb_present;	  /* ATTACH: found in memory at start */
	_Atomic uint64_t n_staged, n_staged_accessed;
	/*
	 * A relayouted file's hot prefix (opts.hot_prefix_max): the prefetcher
	 * reads LBs 0..hot_lbs-1 first (the source's first list), unthrottled.
	 */
	uint64_t hot_lbs;

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
};

#define ULL(x) ((unsigned long long)(x))


/* ---- inline: on the fault path, in every file ---- */

static inline const struct rregion *rs_region_of_mb(const struct halite_restore *r, uint64_t mb)
{
	return &r->regions[halite_find_first_mb(r->regions, r->nregions, sizeof(r->regions[0]),
						offsetof(struct rregion, first_mb), mb)];
}

/* CAS of memory block @mb from @from to MB_CLAIMED. */
static inline bool rs_claim(struct halite_restore *r, uint64_t mb, uint8_t from)
{
	return atomic_compare_exchange_strong(&r->mb[mb], &from, MB_CLAIMED);
}

/*
 * A claimed block is in: counted (BY_*), then MB_INSTALLED. Counted before
 * the state says so: whoever sees MB_INSTALLED sees the count (rs_finish).
 */
static inline void rs_installed(struct halite_restore *r, uint64_t mb, int by)
{
	atomic_fetch_add(&r->n_mb[by], 1);
	atomic_store(&r->mb[mb], MB_INSTALLED);
}

/* A fault served: its service time (message read to wake) into the histogram. */
static inline void rs_fault_served(struct halite_restore *r, uint64_t t0)
{
	gs_fault_served(&r->gs, t0);
}

/* Has the restore failed? Nothing is installed from then on. */
static inline bool rs_failed(const struct halite_restore *r)
{
	return gs_failed(&r->gs);
}

static inline uint64_t rs_since_ready(const struct halite_restore *r)
{
	uint64_t now = halite_now_ns();

	return now > r->gs.running_ns ? now - r->gs.running_ns : 0;
}

/* Memory block @mb as gmem sees it: its region's index and the offset in it. */
static inline uint32_t rs_mb_region(const struct halite_restore *r, uint64_t mb, uint64_t *off)
{
	const struct rregion *g = rs_region_of_mb(r, mb);

	*off = (mb - g->first_mb) * r->mb_size;
	return (uint32_t)(g - r->regions);
}

/* Is @mb in a hugetlbfs region (installed by huge page, huge.c)? */
static inline bool rs_mb_huge(const struct halite_restore *r, uint64_t mb)
{
	return r->has_huge && rs_region_of_mb(r, mb)->hpage;
}

/* TRACK_ACCESS: a block read with a demand fault, other than the faulting one, was touched. */
static inline void rs_count_accessed(struct halite_restore *r, struct rlb *b)
{
	atomic_fetch_add(&b->accessed, 1);
	atomic_fetch_add(&r->n_staged_accessed, 1);
}

/* ---- state.c ---- */

/* The first message wins (the session's, gs_fail()); returns -|err|. */
#define rs_fail(r, err, ...) gs_fail(&(r)->gs, (err), __VA_ARGS__)
/* The first message wins; logged as an error (later ones at debug). */
void rs_errmsg(struct halite_restore *r, const char *msg);
/* The first error wins; nothing is installed from here on. */
void rs_set_failed(struct halite_restore *r, int err);
/* Done (@err 0) or failed, once: the session's end (the trace first), the source stopped. */
void rs_end(struct halite_restore *r, int err);
/* The session's ending (gs_ops.ending): learning stopped, the trace written. */
void rs_ending(struct gsession *gs, int err);

/* ---- install.c ---- */

/* Fill block @mb with @src (NULL: zeros) and wake its faults (@flags: gmem). 0 or -errno. */
int rs_mb_fill(struct halite_restore *r, uint64_t mb, const uint8_t *src, unsigned flags);
/* What a failed install says about itself; returns the error. */
int rs_install_failed(struct halite_restore *r, int ret, uint64_t mb, const char *how);
/* Decode verified block @mb from @lb_buf into @tmp and install it. 0 or -errno. */
int rs_install_from_lb(struct halite_restore *r, uint64_t mb, const uint8_t *lb_buf,
		       uint8_t *tmp, unsigned flags);
/* Install a block claimed from STAGED, from its LB's stage (@flags: gmem). 0 or -errno. */
int rs_install_staged(struct halite_restore *r, uint64_t lb, uint64_t mb, unsigned flags);
/* The counter (BY_POOL, BY_PREFETCH) for a staged block of @lb, installed unasked. */
int rs_staged_by(struct halite_restore *r, uint64_t lb);
/* A verified LB: publish it, serve its waiters, hand the rest to the pool. Takes @buf. */
void rs_lb_landed(struct halite_restore *r, uint64_t lb, uint8_t *buf, int how, uint8_t *tmp);
/* Drop a reference to a cached LB; the last one frees its bytes (and may finish). */
void rs_lb_release(struct halite_restore *r, uint64_t lb);
/* Every stored block is in: install what is staged, unregister, done. */
void rs_finish(struct halite_restore *r);
/* rs_finish() as a pool task (@arg: the restore). */
void rs_finish_task(void *arg);

/* ---- fault.c, prefetch.c, report.c ---- */

/* The copy strategy: the session's ops (fault.c). */
extern const struct gs_ops rs_copy_ops;
/*
 * At open, after the reader and r->fd: the source, its prefetcher's first
 * list a relayouted file's hot prefix. 0 or -errno (the message set).
 */
int rs_source_init(struct halite_restore *r);
void rs_fill_stats(struct halite_restore *r, struct halite_restore_stats *st);
/* docs/restore-trace.md, written to a temporary file and renamed over the path. */
int rs_write_trace(struct halite_restore *r, const struct halite_restore_stats *st);

/* ---- register.c, attach.c: at start ---- */

/* At open: the session's regions, as r->regions ask to be registered. */
void rs_session_regions(struct halite_restore *r);
/* The session's userfaultfd, with the features the regions need. 0 or -errno. */
int rs_open_uffd(struct halite_restore *r);
/* Shared regions' files refuse hole punches while the restore needs them, then allow them. */
void rs_refuse_discards(struct halite_restore *r);
void rs_allow_discards(struct halite_restore *r);
/* A new restore: -EEXIST (with the message) when @g's memory is populated already. */
int rs_check_unpopulated(struct halite_restore *r, const struct rregion *g);
/* ATTACH: what is in memory already is installed, its LBs done. */
int rs_attach_scan(struct halite_restore *r);

/* ---- install strategies and observers ---- */

/*
 * How a region's blocks reach the guest when it is not the engine's own
 * way: the engine's own, in install.c and fault.c, copies each block into
 * private or shared memory as it comes (UFFDIO_COPY, UFFDIO_ZEROPAGE); the
 * huge-page strategy (huge.c) assembles a huge page in the page cache and
 * shows it whole (UFFDIO_CONTINUE). A region's strategy is chosen at open
 * (rs_huge_region()); the engine calls it only for that region's blocks.
 */
struct rs_strategy {
	const char *name;
	/* After every region: its records. 0 or -ENOMEM. */
	int (*init)(struct halite_restore *r);
	void (*free)(struct halite_restore *r);
	/* At start: -EEXIST (with the message) when @g's file holds a page. */
	int (*check_empty)(struct halite_restore *r, const struct rregion *g);
	/* ATTACH: the pages the owner maps (@bits: one per host page of @g) are in. */
	void (*attach)(struct halite_restore *r, const struct rregion *g, const uint64_t *bits);
	/* The fault thread: a fault on block @mb. */
	void (*fault)(struct halite_restore *r, uint64_t mb, const struct gs_fault *f);
	/* Does a fault wait for the page of @mb? */
	bool (*wanted)(struct halite_restore *r, uint64_t mb);
	/*
	 * Decode stored block @mb (claimed) from verified LB @lb_buf and count
	 * it (@by); the page's last block shows the page and wakes its faults.
	 * 0 or -errno (with the message).
	 */
	int (*write)(struct halite_restore *r, uint64_t mb, const uint8_t *lb_buf, int by);
	/* Is the page of @mb complete and visible? */
	bool (*in)(struct halite_restore *r, uint64_t mb);
};

/*
 * At open, a shared region with its fd: on hugetlbfs, its page size (the
 * alignment checked), our mapping of it, and the huge-page strategy as
 * r->huge. 0 (not hugetlbfs too) or -errno.
 */
int rs_huge_region(struct halite_restore *r, struct rregion *g);

/*
 * What watches the restore without installing anything: learning
 * (HALITE_RESTORE_LEARN, learn.c) records the guest's first touches. The
 * engine calls it; it calls only the services above (claims, installs of
 * staged blocks, the error), never back into the fault path.
 */
struct rs_observer {
	/* The fault thread: a fault on block @mb (@kind its state), from thread @tid, at @t0. */
	void (*fault)(struct halite_restore *r, uint64_t mb, int kind, uint32_t tid, uint64_t t0);
	/* The fault thread's poll timeout (ms, -1: none); may end a window when due. */
	int (*tick)(struct halite_restore *r);
	/* The restore ends (done: @done). */
	void (*stop)(struct halite_restore *r, bool done);
	/* Its lines of the trace (docs/restore-trace.md). */
	void (*write)(struct halite_restore *r, FILE *f);
};

/* At open: learning's touch map and r->obs, when learning. 0 or -ENOMEM. */
int rs_learn_init(struct halite_restore *r);
void rs_learn_free(struct halite_restore *r);

#endif
