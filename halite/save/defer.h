/* SPDX-License-Identifier: MIT */
/*
 * The background walk's deferral policy (defer.c): which blocks the
 * guest-virtual walk leaves for later because a vCPU is working next to
 * them, so that the vCPU's own first touch saves them into its stream.
 * Used by the background thread only; no locking.
 */
#ifndef HALITE_SAVE_DEFER_H
#define HALITE_SAVE_DEFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Blocks after one a fault claimed, in the walk's order, that the walk
 * defers (defer.c says where the number comes from). 0: no deferral.
 */
#ifndef HALITE_SAVE_DEFER_WINDOW
#define HALITE_SAVE_DEFER_WINDOW 64u
#endif

struct halite_defer {
	uint32_t window;	/* 0: the policy is off, nothing allocated */
	uint64_t nmb;
	uint64_t *mine;		/* a bit per block: the background claimed it */
	uint64_t *deferred;	/* a bit per block: left for later */
	uint64_t *order;	/* the deferred blocks, in the walk's order */
	size_t n, cap;
	uint64_t since_fault;	/* blocks the walk met since one a fault claimed */
	uint64_t last_mb;	/* the block it met last */
};

/* Set up for @nmb blocks. 0 or -ENOMEM (the caller may go on without: window 0). */
int halite_defer_init(struct halite_defer *d, uint64_t nmb, uint32_t window);
void halite_defer_free(struct halite_defer *d);

/* The background thread claimed @mb (walk, copies or sweep). */
void halite_defer_mine(struct halite_defer *d, uint64_t mb);

/*
 * The walk meets @mb, which someone has @claimed or not. true: an
 * unclaimed block the walk must leave for later (it is now deferred).
 */
bool halite_defer_walk(struct halite_defer *d, uint64_t mb, bool claimed);

/* @mb was deferred: the physical sweep leaves it to the deferred pass. */
bool halite_defer_is(const struct halite_defer *d, uint64_t mb);

#endif
