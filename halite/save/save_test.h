/* SPDX-License-Identifier: MIT */
/* Private: fault injection points of the save engine, for tests. */
#ifndef HALITE_SAVE_TEST_H
#define HALITE_SAVE_TEST_H

#include <stdbool.h>
#include <stdint.h>

#include <halite/save.h>

#include "ptwalk.h"

/* "write failure": see halite_writer_test_fail_writes(). Before arm. */
void halite_save_test_fail_writes(struct halite_save *s, uint64_t after, int err);

/*
 * "a bug caught": internal check number @after + 1 (counting from the
 * first, as the engine makes them) fails, as if an invariant were broken.
 * Before arm.
 */
void halite_save_test_fail_check(struct halite_save *s, uint64_t after);

/*
 * "a file that cannot refuse hole punches": shared regions' files are left
 * as they are at arm, so the save must detect a punched hole instead of
 * preventing it (arm.c, guard_discards()). Before arm.
 */
void halite_save_test_no_discard_refusal(struct halite_save *s);

/* The background page-table walk, as halite_save_test_walk() reports it. */
struct halite_save_test_walk {
	struct halite_ptw_stats st;	/* its walker's counters: work, over_budget, ... */
	uint64_t budget;		/* of st.work; UINT64_MAX: none */
	uint32_t roots;			/* roots it began to walk */
	uint64_t ns, cpu_ns;		/* the walk's time: wall clock, background thread CPU */
	uint64_t deferred;		/* blocks the walk left for later (defer.c) */
};

/*
 * Once halite_save_wait() has returned: fill *@out; all zero when there was
 * no walk.
 */
void halite_save_test_walk(struct halite_save *s, struct halite_save_test_walk *out);

/*
 * The walk's deferral window (defer.h, HALITE_SAVE_DEFER_WINDOW), in
 * blocks; 0 turns the policy off. Before arm.
 */
void halite_save_test_defer_window(struct halite_save *s, uint32_t window);

/*
 * While @hold, the background thread waits before it saves what its walk
 * deferred (after the walk and the physical sweep), and
 * halite_save_test_deferred_held() says whether it has come there: it stays
 * true once it has, as a save with nothing deferred may end (and stop
 * waiting) before the caller looks.
 */
void halite_save_test_hold_deferred(struct halite_save *s, bool hold);
bool halite_save_test_deferred_held(struct halite_save *s);

#endif
