/* SPDX-License-Identifier: MIT */
/*
 * Private to the template source's files: its state. template.c (open,
 * requests, decoding what its snapshot source reads, stats, free),
 * template_files.c (the memory and fill files), hotset.c (the hot set, a
 * relayouted file's hot prefix, the prefetch order) and template_err.c
 * (its error). The reading itself, LB states, readers, retries and the
 * prefetcher, is the snapshot source's (source.h). What a session may ask
 * of it is template_int.h.
 */
#ifndef HALITE_TEMPLATE_SRC_H
#define HALITE_TEMPLATE_SRC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <halite/template.h>

#include "learned.h"
#include "log_internal.h"
#include "source.h"
#include "template_int.h"

#define FILL_MAGIC "HLTFILL1"
#define FILL_HDR 64u
#define HOT_MAGIC "HLTHOT01"
#define REGION_ALIGN (2ull << 20)
#define ULL(x) ((unsigned long long)(x))

struct session_waiter {
	struct session_waiter *next;
	struct tpl_client *c;
	uint64_t mb;
	uint64_t tag;
};

/* What the template keeps per LB beside its state (t->src.st[lb]); under t->src.lk. */
struct lbstate {
	bool demand;		/* a session asked for it while IDLE: read on demand */
	int err;
	char *msg;		/* FAILED: what failed, said once when it did */
	struct session_waiter *waiters;
};

struct halite_template {
	struct halite_template_opts o;
	struct halite_logger log;
	char *mem_path, *fill_path, *hot_path;
	struct halite_reader *rd;
	const struct halite_file_info *fi;
	struct tpl_region *regions;
	uint32_t nregions;
	uint64_t mb_stored;

	int memfd, ro_fd, fillfd;
	bool created_mem, created_fill; /* by this open: removed if it fails */
	uint64_t mem_size;
	uint8_t *fillmap;  /* MEM_PATH.fill */
	_Atomic uint8_t *fill;

	/*
	 * The snapshot source (source.h): the LB states, the demand queue and
	 * its readers, the prefetcher (first the hot set's LBs, porder[0..nhot),
	 * then file order; throttled). Its lock, src.lk, is the template's
	 * lock: the LBs' waiters and messages, the clients' counts, the hot
	 * set and the error are under it.
	 */
	struct src src;
	int snap_fd;		 /* the snapshot, for the source's page-cache drops */
	pthread_cond_t state_cv; /* completion, failure, callbacks ended (with src.lk) */
	struct lbstate *lbs;
	uint64_t *porder;	 /* the hot set's LBs, in its order */
	uint64_t nhot;
	struct halite_pool *pool; /* decodes prefetched LBs off the prefetcher's thread */
	_Atomic uint64_t backlog; /* prefetched LBs waiting for the pool */

	uint8_t *hot_bit;	 /* per block: 1 once learned (in @hot) */
	struct learn_touch *hot; /* learned, in first-fault order */
	uint64_t hot_n, hot_cap;
	uint64_t *pre;		 /* the relayouted file's prefix blocks */
	uint64_t pre_n;
	uint64_t hot_base_ns;	 /* start of the first session that added a block */
	uint64_t hot_t_off;	 /* the last t_ns read at open: learned t_ns go on from it */

	_Atomic uint64_t mb_in;
	uint64_t mb_in_at_open, lb_in_at_open;
	/* Read, demand or prefetch, is the source's count; these failed too. */
	_Atomic uint64_t lb_demand_failed, lb_prefetch_failed;
	_Atomic uint64_t lb_failed, mb_decoded;
	_Atomic uint64_t requests, hits, joined;
	int error;
	char errmsg[512];
};

/* The first message wins; returns @err. */
__attribute__((format(printf, 3, 4)))
int tpl_fail(struct halite_template *t, int err, const char *fmt, ...);
/* A failure the template cannot serve past: the first sets error and errmsg. Takes t->src.lk. */
void tpl_error(struct halite_template *t, int err, const char *msg);
/* @mb's map entry (a 1.1 file's chunk read on first use): 0, or < 0 with the error set. */
int tpl_mb_lookup(struct halite_template *t, uint64_t mb, struct halite_mb_loc *loc);

/* ---- template_files.c ---- */

/* The memory file and its fill file, opened or created and checked. 0 or < 0 (message set). */
int tpl_open_files(struct halite_template *t);
/* A failed open: the files it created go. */
void tpl_remove_created(struct halite_template *t);
/* At open: the blocks the fill file says are in, counted. */
void tpl_count_in(struct halite_template *t);

/* ---- hotset.c ---- */

/* At open: the hot set saved by earlier sessions (a warning, not a failure, when unusable). */
void tpl_hot_load(struct halite_template *t);
/* At open: a relayouted snapshot's hot prefix joins the hot set after the learned. */
int tpl_hot_prefix(struct halite_template *t);
/* Blocks in the hot set: learned, and the prefix's not learned. Under t->src.lk. */
uint64_t tpl_hot_count_locked(const struct halite_template *t, uint64_t *prefix);
/*
 * At open: the prefetch order's first list, the hot set's LBs in its order
 * (tpl_hot_list()); the source goes on in file order (not stored, so that
 * open does not take time in the number of LBs; a hot LB comes again there,
 * taken already, and is skipped as any LB that is not idle). 0 or -ENOMEM.
 */
int tpl_build_porder(struct halite_template *t);

#endif
