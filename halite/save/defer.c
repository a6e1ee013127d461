/* SPDX-License-Identifier: MIT */
/*
 * The background walk's deferral policy: a block the guest-virtual walk
 * meets within HALITE_SAVE_DEFER_WINDOW blocks (in walk order, i.e. guest-
 * virtual order) after a block a fault claimed is not saved by the walk but
 * left for later: after the physical sweep, the background saves what is
 * still unclaimed of it, in the walk's order, into the guest-virtual stream.
 *
 * Why: a vCPU touches a process's memory in runs, and a block some fault
 * claimed before the walk got there marks where a vCPU has been working;
 * its neighbours are the ones it is about to touch. Saved by the walk, they
 * land in the guest-virtual stream, whose locality blocks also hold the
 * walk's other blocks in address order, which the guest may never touch
 * again; left to the vCPU, they land in its own stream, in the order it
 * touched them, which is the order a restore of the same work needs them.
 * Measured on the real programs' traces (docs/benchmarks.md, "Real
 * programs' traces"): every locality block a restore read on demand whose
 * blocks went untouched was one of the guest-virtual stream; the vCPU
 * streams' were always touched.
 *
 * The window, 64 blocks (512 KiB of 8 KiB blocks): on the three real
 * programs' traces, packed loosely (up to 16 untouched pages between touched
 * ones) and densely, 6 micro runs each interleaved (docs/benchmarks.md,
 * "Real programs' traces"), the locality organisation met issue 15's goal
 * in 32 of 36 runs without deferral, 33 with 16 blocks, 36 with 32 and 64;
 * 64 had the highest lowest VM access (92.5% against 90.0%) and the most
 * blocks in the vCPU's stream. The cost: the deferred blocks the vCPUs do
 * touch are saved by their faults instead of the background (more faults
 * during the save, each served as any other), and those they never touch
 * are saved after the physical sweep.
 *
 * A block met claimed counts as a fault's unless the background claimed it
 * itself (the walk meets a block again through another mapping, e.g. a
 * Linux guest's direct map): @mine.
 */
#include <errno.h>
#include <stdlib.h>

#include "defer.h"

static bool bit(const uint64_t *bits, uint64_t i)
{
	return bits[i / 64] >> (i % 64) & 1;
}

int halite_defer_init(struct halite_defer *d, uint64_t nmb, uint32_t window)
{
	*d = (struct halite_defer){ .nmb = nmb, .since_fault = UINT64_MAX, .last_mb = UINT64_MAX };
	if (!window)
		return 0;
	d->mine = calloc(nmb / 64 + 1, sizeof(uint64_t));
	d->deferred = calloc(nmb / 64 + 1, sizeof(uint64_t));
	if (!d->mine || !d->deferred) {
		halite_defer_free(d);
		return -ENOMEM;
	}
	d->window = window;
	return 0;
}

void halite_defer_free(struct halite_defer *d)
{
	free(d->mine);
	free(d->deferred);
	free(d->order);
	*d = (struct halite_defer){ 0 };
}

void halite_defer_mine(struct halite_defer *d, uint64_t mb)
{
	if (d->window && mb < d->nmb)
		d->mine[mb / 64] |= 1ull << (mb % 64);
}

bool halite_defer_walk(struct halite_defer *d, uint64_t mb, bool claimed)
{
	uint64_t since;

	if (!d->window || mb >= d->nmb)
		return false;
	/* The next page of the block met last (a block spans pages): the same answer. */
	if (mb == d->last_mb)
		return !claimed && bit(d->deferred, mb);
	d->last_mb = mb;
	if (claimed) {
		if (!bit(d->mine, mb))
			d->since_fault = 0;
		return false;
	}
	/* Met again through another mapping: it stays deferred, where the walk first met it. */
	if (bit(d->deferred, mb))
		return true;
	since = d->since_fault;
	if (since != UINT64_MAX)
		d->since_fault++;
	if (since >= d->window)
		return false;
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 1024;
		uint64_t *o = realloc(d->order, cap * sizeof(*o));

		if (!o)
			return false; /* out of memory: the walk saves it, as without the policy */
		d->order = o;
		d->cap = cap;
	}
	d->order[d->n++] = mb;
	d->deferred[mb / 64] |= 1ull << (mb % 64);
	return true;
}

bool halite_defer_is(const struct halite_defer *d, uint64_t mb)
{
	return d->window && mb < d->nmb && bit(d->deferred, mb);
}
