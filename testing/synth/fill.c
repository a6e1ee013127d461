// SPDX-License-Identifier: MIT
/*
 * Filling guest memory at creation: which data pages are zeroed, and the
 * contents of the others (with SYNTH_F_ATTACH only which: nothing is
 * written). Deterministic in (seed, pfn) alone, so the thread pool may fill
 * in any order and a guest built twice with the same options has the same
 * memory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pool.h"

/* Frames per pool task: 32 MiB, big enough to amortize the queue. */
#define FILL_CHUNK 8192ull
/* Below this, starting threads costs more than it saves. */
#define FILL_POOL_MIN (64ull << 20)

struct fill_task {
	struct synth_guest *g;
	const uint8_t *tmpl;
	uint64_t first, n;
};

/*
 * t_fill's scheme per page: in each 256-byte run the first compress_pct
 * percent of bytes are random, the rest the pattern (uint8_t)(i / 7). The
 * pattern bytes never make a page all-zero, so a filled page is never
 * mistaken for a zero page.
 */
static void fill_page(uint8_t *p, uint64_t pfn, const struct synth_guest *g,
		      const uint8_t *tmpl)
{
	unsigned r = g->o.compress_pct * 256 / 100;
	uint64_t s = synth_seed(g->o.seed, pfn);

	if (r < 256)
		memcpy(p, tmpl, PG_SIZE);
	for (unsigned run = 0; run < PG_SIZE; run += 256) {
		unsigned b = 0;
		uint64_t v;

		for (; b + 8 <= r; b += 8) {
			v = synth_rand(&s);
			memcpy(p + run + b, &v, 8);
		}
		if (b < r) {
			v = synth_rand(&s);
			memcpy(p + run + b, &v, r - b);
		}
	}
}

static void fill_range(void *arg)
{
	struct fill_task *t = arg;
	struct synth_guest *g = t->g;

	for (uint64_t pfn = t->first; pfn < t->first + t->n; pfn++) {
		uint8_t k = g->kinds[pfn];
		uint8_t *p = g->mem + (pfn << PG_SHIFT);

		if (k == SYNTH_FRAME_UNTOUCHED || k == SYNTH_FRAME_PT)
			continue;
		/* A guest that zeroed a page wrote it: populated, not a hole. */
		if (k & SYNTH_FRAME_ZERO)
			memset(p, 0, PG_SIZE);
		else
			fill_page(p, pfn, g, t->tmpl);
	}
}

int synth_fill(struct synth_guest *g, bool write)
{
	uint64_t n = g->nframes, data = 0, zero, left, want, s;
	struct halite_pool *pool = NULL;
	struct fill_task *tasks;
	uint64_t ntasks = (n + FILL_CHUNK - 1) / FILL_CHUNK;
	uint8_t tmpl[PG_SIZE];

	for (uint64_t pfn = 0; pfn < n; pfn++)
		if (g->kinds[pfn] == SYNTH_FRAME_MAPPED || g->kinds[pfn] == SYNTH_FRAME_UNMAPPED)
			data++;
	/* Selection sampling (Knuth's algorithm S): exactly @zero, uniformly. */
	zero = data * g->o.zero_pct / 100;
	s = synth_seed(g->o.seed, 0x7a65726f); /* "zero" */
	left = data;
	want = zero;
	for (uint64_t pfn = 0; pfn < n && want; pfn++) {
		uint8_t *k = &g->kinds[pfn];

		if (*k != SYNTH_FRAME_MAPPED && *k != SYNTH_FRAME_UNMAPPED)
			continue;
		if (synth_rand(&s) % left < want) {
			*k |= SYNTH_FRAME_ZERO;
			want--;
		}
		left--;
	}
	g->info.data_frames = data;
	g->info.zero_frames = zero;
	if (!write)
		return 0;

	for (unsigned i = 0; i < PG_SIZE; i++)
		tmpl[i] = (uint8_t)(i / 7);
	tasks = calloc(ntasks, sizeof(*tasks));
	if (!tasks)
		return -ENOMEM;
	if ((n << PG_SHIFT) >= FILL_POOL_MIN && halite_pool_create(&pool, 0, "synth-fill"))
		pool = NULL;
	for (uint64_t i = 0; i < ntasks; i++) {
		tasks[i] = (struct fill_task){ .g = g, .tmpl = tmpl, .first = i * FILL_CHUNK };
		tasks[i].n = n - tasks[i].first < FILL_CHUNK ? n - tasks[i].first : FILL_CHUNK;
		if (!pool || halite_pool_submit(pool, fill_range, &tasks[i]))
			fill_range(&tasks[i]);
	}
	if (pool) {
		halite_pool_wait(pool);
		halite_pool_free(pool);
	}
	free(tasks);
	return 0;
}
