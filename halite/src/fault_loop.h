/* SPDX-License-Identifier: MIT */
/*
 * The fault loop's skeleton, one for every engine: the save's fault thread,
 * the single restore's and each clone session's. It waits on the
 * userfaultfd, on the faults other threads read (gmem.h) and on a stop
 * eventfd; takes page faults in batches through gmem, which applies the
 * guest's events (discards, unmaps, moves) as it reads them; and hands each
 * batch to the engine. What a fault means is the engine's: the loop only
 * decides when to wait, when to read and when to end.
 */
#ifndef HALITE_FAULT_LOOP_H
#define HALITE_FAULT_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "gmem.h"

/* Faults taken from the descriptor per read, at most. */
#define HALITE_FAULT_BATCH 64

struct halite_fault_loop {
	struct halite_gmem *gm;	/* the guest's memory: its userfaultfd and fault queue */
	int uffd;
	int stop_fd;		/* an eventfd whose value asks the loop to stop, or -1 */
	void *ctx;		/* the engine's, passed to each call below */
	/* Before each wait: the poll timeout in ms (-1: none). NULL: -1. */
	int (*timeout_ms)(void *ctx);
	/* stop_fd read value @v: true ends the loop. NULL: any value ends it. */
	bool (*stop)(void *ctx, uint64_t v);
	/* @n page faults, taken at @t0 (halite_now_ns()). */
	void (*serve)(void *ctx, const struct uffd_msg *m, int n, uint64_t t0);
	/*
	 * After each wake-up with the @n faults it served (0 after a timeout
	 * or an event): false ends the loop. NULL: go on.
	 */
	bool (*next)(void *ctx, int n);
	/* Reading the descriptor failed with @err (-errno): the loop ends. */
	void (*failed)(void *ctx, int err);
};

/* Serve until a callback ends the loop, or poll() fails. */
void halite_fault_loop_run(const struct halite_fault_loop *l);

#endif
