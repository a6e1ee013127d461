/* SPDX-License-Identifier: MIT */
/*
 * The background thread claims the blocks no fault has claimed, first in
 * guest-virtual order by walking the guest's page tables from each root
 * (ptwalk.c; a block mapped at several addresses is saved once, where the
 * walk meets it first), then in physical order for what no page table
 * maps, then what the walk deferred (defer.c: blocks next to ones a fault
 * claimed first, left for the vCPU that is working there); throttled
 * (paper, section 6): it runs only when no fault has come
 * for bg_idle_us, or when it falls behind bg_min_rate. Page-table pages
 * are read as at the snapshot instant: from the shadow, or for shared
 * memory from the view while no one has claimed the block (pt_read()).
 * The tables are the guest's, so hostile input: a leaf is clipped to guest
 * memory, a large leaf over memory the walk has been through costs one bit
 * test (pt_visit()), and the whole walk, roots the sampler adds later
 * included, has a work budget proportional to guest memory (bg_walk()).
 * Past it the walk stops with a warning and the physical sweep saves the
 * rest: the save still finishes at the rate floor, and exactly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ptwalk.h"

#include "save_int.h"

static void bg_throttle(struct halite_save *s, uint64_t start_ns, uint64_t saved_bytes)
{
	uint64_t idle_ns = (uint64_t)s->o.bg_idle_us * 1000;

	while (!atomic_load(&s->stopping)) {
		uint64_t now = halite_now_ns();
		uint64_t since_fault = atomic_load(&s->in_fault) ? 0
				       : now - atomic_load(&s->last_fault_ns);
		/* The rate floor: bytes this thread should have saved by now. */
		uint64_t owed = (now - start_ns) / 1000 * (s->o.bg_min_rate / 1000) / 1000;
		struct timespec ts = { 0, 200000 };

		if (since_fault >= idle_ns || saved_bytes < owed)
			return;
		nanosleep(&ts, NULL);
	}
}

/*
 * Claim and save @mb into @stream unless someone has. Anonymous memory is
 * given back now, so the shadow can go at the end; an untouched block stays a
 * hole until the guest wants it. Shared memory is already where it belongs: a
 * later fault only needs UFFDIO_CONTINUE. 0 or -errno.
 */
static int bg_save_block(struct halite_save *s, const struct sregion *r, uint64_t mb,
			 uint32_t stream)
{
	struct item *it;
	int ret, touched;

	if (!claim_block(s, mb))
		return 0;
	halite_defer_mine(&s->defer, mb);
	touched = save_block_touched(s, r, mb);
	ret = save_copy_claimed(s, r, mb, 1, touched);
	if (touched < 0)
		ret = touched;
	if (!ret && touched > 0 && r->kind == HALITE_MEM_ANON)
		ret = save_give_back(s, r, mb, HALITE_GMEM_DONTWAKE);
	it = ret ? NULL : save_item_new(s, mb, stream, touched > 0);
	if (!ret && !it)
		ret = -ENOMEM;
	if (!ret)
		ret = save_enqueue(s, it);
	if (ret)
		return sfail(s, ret, "background save of memory block %llu", (unsigned long long)mb);
	atomic_fetch_add(&s->n_bg, 1);
	return 0;
}

#define SZ_2M (1ull << 21)
#define SZ_1G (1ull << 30)

/* A region as the walk sees it, in a copy of the regions sorted by GPA. */
struct walk_region {
	const struct sregion *r;
	uint64_t gpa, end;
	uint64_t max_end; /* the largest end of this region and those before it */
	/*
	 * A bit per 2 MiB and per 1 GiB chunk of GPA (aligned) the region
	 * overlaps, from the one holding @gpa: every block of the region in
	 * that chunk is claimed, and the walk has been through it.
	 */
	uint64_t *done_2m, *done_1g;
};

struct bg {
	struct halite_save *s;
	struct halite_ptw *w;
	struct walk_region *wr;
	uint32_t nwr;
	uint64_t *done; /* the bits of every walk_region */
	uint64_t start_ns, saved;
	int err;
};

/*
 * Throttled, then claim and save @mb into @stream unless someone has: 0, 1
 * when the save is stopping, or -errno.
 */
static int bg_save_next(struct bg *b, const struct sregion *r, uint64_t mb, uint32_t stream)
{
	struct halite_save *s = b->s;
	int ret;

	bg_throttle(s, b->start_ns, b->saved);
	if (atomic_load(&s->stopping))
		return 1;
	ret = bg_save_block(s, r, mb, stream);
	if (!ret)
		b->saved += s->mb_size;
	return ret;
}

static const struct sregion *region_of_gpa(const struct halite_save *s, uint64_t gpa,
					   uint64_t *off)
{
	for (uint32_t i = 0; i < s->nregions; i++) {
		const struct sregion *r = &s->regions[i];

		if (gpa >= r->gpa && gpa - r->gpa < r->length) {
			*off = gpa - r->gpa;
			return r;
		}
	}
	return NULL;
}

/* halite_ptw_read_fn: a page-table page as the snapshot has it. */
static int pt_read(void *ctx, uint64_t gpa, void *page)
{
	struct bg *b = ctx;
	struct halite_save *s = b->s;
	uint64_t off;
	const struct sregion *r = region_of_gpa(s, gpa, &off);
	uint64_t mb;
	int touched;

	if (atomic_load(&s->stopping))
		return -ECANCELED; /* a cancel must not wait for the walk */
	if (!r || r->length - off < 4096)
		return -ERANGE;
	mb = r->first_mb + off / s->mb_size;
	if (r->kind == HALITE_MEM_SHARED && atomic_load(&s->claim[mb]) == CLAIM_FREE) {
		/*
		 * Unclaimed, the page cache still holds the snapshot: the guest
		 * cannot write a block before someone claims it. Read optimistically
		 * and keep the bytes if the block is still unclaimed afterwards
		 * (as a seqlock reader does); else the claimer's copy is in the
		 * shadow. Reading a hole through the view would populate it.
		 */
		touched = save_block_touched(s, r, mb);
		if (touched < 0)
			return touched;
		/*
		 * A file that may have lost a page since (had_data): a read through
		 * the view would fill the hole, and hide it from copy_checked().
		 */
		if (r->hpage || (touched && r->had_data)) {
			int ret = save_read_huge(r, off, page, 4096);

			if (ret)
				return ret;
		} else if (touched) {
			memcpy(page, r->view + off, 4096);
		} else {
			memset(page, 0, 4096);
		}
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load(&s->claim[mb]) == CLAIM_FREE)
			return 0;
	}
	if (r->kind == HALITE_MEM_SHARED) {
		/* A hole claimed stays a hole in the shadow: zeros, as in the snapshot. */
		wait_ready(s, mb);
		memcpy(page, r->shadow + off, 4096);
		return 0;
	}
	/* Anonymous: reading a hole of the shadow would populate it. */
	touched = save_block_touched(s, r, mb);
	if (touched < 0)
		return touched;
	/* Another process's: the pages it moved aside hold the snapshot, claimed or not. */
	if (touched && r->aside)
		return save_read_aside(s, r, off, page, 4096);
	if (touched)
		memcpy(page, r->shadow + off, 4096);
	else
		memset(page, 0, 4096);
	return 0;
}

/*
 * The first sorted region that may hold @gpa or anything above it: the
 * first whose max_end passes @gpa. max_end never decreases, so a binary
 * search finds it even if regions overlap (nothing forbids it).
 */
static uint32_t walk_region_first(const struct bg *b, uint64_t gpa)
{
	uint32_t lo = 0, hi = b->nwr;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (b->wr[mid].max_end > gpa)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/* Save the unclaimed blocks of @r that [lo, hi) overlaps, in GPA order. */
static int walk_blocks(struct bg *b, const struct sregion *r, uint64_t lo, uint64_t hi)
{
	struct halite_save *s = b->s;
	uint64_t first = r->first_mb + (lo - r->gpa) / s->mb_size;
	uint64_t last = r->first_mb + (hi - 1 - r->gpa) / s->mb_size;
	int ret = halite_ptw_charge(b->w, last - first + 1);

	if (ret)
		return ret;
	for (uint64_t mb = first; mb <= last; mb++) {
		bool claimed = atomic_load(&s->claim[mb]);

		/* Decided after the throttle's wait, with the faults that came in it. */
		if (!claimed) {
			bg_throttle(s, b->start_ns, b->saved);
			if (atomic_load(&s->stopping))
				return 1;
			claimed = atomic_load(&s->claim[mb]);
		}
		/* Next to a vCPU's work: left for its faults (defer.c). */
		if (halite_defer_walk(&s->defer, mb, claimed) || claimed)
			continue;
		b->err = bg_save_block(s, r, mb, HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0));
		if (b->err)
			return b->err;
		b->saved += s->mb_size;
	}
	return 0;
}

static bool bit_test(const uint64_t *bits, uint64_t i)
{
	return bits[i / 64] >> (i % 64) & 1;
}

static void bit_set(uint64_t *bits, uint64_t i)
{
	bits[i / 64] |= 1ull << (i % 64);
}

/* The part [lo, hi) of region @w in one 2 MiB chunk, unless it is done. */
static int walk_2m(struct bg *b, struct walk_region *w, uint64_t lo, uint64_t hi)
{
	uint64_t c = (lo >> 21) - (w->gpa >> 21);
	int ret;

	if (bit_test(w->done_2m, c))
		return 0;
	ret = walk_blocks(b, w->r, lo, hi);
	if (!ret)
		bit_set(w->done_2m, c);
	return ret;
}

/*
 * The part [lo, hi) of region @w that a 2 MiB or 1 GiB leaf maps. Claims
 * are never undone, so once the walk has been through a chunk it is done
 * for good, and a leaf over a done chunk costs one bit test. Leaves repeat:
 * hostile tables map GPA 0 a million times over, and every process of a
 * Linux guest maps the kernel's direct map with 2 MiB or 1 GiB pages (most
 * share the tables, which the walker skips, but not all).
 */
static int walk_large(struct bg *b, struct walk_region *w, uint64_t lo, uint64_t hi,
		      uint64_t len)
{
	uint64_t c;
	int ret;

	if (len == SZ_2M)
		return walk_2m(b, w, lo, hi);
	c = (lo >> 30) - (w->gpa >> 30);
	if (bit_test(w->done_1g, c))
		return 0;
	ret = halite_ptw_charge(b->w, ((hi - 1) >> 21) - (lo >> 21) + 1);
	for (uint64_t g = lo, next; !ret && g < hi; g = next) {
		next = HALITE_MIN(hi, (g | (SZ_2M - 1)) + 1);
		ret = walk_2m(b, w, g, next);
	}
	if (!ret)
		bit_set(w->done_1g, c);
	return ret;
}

/*
 * halite_ptw_visit_fn: save the blocks behind a mapped leaf, in VA order.
 * The leaf is clipped to the regions it overlaps, so what lies outside guest
 * memory (MMIO, or a hostile entry) costs nothing per block: a leaf outside
 * every region costs a binary search. Large leaves skip what the walk has
 * been through (walk_large()). So the blocks the walk looks at are at most
 * one per 4 KiB leaf, plus every block of memory once (twice when blocks
 * straddle 2 MiB boundaries), plus one per 2 MiB chunk of memory.
 */
static int pt_visit(void *ctx, uint64_t va, uint64_t gpa, uint64_t len)
{
	struct bg *b = ctx;
	uint64_t end = gpa + len; /* no overflow: gpa < 2^52 */
	int ret = 0;

	/* A walk may take a while: a cancel must not wait for it. */
	if (atomic_load(&b->s->stopping))
		return 1;

	for (uint32_t i = walk_region_first(b, gpa); i < b->nwr && b->wr[i].gpa < end && !ret;
	     i++) {
		struct walk_region *w = &b->wr[i];
		uint64_t lo = HALITE_MAX(gpa, w->gpa), hi = HALITE_MIN(end, w->end);

		if (lo >= hi)
			continue;
		if (len > 4096)
			ret = walk_large(b, w, lo, hi, len);
		else
			ret = walk_blocks(b, w->r, lo, hi);
	}
	return ret;
}

/* Aligned 2 MiB and 1 GiB chunks of GPA that @r overlaps. */
static uint64_t chunks_2m(const struct sregion *r)
{
	return ((r->gpa + r->length - 1) >> 21) - (r->gpa >> 21) + 1;
}

static uint64_t chunks_1g(const struct sregion *r)
{
	return ((r->gpa + r->length - 1) >> 30) - (r->gpa >> 30) + 1;
}

static int walk_region_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct walk_region *)a)->gpa, y = ((const struct walk_region *)b)->gpa;

	return x < y ? -1 : x > y;
}

/* The walk's view of the regions: sorted by GPA, with their done bits. 0 or -ENOMEM. */
static int walk_regions(struct halite_save *s, struct bg *b)
{
	uint64_t words = 0;

	b->wr = calloc(s->nregions, sizeof(*b->wr));
	if (!b->wr)
		return -ENOMEM;
	for (uint32_t i = 0; i < s->nregions; i++) {
		const struct sregion *r = &s->regions[i];

		b->wr[i] = (struct walk_region){ .r = r, .gpa = r->gpa, .end = r->gpa + r->length };
		words += chunks_2m(r) / 64 + 1 + chunks_1g(r) / 64 + 1;
	}
	b->done = calloc(words, sizeof(uint64_t));
	if (!b->done)
		return -ENOMEM;
	qsort(b->wr, s->nregions, sizeof(*b->wr), walk_region_cmp);
	words = 0;
	for (uint32_t i = 0; i < s->nregions; i++) {
		struct walk_region *wr = &b->wr[i];

		wr->max_end = HALITE_MAX(wr->end, i ? b->wr[i - 1].max_end : 0);
		wr->done_2m = b->done + words;
		words += chunks_2m(wr->r) / 64 + 1;
		wr->done_1g = b->done + words;
		words += chunks_1g(wr->r) / 64 + 1;
	}
	b->nwr = s->nregions;
	return 0;
}

/* Walk every root known so far, including ones added while walking. */
static int bg_walk(struct halite_save *s, struct bg *b)
{
	struct halite_ptw *w;
	struct timespec cpu0, cpu1;
	uint64_t mem = 0;
	int ret;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
	for (uint32_t i = 0; i < s->nregions; i++)
		mem += s->regions[i].length;
	ret = walk_regions(s, b);
	if (!ret)
		ret = halite_ptw_create(&w, mem);
	if (ret) {
		halite_logf(&s->log, HALITE_LOG_WARN, "no page-table walk: %s", halite_strerror(ret));
		free(b->done);
		free(b->wr);
		return 0;
	}
	/*
	 * The walk's budget, for all roots, those added later included. Every
	 * page of memory a table (512 units each: the walker's own bound on
	 * what it reads) and every block looked at twice: a legitimate guest
	 * stays far below, as its tables are a few percent of its memory at
	 * most. At the 9 ns a unit measured on a guest full of tables
	 * (tests/save/test_save_hostile), that is about 1 ns of CPU per byte
	 * of guest memory, where the default rate floor (64 MiB/s) allows 15.
	 */
	s->walk_end.budget = HALITE_PTW_TABLE_UNITS * (mem / 4096) + 2 * s->mb_total;
	halite_ptw_set_budget(w, s->walk_end.budget);
	b->w = w;
	for (uint32_t i = 0; !atomic_load(&s->stopping); i++) {
		struct halite_root root;

		pthread_mutex_lock(&s->roots_lock);
		if (i >= s->nroots) {
			pthread_mutex_unlock(&s->roots_lock);
			break;
		}
		root = s->roots[i];
		pthread_mutex_unlock(&s->roots_lock);
		s->walk_end.roots = i + 1;
		ret = halite_ptw_walk(w, root.cr3, root.mode, pt_read, pt_visit, b);
		if (b->err || atomic_load(&s->stopping))
			break;
		/*
		 * A walk that fails for another reason (hostile tables the
		 * walker refuses, or too many of them) only loses ordering: the
		 * sweep saves the rest.
		 */
		if (ret == -EDQUOT) {
			struct halite_ptw_stats st;

			halite_ptw_stats(w, &st);
			halite_logf(&s->log, HALITE_LOG_WARN, "page-table walk stopped after %llu "
				    "units of work: hostile or unusual page tables; the rest is "
				    "saved in physical order", (unsigned long long)st.work);
			break;
		}
		if (ret < 0)
			halite_logf(&s->log, HALITE_LOG_WARN, "page-table walk from CR3 0x%llx: %s",
				    (unsigned long long)root.cr3, halite_strerror(ret));
	}
	halite_ptw_stats(w, &s->walk_end.st);
	halite_logf(&s->log, HALITE_LOG_DEBUG, "page-table walk: %llu roots, %llu leaves (4K %llu, "
		    "2M %llu, 1G %llu), %llu of them marked accessed by the guest",
		    (unsigned long long)s->walk_end.roots,
		    (unsigned long long)(s->walk_end.st.leaves_4k + s->walk_end.st.leaves_2m +
					 s->walk_end.st.leaves_1g),
		    (unsigned long long)s->walk_end.st.leaves_4k,
		    (unsigned long long)s->walk_end.st.leaves_2m,
		    (unsigned long long)s->walk_end.st.leaves_1g,
		    (unsigned long long)s->walk_end.st.leaves_accessed);
	halite_ptw_free(w);
	free(b->done);
	free(b->wr);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
	s->walk_end.ns = halite_now_ns() - b->start_ns;
	s->walk_end.cpu_ns = (uint64_t)((cpu1.tv_sec - cpu0.tv_sec) * 1000000000 +
					(cpu1.tv_nsec - cpu0.tv_nsec));
	return b->err;
}

/*
 * The copies, whole, in physical order and unthrottled: the guest never
 * faults on them, and the caller holds their memory until the save is over.
 * Before the walk, which then finds them claimed, so their blocks fill
 * locality blocks of their own at the head of the physical stream (bar the
 * last one, which the sweep fills up). 0 or -errno.
 */
int save_copies(struct halite_save *s)
{
	for (uint32_t i = 0; i < s->nregions && !atomic_load(&s->stopping); i++) {
		const struct sregion *r = &s->regions[i];

		for (uint64_t mb = r->first_mb; r->kind == HALITE_MEM_COPY &&
						mb < r->first_mb + r->nmb; mb++) {
			int ret = bg_save_block(s, r, mb, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0));

			if (ret)
				return ret;
		}
	}
	return 0;
}

/*
 * After the physical sweep: what the walk deferred (defer.c) and no vCPU
 * has claimed since, in the walk's order, into the guest-virtual stream.
 * 0, or -errno.
 */
static int bg_deferred(struct halite_save *s, struct bg *b)
{
	const struct halite_defer *d = &s->defer;
	struct timespec ts = { 0, 1000000 };
	int ret;

	if (atomic_load(&s->test_hold_deferred)) {
		atomic_store(&s->deferred_held, true);
		while (atomic_load(&s->test_hold_deferred) && !atomic_load(&s->stopping))
			nanosleep(&ts, NULL);
	}
	for (size_t i = 0; i < d->n; i++) {
		uint64_t mb = d->order[i];

		if (atomic_load(&s->claim[mb]))
			continue;
		ret = bg_save_next(b, region_of_mb(s, mb), mb,
				   HALITE_STREAM(HALITE_STREAM_VIRTUAL, 0));
		if (ret)
			return ret < 0 ? ret : 0;
	}
	return 0;
}

/* What no one has claimed, in physical order, but for the walk's deferred. 0 or -errno. */
static int bg_sweep(struct halite_save *s, struct bg *b)
{
	for (uint32_t i = 0; i < s->nregions; i++) {
		const struct sregion *r = &s->regions[i];

		for (uint64_t mb = r->first_mb; mb < r->first_mb + r->nmb; mb++) {
			int ret;

			if (atomic_load(&s->claim[mb]) || halite_defer_is(&s->defer, mb))
				continue;
			ret = bg_save_next(b, r, mb, HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0));
			if (ret)
				return ret < 0 ? ret : 0;
		}
	}
	return 0;
}

void *save_bg_main(void *arg)
{
	struct halite_save *s = arg;
	struct bg b = { .s = s, .start_ns = halite_now_ns() };
	int ret = halite_defer_init(&s->defer, s->mb_total, s->defer_window);

	if (ret)
		halite_logf(&s->log, HALITE_LOG_WARN, "no deferral next to the vCPUs' faults: %s",
			    halite_strerror(ret));
	ret = save_copies(s);
	if (!ret)
		ret = bg_walk(s, &b);
	s->walk_end.deferred = s->defer.n;
	if (!ret) {
		/* The blocks the writer stored during the walk: their shadow can go. */
		atomic_store(&s->walk_done, true);
		for (uint64_t mb = 0; mb < s->mb_total; mb++)
			if (atomic_load(&s->claim[mb]) == CLAIM_SAVED)
				save_release_block(s, mb);
		ret = bg_sweep(s, &b);
	}
	if (!ret)
		ret = bg_deferred(s, &b);
	if (ret)
		save_set_failed(s, ret);
	halite_defer_free(&s->defer);
	return NULL;
}

/* After halite_save_wait(): the background thread has been joined. */
void halite_save_test_walk(struct halite_save *s, struct halite_save_test_walk *out)
{
	*out = s->walk_end;
}
