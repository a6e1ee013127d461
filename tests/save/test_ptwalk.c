// SPDX-License-Identifier: MIT
/*
 * The guest page-table walker against page tables built here, in a plain
 * buffer standing in for guest memory, by a builder that shares no code with
 * the walker. Randomized cases take HALITE_TEST_SEED and print the seed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "endian_util.h"
#include "ptwalk.h"
#include "test_util.h"

#define PG 4096ull
#define SZ_2M (1ull << 21)
#define SZ_1G (1ull << 30)

/* Entry bits, spelled out here rather than shared with the walker. */
#define E_P 0x001ull
#define E_RW 0x002ull
#define E_US 0x004ull
#define E_A 0x020ull
#define E_D 0x040ull
#define E_PS 0x080ull
#define E_PAT_LARGE 0x1000ull /* bit 12 in a 2 MiB / 1 GiB leaf */
#define E_XD (1ull << 63)
#define E_TABLE (E_P | E_RW | E_US | E_A)
#define E_LEAF (E_P | E_RW | E_A | E_D)
#define ADDR_MAX 0x000ffffffffff000ull

static uint64_t seed;

static uint64_t sub_seed(uint64_t k)
{
	uint64_t s = seed ^ (k * 0x9e3779b97f4a7c15ull);

	return s ? s : 1;
}

struct leaf {
	uint64_t va, gpa, len;
};

/* Guest memory, the walker's callbacks' context, and what they saw. */
struct guest {
	uint8_t *mem;
	uint64_t size;
	uint64_t *order; /* pages in the order g_alloc() hands them out */
	uint64_t npages, nalloc;
	unsigned *reads; /* per page */
	uint64_t nreads;
	uint64_t max_reads; /* fail fast instead of hanging, when non-zero */
	uint64_t fail_gpa;
	int fail_err; /* read of fail_gpa returns this when non-zero */
	struct leaf *got;
	size_t ngot, cap;
	size_t stop_after; /* visit returns stop_ret at that many leaves */
	int stop_ret;
	struct halite_ptw *charge_w; /* visit charges it charge units per leaf */
	uint64_t charge;
};

static void g_init(struct guest *g, uint64_t npages)
{
	memset(g, 0, sizeof(*g));
	g->mem = calloc(npages, PG);
	g->reads = calloc(npages, sizeof(*g->reads));
	g->order = calloc(npages, sizeof(*g->order));
	assert_non_null(g->mem);
	assert_non_null(g->reads);
	assert_non_null(g->order);
	g->size = npages * PG;
	g->npages = npages;
	for (uint64_t i = 0; i < npages; i++)
		g->order[i] = i;
}

/*
 * Hand out table pages in random order. Consecutive GPAs hash almost
 * perfectly in the walker's set; scattered ones, as in a real guest, make
 * it probe and collide.
 */
static void g_scatter(struct guest *g, uint64_t *s)
{
	uint64_t i, j, t;

	for (i = g->npages - 1; i > 0; i--) {
		j = t_rand(s) % (i + 1);
		t = g->order[i];
		g->order[i] = g->order[j];
		g->order[j] = t;
	}
}

static void g_fini(struct guest *g)
{
	free(g->mem);
	free(g->reads);
	free(g->order);
	free(g->got);
}

/* A zeroed table page, or UINT64_MAX when guest memory is used up. */
static uint64_t g_alloc(struct guest *g)
{
	if (g->nalloc == g->npages)
		return UINT64_MAX;
	return g->order[g->nalloc++] * PG;
}

static uint64_t g_ntables(const struct guest *g)
{
	return g->nalloc;
}

static uint64_t g_get(struct guest *g, uint64_t table, unsigned i)
{
	return halite_get_le64(g->mem + table + 8 * i);
}

static void g_set(struct guest *g, uint64_t table, unsigned i, uint64_t e)
{
	halite_put_le64(g->mem + table + 8 * i, e);
}

static unsigned va_index(uint64_t va, unsigned level)
{
	return (unsigned)(va >> (12 + 9 * (level - 1))) & 511;
}

/*
 * Map @va -> @gpa with a @len leaf under @root, creating tables on the way,
 * the leaf entry ORed with @extra. -1 if something is in the way (a present
 * entry where the leaf goes, a large leaf where a table must be) or memory
 * ran out; then nothing is mapped.
 */
static int g_map(struct guest *g, uint64_t root, unsigned levels, uint64_t va,
		 uint64_t gpa, uint64_t len, uint64_t extra)
{
	unsigned leaf_level = len == PG ? 1 : len == SZ_2M ? 2 : 3, lvl, i;
	uint64_t t = root, e, n;

	for (lvl = levels; lvl > leaf_level; lvl--) {
		i = va_index(va, lvl);
		e = g_get(g, t, i);
		if (!(e & E_P)) {
			n = g_alloc(g);
			if (n == UINT64_MAX)
				return -1;
			g_set(g, t, i, n | E_TABLE);
			t = n;
		} else if (e & E_PS) {
			return -1;
		} else {
			t = e & ADDR_MAX;
		}
	}
	i = va_index(va, leaf_level);
	if (g_get(g, t, i) & E_P)
		return -1;
	g_set(g, t, i, gpa | E_LEAF | (leaf_level > 1 ? E_PS : 0) | extra);
	return 0;
}

/* Clear the accessed bit of the 4 KiB leaf mapping @va (g_map() made it). */
static void g_unaccess(struct guest *g, uint64_t root, unsigned levels, uint64_t va)
{
	uint64_t t = root, e;

	for (unsigned lvl = levels; lvl > 1; lvl--)
		t = g_get(g, t, va_index(va, lvl)) & ADDR_MAX;
	e = g_get(g, t, va_index(va, 1));
	assert_true(e & E_P);
	g_set(g, t, va_index(va, 1), e & ~E_A);
}

static int g_read(void *ctx, uint64_t gpa, void *page)
{
	struct guest *g = ctx;

	assert_int_equal(gpa & (PG - 1), 0);
	if (g->fail_err && gpa == g->fail_gpa)
		return g->fail_err;
	if (gpa >= g->size)
		return -ERANGE;
	memcpy(page, g->mem + gpa, PG);
	g->reads[gpa / PG]++;
	g->nreads++;
	if (g->max_reads && g->nreads > g->max_reads)
		fail_msg("walker read %llu tables, more than %llu", (unsigned long long)g->nreads,
			 (unsigned long long)g->max_reads);
	return 0;
}

static int g_visit(void *ctx, uint64_t va, uint64_t gpa, uint64_t len)
{
	struct guest *g = ctx;
	struct leaf *prev = g->ngot ? &g->got[g->ngot - 1] : NULL;
	int ret;

	if (g->charge_w) {
		ret = halite_ptw_charge(g->charge_w, g->charge);
		if (ret)
			return ret;
	}
	/* Ascending and non-overlapping within one walk. */
	if (prev)
		assert_true(prev->va + (prev->len - 1) < va);
	assert_int_equal(gpa & (len - 1), 0);
	assert_int_equal(va & (len - 1), 0);
	if (g->ngot == g->cap) {
		g->cap = g->cap ? 2 * g->cap : 64;
		g->got = realloc(g->got, g->cap * sizeof(*g->got));
		assert_non_null(g->got);
	}
	g->got[g->ngot++] = (struct leaf){ va, gpa, len };
	if (g->stop_after && g->ngot == g->stop_after)
		return g->stop_ret;
	return 0;
}

static int walk(struct halite_ptw *w, struct guest *g, uint64_t cr3, unsigned levels)
{
	g->ngot = 0;
	return halite_ptw_walk(w, cr3, levels, g_read, g_visit, g);
}

static int cmp_leaf(const void *a, const void *b)
{
	uint64_t x = ((const struct leaf *)a)->va, y = ((const struct leaf *)b)->va;

	return x < y ? -1 : x > y;
}

static void expect_leaves(const struct guest *g, const struct leaf *exp, size_t n)
{
	size_t i;

	assert_int_equal(g->ngot, n);
	for (i = 0; i < n; i++) {
		if (g->got[i].va != exp[i].va || g->got[i].gpa != exp[i].gpa ||
		    g->got[i].len != exp[i].len)
			fail_msg("leaf %zu: got va %#llx gpa %#llx len %#llx, want %#llx %#llx %#llx",
				 i, (unsigned long long)g->got[i].va,
				 (unsigned long long)g->got[i].gpa,
				 (unsigned long long)g->got[i].len,
				 (unsigned long long)exp[i].va, (unsigned long long)exp[i].gpa,
				 (unsigned long long)exp[i].len);
	}
}

static void expect_each_table_read_once(const struct guest *g)
{
	uint64_t i;

	for (i = 0; i < g->nalloc; i++)
		assert_int_equal(g->reads[g->order[i]], 1);
	assert_int_equal(g->nreads, g_ntables(g));
}

static struct halite_ptw *new_walker(uint64_t hint)
{
	struct halite_ptw *w = NULL;

	assert_int_equal(halite_ptw_create(&w, hint), 0);
	assert_non_null(w);
	return w;
}

static struct halite_ptw_stats stats(const struct halite_ptw *w)
{
	struct halite_ptw_stats st;

	halite_ptw_stats(w, &st);
	return st;
}

#define N(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static void test_4k_scattered(void **state)
{
	/* Listed out of order on purpose; the walk must sort them by va. */
	static const struct leaf maps[] = {
		{ 0x7ffffffff000ull, 0x3000, PG },
		{ 0x1000, 0x12345000, PG },
		{ 0x8000000000ull, 0xa000, PG },	/* PML4 slot 1 */
		{ 0x401000, ADDR_MAX, PG },		/* highest 52-bit page */
		{ 0x400000, 0x7000, PG },
		{ 0x40000000, 0x9000, PG },		/* PDPT slot 1 */
	};
	/* Flag bits outside the address a guest may set in a 4 KiB leaf. */
	static const uint64_t extra[] = {
		0, E_XD, 0x7ff0000000000000ull, E_PS /* PAT in a PTE */, 0xe00, 0,
	};
	struct leaf exp[N(maps)];
	struct halite_ptw *w = new_walker(1ull << 30);
	struct halite_ptw_stats st;
	struct guest g;
	uint64_t root;
	size_t i;

	g_init(&g, 64);
	root = g_alloc(&g);
	for (i = 0; i < N(maps); i++)
		assert_int_equal(g_map(&g, root, 4, maps[i].va, maps[i].gpa, PG, extra[i]), 0);
	/* One the guest has not touched since it last cleared the bit. */
	g_unaccess(&g, root, 4, maps[1].va);
	memcpy(exp, maps, sizeof(exp));
	qsort(exp, N(exp), sizeof(exp[0]), cmp_leaf);

	/* PCID in bits 0..11, LAM bits 61/62 and the no-flush bit 63 are not address. */
	assert_int_equal(walk(w, &g, root | 0xabc | 7ull << 61, 4), 0);
	expect_leaves(&g, exp, N(exp));
	expect_each_table_read_once(&g);
	st = stats(w);
	assert_int_equal(st.tables_read, g_ntables(&g));
	assert_int_equal(st.entries_present, g_ntables(&g) - 1 + N(maps));
	assert_int_equal(st.leaves_4k, N(maps));
	assert_int_equal(st.leaves_accessed, N(maps) - 1);
	assert_int_equal(st.leaves_2m + st.leaves_1g, 0);
	assert_int_equal(st.tables_skipped_seen + st.out_of_range + st.reserved_skipped, 0);
	halite_ptw_free(w);
	g_fini(&g);
}

static void test_large_pages(void **state)
{
	struct halite_ptw *w = new_walker(0);
	struct halite_ptw_stats st;
	struct guest g;
	uint64_t root;
	static const struct leaf exp[] = {
		{ 0x1000, 0x5000, PG },
		{ 0x200000, 0x80200000, SZ_2M },
		{ 0x400000, 0x000fffffffe00000ull, SZ_2M },
		{ 0x40000000, 0x1c0000000ull, SZ_1G },
		{ 0xffffffffc0000000ull, 0x000fffffc0000000ull, SZ_1G },
	};

	g_init(&g, 64);
	root = g_alloc(&g);
	/* PAT (bit 12) set in every large leaf: not part of the address. */
	assert_int_equal(g_map(&g, root, 4, 0x1000, 0x5000, PG, E_PS), 0);
	assert_int_equal(g_map(&g, root, 4, 0x200000, 0x80200000, SZ_2M, E_PAT_LARGE), 0);
	assert_int_equal(g_map(&g, root, 4, 0x400000, 0x000fffffffe00000ull, SZ_2M,
			       E_PAT_LARGE | E_XD | 0x7ff0000000000000ull), 0);
	assert_int_equal(g_map(&g, root, 4, 0x40000000, 0x1c0000000ull, SZ_1G, E_PAT_LARGE), 0);
	assert_int_equal(g_map(&g, root, 4, 0xffffffffc0000000ull, 0x000fffffc0000000ull,
			       SZ_1G, E_PAT_LARGE), 0);
	/* Reserved address bits below the page size: the CPU faults, so skip. */
	assert_int_equal(g_map(&g, root, 4, 0x600000, 0x80600000, SZ_2M, 1ull << 13), 0);
	assert_int_equal(g_map(&g, root, 4, 0x80000000, 0x80000000, SZ_1G, 1ull << 29), 0);

	assert_int_equal(walk(w, &g, root, 4), 0);
	expect_leaves(&g, exp, N(exp));
	expect_each_table_read_once(&g);
	st = stats(w);
	assert_int_equal(st.leaves_4k, 1);
	assert_int_equal(st.leaves_2m, 2);
	assert_int_equal(st.leaves_1g, 2);
	assert_int_equal(st.reserved_skipped, 2);
	assert_int_equal(st.entries_present, g_ntables(&g) - 1 + 7);
	halite_ptw_free(w);
	g_fini(&g);
}

static void test_kernel_half(void **state)
{
	struct halite_ptw *w = new_walker(0);
	struct guest g;
	uint64_t root;
	/* Built kernel-first so the order cannot come from insertion. */
	static const struct leaf maps[] = {
		{ 0xffffffff81000000ull, 0x1000000, SZ_2M },	/* kernel text */
		{ 0xffff888000000000ull, 0x0, SZ_1G },		/* direct map */
		{ 0xffff800000000000ull, 0x2000, PG },		/* bottom of upper half */
		{ 0xfffffffffffff000ull, 0x3000, PG },		/* very top */
		{ 0x7ffffffff000ull, 0x4000, PG },		/* top of lower half */
		{ 0x400000, 0x5000, PG },
	};
	struct leaf exp[N(maps)];
	size_t i;

	g_init(&g, 64);
	root = g_alloc(&g);
	for (i = 0; i < N(maps); i++)
		assert_int_equal(g_map(&g, root, 4, maps[i].va, maps[i].gpa, maps[i].len, 0), 0);
	memcpy(exp, maps, sizeof(exp));
	qsort(exp, N(exp), sizeof(exp[0]), cmp_leaf);
	assert_int_equal(exp[0].va, 0x400000);
	assert_int_equal(exp[2].va, 0xffff800000000000ull);

	assert_int_equal(walk(w, &g, root, 4), 0);
	expect_leaves(&g, exp, N(exp));
	expect_each_table_read_once(&g);
	halite_ptw_free(w);
	g_fini(&g);
}

static void test_5level(void **state)
{
	struct halite_ptw *w = new_walker(0);
	struct halite_ptw_stats st;
	struct guest g;
	uint64_t root, decoy;
	static const struct leaf maps[] = {
		{ 0x1000, 0x1000, PG },				/* PML5 slot 0 */
		{ 1ull << 48 | 0x2000, 0x2000, PG },		/* PML5 slot 1 */
		{ 0x00ffffffffe00000ull, 0x200000, SZ_2M },	/* top of lower half */
		{ 0xff00000000000000ull, 0x3000, PG },		/* slot 256: upper half */
		{ 0xff00ffffc0000000ull, 0x40000000, SZ_1G },
		{ 0xfffffffffffff000ull, 0x4000, PG },		/* slot 511 */
	};
	struct leaf exp[N(maps)];
	size_t i;

	g_init(&g, 64);
	root = g_alloc(&g);
	for (i = 0; i < N(maps); i++)
		assert_int_equal(g_map(&g, root, 5, maps[i].va, maps[i].gpa, maps[i].len, 0), 0);
	/* PS in a PML5E is reserved: a PDPT-looking page behind it is ignored. */
	decoy = g_alloc(&g);
	g_set(&g, decoy, 0, 0x80000000 | E_LEAF | E_PS);
	g_set(&g, root, 7, decoy | E_TABLE | E_PS);
	memcpy(exp, maps, sizeof(exp));
	qsort(exp, N(exp), sizeof(exp[0]), cmp_leaf);

	assert_int_equal(walk(w, &g, root, 5), 0);
	expect_leaves(&g, exp, N(exp));
	assert_int_equal(g.reads[decoy / PG], 0);
	st = stats(w);
	assert_int_equal(st.tables_read, g_ntables(&g) - 1);
	assert_int_equal(st.reserved_skipped, 1);
	assert_int_equal(st.leaves_4k, 4);
	assert_int_equal(st.leaves_2m, 1);
	assert_int_equal(st.leaves_1g, 1);
	halite_ptw_free(w);
	g_fini(&g);
}

static void test_nonpresent_junk(void **state)
{
	static const uint64_t junk[] = {
		0xfffffffffffffffeull, E_PS, ADDR_MAX, E_PS | E_RW | 0x1000, 0x2, 0,
	};
	static const struct leaf maps[] = {
		{ 0x1000, 0x11000, PG },
		{ 0x200000, 0x200000, SZ_2M },
		{ 0x40000000, 0x40000000, SZ_1G },
		{ 0xffffc90000000000ull, 0x22000, PG },
	};
	struct halite_ptw *w = new_walker(0);
	struct halite_ptw_stats st;
	uint64_t s = sub_seed(5), root, t;
	struct guest g;
	unsigned i, n = 0;
	uint64_t k;

	g_init(&g, 64);
	root = g_alloc(&g);
	for (i = 0; i < N(maps); i++)
		assert_int_equal(g_map(&g, root, 4, maps[i].va, maps[i].gpa, maps[i].len, 0), 0);
	/* Fill every non-present entry: fixed patterns, then random ones with P clear. */
	for (k = 0; k < g.nalloc; k++)
		for (t = g.order[k] * PG, i = 0; i < 512; i++)
			if (!(g_get(&g, t, i) & E_P))
				g_set(&g, t, i, n < N(junk) ? junk[n++] : t_rand(&s) & ~E_P);

	assert_int_equal(walk(w, &g, root, 4), 0);
	expect_leaves(&g, maps, N(maps));
	expect_each_table_read_once(&g);
	st = stats(w);
	assert_int_equal(st.entries_present, g_ntables(&g) - 1 + N(maps));
	assert_int_equal(st.out_of_range + st.reserved_skipped + st.tables_skipped_seen, 0);
	halite_ptw_free(w);
	g_fini(&g);
}

static void test_reserved_ps_pml4e(void **state)
{
	struct halite_ptw *w = new_walker(0);
	struct halite_ptw_stats st;
	struct guest g;
	uint64_t root, decoy;
	static const struct leaf exp[] = {
		{ 0x1000, 0x7000, PG },
		{ 4ull << 39, 0x8000, PG },
	};

	g_init(&g, 64);
	root = g_alloc(&g);
	assert_int_equal(g_map(&g, root, 4, exp[0].va, exp[0].gpa, PG, 0), 0);
	assert_int_equal(g_map(&g, root, 4, exp[1].va, exp[1].gpa, PG, 0), 0);
	/* A valid-looking PDPT with a 1 GiB leaf, behind a PML4E with PS set. */
	decoy = g_alloc(&g);
	g_set(&g, decoy, 0, 0x40000000 | E_LEAF | E_PS);
	g_set(&g, root, 3, decoy | E_TABLE | E_PS);

	assert_int_equal(walk(w, &g, root, 4), 0);
	expect_leaves(&g, exp, N(exp));
	assert_int_equal(g.reads[decoy / PG], 0);
	st = stats(w);
	assert_int_equal(st.reserved_skipped, 1);
	assert_int_equal(st.tables_read, g_ntables(&g) - 1);
	assert_int_equal(st.entries_present, g_ntables(&g) - 2 + 2 + 1);
	halite_ptw_free(w);
	g_fini(&g);
}

static void test_out_of_range(void **state)
{
	struct halite_ptw *w = new_walker(0);
	struct halite_ptw_stats st;
	struct guest g;
	uint64_t root, pd;
	static const struct leaf exp[] = {
		{ 0x1000, 0x1000, PG },
		{ 0xe00000, 0x2000, PG },	/* after the bad PDE */
		{ 6ull << 39, 0x3000, PG },	/* after the bad PML4Es */
	};
	size_t i;

	g_init(&g, 16);
	root = g_alloc(&g);
	for (i = 0; i < N(exp); i++)
		assert_int_equal(g_map(&g, root, 4, exp[i].va, exp[i].gpa, PG, 0), 0);
	pd = g_get(&g, g_get(&g, root, 0) & ADDR_MAX, 0) & ADDR_MAX;
	g_set(&g, pd, 5, g.size | E_TABLE);		/* the page just past the end */
	g_set(&g, root, 2, (1ull << 40) | E_TABLE);
	g_set(&g, root, 3, ADDR_MAX | E_TABLE);
	g_set(&g, root, 4, (1ull << 40) | E_TABLE); /* again: not tried twice */

	assert_int_equal(walk(w, &g, root, 4), 0);
	expect_leaves(&g, exp, N(exp));
	expect_each_table_read_once(&g);
	st = stats(w);
	assert_int_equal(st.out_of_range, 3);
	assert_int_equal(st.tables_skipped_seen, 1);
	assert_int_equal(st.tables_read, g_ntables(&g));
	/* A pointer outside memory costs a table's units: it was tried. */
	assert_int_equal(st.work, 1 + HALITE_PTW_TABLE_UNITS * (g_ntables(&g) + 3) + N(exp));

	/* A root outside guest memory is an empty tree. */
	assert_int_equal(walk(w, &g, 1ull << 41 | 0x18, 4), 0);
	assert_int_equal(g.ngot, 0);
	st = stats(w);
	assert_int_equal(st.out_of_range, 4);
	halite_ptw_free(w);
	g_fini(&g);
}

static void test_loops(void **state)
{
	struct halite_ptw *w = new_walker(0);
	struct halite_ptw_stats st;
	struct guest g;
	uint64_t root, pdpt, pd, pt;
	static const struct leaf exp1[] = { { 1ull << 39 | 0x5000, 0x5000, PG } };
	struct leaf exp2[2];

	/* PML4E -> the PML4 itself, twice (Windows keeps such a self-map). */
	g_init(&g, 64);
	root = g_alloc(&g);
	g_set(&g, root, 0, root | E_TABLE);
	assert_int_equal(g_map(&g, root, 4, exp1[0].va, exp1[0].gpa, PG, 0), 0);
	g_set(&g, root, 511, root | E_TABLE);
	g.max_reads = g_ntables(&g);
	assert_int_equal(walk(w, &g, root, 4), 0);
	expect_leaves(&g, exp1, 1);
	expect_each_table_read_once(&g);
	st = stats(w);
	assert_int_equal(st.tables_skipped_seen, 2);
	halite_ptw_free(w);
	g_fini(&g);

	/* PDPT -> PD -> the same PDPT; a PTE naming the PD is just a leaf. */
	w = new_walker(0);
	g_init(&g, 64);
	root = g_alloc(&g);
	pdpt = g_alloc(&g);
	pd = g_alloc(&g);
	pt = g_alloc(&g);
	g_set(&g, root, 0, pdpt | E_TABLE);
	g_set(&g, pdpt, 0, pd | E_TABLE);
	g_set(&g, pd, 0, pdpt | E_TABLE);
	g_set(&g, pd, 1, pt | E_TABLE);
	g_set(&g, pt, 7, 0x9000 | E_LEAF);
	g_set(&g, pt, 8, pd | E_LEAF);
	exp2[0] = (struct leaf){ 0x207000, 0x9000, PG };
	exp2[1] = (struct leaf){ 0x208000, pd, PG };
	g.max_reads = g_ntables(&g);
	assert_int_equal(walk(w, &g, root, 4), 0);
	expect_leaves(&g, exp2, 2);
	expect_each_table_read_once(&g);
	st = stats(w);
	assert_int_equal(st.tables_skipped_seen, 1);
	assert_int_equal(st.tables_read, 4);
	halite_ptw_free(w);
	g_fini(&g);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void test_blowup(void **state)
{
	unsigned levels, l, i;

	for (levels = 4; levels <= 5; levels++) {
		struct halite_ptw *w = new_walker(0);
		struct halite_ptw_stats st;
		struct leaf exp[512];
		uint64_t t[5], t0;
		struct guest g;

		/* Every entry of every table points at the single table below it. */
		g_init(&g, 8);
		for (l = 0; l < levels; l++)
			t[l] = g_alloc(&g);
		for (l = 0; l + 1 < levels; l++)
			for (i = 0; i < 512; i++)
				g_set(&g, t[l], i, t[l + 1] | E_TABLE);
		for (i = 0; i < 512; i++) {
			g_set(&g, t[levels - 1], i, (uint64_t)i * PG | E_LEAF);
			exp[i] = (struct leaf){ (uint64_t)i * PG, (uint64_t)i * PG, PG };
		}
		g.max_reads = levels;
		t0 = now_ns();
		assert_int_equal(walk(w, &g, t[0], levels), 0);
		/* Followed naively this is 512^(levels-1) page tables. */
		assert_true(now_ns() - t0 < 1000000000ull);
		expect_leaves(&g, exp, 512);
		expect_each_table_read_once(&g);
		st = stats(w);
		assert_int_equal(st.tables_read, levels);
		assert_int_equal(st.tables_skipped_seen, (levels - 1) * 511);
		assert_int_equal(st.entries_present, levels * 512);
		assert_int_equal(st.work, 1 + levels * HALITE_PTW_TABLE_UNITS + 512);
		halite_ptw_free(w);
		g_fini(&g);
	}
}

static void test_shared_kernel_half(void **state)
{
	struct halite_ptw *w = new_walker(0);
	struct halite_ptw_stats st;
	struct guest g;
	uint64_t a, b;
	static const struct leaf exp_a[] = {
		{ 0x400000, 0x100000, PG },
		{ 0xffffffff80000000ull, 0x1000000, SZ_2M },
		{ 0xffffffff80200000ull, 0x1200000, SZ_2M },
	};
	static const struct leaf exp_b[] = { { 0x600000, 0x200000, PG } };
	static const struct leaf exp_b_fresh[] = {
		{ 0x600000, 0x200000, PG },
		{ 0xffffffff80000000ull, 0x1000000, SZ_2M },
		{ 0xffffffff80200000ull, 0x1200000, SZ_2M },
	};
	size_t i;

	g_init(&g, 64);
	a = g_alloc(&g);
	b = g_alloc(&g);
	for (i = 0; i < N(exp_a); i++)
		assert_int_equal(g_map(&g, a, 4, exp_a[i].va, exp_a[i].gpa, exp_a[i].len, 0), 0);
	assert_int_equal(g_map(&g, b, 4, exp_b[0].va, exp_b[0].gpa, PG, 0), 0);
	g_set(&g, b, 511, g_get(&g, a, 511)); /* one kernel PDPT for both */

	assert_int_equal(walk(w, &g, a, 4), 0);
	expect_leaves(&g, exp_a, N(exp_a));
	assert_int_equal(stats(w).tables_skipped_seen, 0);
	assert_int_equal(walk(w, &g, b, 4), 0);
	expect_leaves(&g, exp_b, N(exp_b));
	expect_each_table_read_once(&g);
	st = stats(w);
	assert_int_equal(st.tables_skipped_seen, 1);
	assert_int_equal(st.tables_read, g_ntables(&g));
	/* The same root again (another vCPU's CR3): nothing new. */
	assert_int_equal(walk(w, &g, a, 4), 0);
	assert_int_equal(g.ngot, 0);
	assert_int_equal(stats(w).tables_skipped_seen, 2);
	halite_ptw_free(w);

	/* Sharing is per walker: a fresh one sees B's kernel half. */
	w = new_walker(0);
	assert_int_equal(walk(w, &g, b, 4), 0);
	expect_leaves(&g, exp_b_fresh, N(exp_b_fresh));
	halite_ptw_free(w);
	g_fini(&g);
}

/* Two PTs of ten leaves each, under PDEs 0 and 1. */
static uint64_t build_two_pts(struct guest *g, struct leaf *exp)
{
	uint64_t root;
	unsigned i;

	g_init(g, 64);
	root = g_alloc(g);
	for (i = 0; i < 20; i++) {
		exp[i].va = (i / 10) * SZ_2M + (i % 10) * PG;
		exp[i].gpa = (uint64_t)(100 + i) * PG;
		exp[i].len = PG;
		assert_int_equal(g_map(g, root, 4, exp[i].va, exp[i].gpa, PG, 0), 0);
	}
	return root;
}

static void test_early_stop(void **state)
{
	struct halite_ptw *w = new_walker(0);
	struct leaf exp[20];
	struct guest g;
	uint64_t root = build_two_pts(&g, exp);

	g.stop_after = 12;
	g.stop_ret = 1;
	assert_int_equal(walk(w, &g, root, 4), 1);
	expect_leaves(&g, exp, 12);
	/*
	 * Walking the root again resumes: the first PT was finished and is
	 * skipped, the second was cut short and is walked from its start.
	 */
	g.stop_after = 0;
	assert_int_equal(walk(w, &g, root, 4), 0);
	expect_leaves(&g, exp + 10, 10);
	assert_int_equal(stats(w).tables_skipped_seen, 1);
	halite_ptw_free(w);

	/* Other positive values come back as they are; negative ones abort. */
	w = new_walker(0);
	g.stop_after = 7;
	g.stop_ret = 42;
	assert_int_equal(walk(w, &g, root, 4), 42);
	expect_leaves(&g, exp, 7);
	g.stop_after = 5;
	g.stop_ret = -ECANCELED;
	assert_int_equal(walk(w, &g, root, 4), -ECANCELED);
	expect_leaves(&g, exp, 5);
	halite_ptw_free(w);
	g_fini(&g);
}

static void test_read_error(void **state)
{
	struct halite_ptw *w = new_walker(0);
	struct leaf exp[20];
	struct guest g;
	uint64_t root = build_two_pts(&g, exp);
	uint64_t pt1 = g_get(&g, g_get(&g, g_get(&g, root, 0) & ADDR_MAX, 0) & ADDR_MAX, 1);

	g.fail_gpa = pt1 & ADDR_MAX;
	g.fail_err = -EIO;
	assert_int_equal(walk(w, &g, root, 4), -EIO);
	expect_leaves(&g, exp, 10);
	/* Once the read works, the walk goes on from the failed table. */
	g.fail_err = 0;
	assert_int_equal(walk(w, &g, root, 4), 0);
	expect_leaves(&g, exp + 10, 10);
	halite_ptw_free(w);

	/* The root itself. */
	w = new_walker(0);
	g.fail_gpa = root;
	g.fail_err = -EIO;
	assert_int_equal(walk(w, &g, root, 4), -EIO);
	assert_int_equal(g.ngot, 0);
	g.fail_err = 0;
	assert_int_equal(walk(w, &g, root, 4), 0);
	expect_leaves(&g, exp, 20);
	halite_ptw_free(w);
	g_fini(&g);
}

/*
 * Work units (one per walk, HALITE_PTW_TABLE_UNITS per table, one per leaf,
 * plus what the visit charges) and the budget: the step that would pass it
 * is refused with -EDQUOT, and so is everything after it.
 */
static void test_work_budget(void **state)
{
	const uint64_t T = HALITE_PTW_TABLE_UNITS;
	/* build_two_pts: PML4, PDPT, PD and two PTs of ten leaves. */
	const uint64_t all = 1 + 5 * T + 20;
	struct halite_ptw *w = new_walker(0);
	struct halite_ptw_stats st;
	struct leaf exp[20];
	struct guest g;
	uint64_t root = build_two_pts(&g, exp);

	assert_int_equal(walk(w, &g, root, 4), 0);
	st = stats(w);
	assert_int_equal(st.work, all);
	assert_int_equal(st.over_budget, 0);
	/* Again: the root is known, one unit. */
	assert_int_equal(walk(w, &g, root, 4), 0);
	assert_int_equal(stats(w).work, all + 1);
	/* A budget below what is spent refuses everything, a charge of 0 too. */
	halite_ptw_set_budget(w, all);
	assert_int_equal(halite_ptw_charge(w, 0), -EDQUOT);
	assert_int_equal(walk(w, &g, root, 4), -EDQUOT);
	st = stats(w);
	assert_int_equal(st.work, all + 1);
	assert_int_equal(st.over_budget, 1);
	halite_ptw_free(w);

	/* Exactly enough: done, and nothing more after. */
	w = new_walker(0);
	halite_ptw_set_budget(w, all);
	assert_int_equal(walk(w, &g, root, 4), 0);
	expect_leaves(&g, exp, 20);
	assert_int_equal(stats(w).over_budget, 0);
	assert_int_equal(halite_ptw_charge(w, 0), 0);
	assert_int_equal(walk(w, &g, root, 4), -EDQUOT);
	assert_int_equal(g.ngot, 0);
	st = stats(w);
	assert_int_equal(st.work, all);
	assert_int_equal(st.over_budget, 1);
	/* Refused for good, even with room again. */
	halite_ptw_set_budget(w, UINT64_MAX);
	assert_int_equal(halite_ptw_charge(w, 1), -EDQUOT);
	halite_ptw_free(w);

	/* Not enough for the second PT: its read is refused, not done. */
	w = new_walker(0);
	g.nreads = 0;
	halite_ptw_set_budget(w, 1 + 4 * T + 10 + T - 1);
	assert_int_equal(walk(w, &g, root, 4), -EDQUOT);
	expect_leaves(&g, exp, 10);
	st = stats(w);
	assert_int_equal(st.tables_read, 4);
	assert_int_equal(st.leaves_4k, 10);
	assert_int_equal(st.work, 1 + 4 * T + 10);
	assert_int_equal(g.nreads, 4);
	halite_ptw_free(w);

	/* Enough for the second PT and three leaves: the fourth leaf is not counted. */
	w = new_walker(0);
	halite_ptw_set_budget(w, 1 + 5 * T + 13);
	assert_int_equal(walk(w, &g, root, 4), -EDQUOT);
	expect_leaves(&g, exp, 13);
	st = stats(w);
	assert_int_equal(st.leaves_4k, 13);
	assert_int_equal(st.work, 1 + 5 * T + 13);
	halite_ptw_free(w);

	/*
	 * The visit charges 100 a leaf: the fourth leaf of the second PT gets
	 * its own unit but not the visit's 100, and the walk returns the
	 * visit's -EDQUOT.
	 */
	w = new_walker(0);
	g.charge_w = w;
	g.charge = 100;
	halite_ptw_set_budget(w, 1 + 5 * T + 13 * 101 + 1 + 99);
	assert_int_equal(walk(w, &g, root, 4), -EDQUOT);
	expect_leaves(&g, exp, 13);
	st = stats(w);
	assert_int_equal(st.work, 1 + 5 * T + 13 * 101 + 1);
	assert_int_equal(st.over_budget, 1);
	g.charge_w = NULL;
	halite_ptw_free(w);
	g_fini(&g);
}

static void test_bad_args(void **state)
{
	struct halite_ptw *w = new_walker(UINT64_MAX);
	struct guest g;

	g_init(&g, 1);
	assert_int_equal(halite_ptw_create(NULL, 0), -EINVAL);
	assert_int_equal(walk(w, &g, 0, 3), -EINVAL);
	assert_int_equal(walk(w, &g, 0, 6), -EINVAL);
	assert_int_equal(walk(w, &g, 0, 0), -EINVAL);
	assert_int_equal(halite_ptw_walk(NULL, 0, 4, g_read, g_visit, &g), -EINVAL);
	assert_int_equal(halite_ptw_walk(w, 0, 4, NULL, g_visit, &g), -EINVAL);
	assert_int_equal(halite_ptw_walk(w, 0, 4, g_read, NULL, &g), -EINVAL);
	assert_int_equal(g.nreads, 0);
	/* An empty root. */
	assert_int_equal(walk(w, &g, 0, 4), 0);
	assert_int_equal(g.ngot, 0);
	halite_ptw_free(w);
	halite_ptw_free(NULL);
	g_fini(&g);
}

static uint64_t sign_extend(uint64_t va, unsigned levels)
{
	unsigned bits = 12 + 9 * levels;

	return va >> (bits - 1) & 1 ? va | ~0ull << bits : va;
}

/*
 * Whether a walk that stopped at leaf @stop re-emits @l when run again: yes
 * if @l comes at or after @stop, or if its table was on the path to @stop
 * (a table counts as walked only once finished); tables finished before
 * stay skipped. In a tree without sharing, a table is identified by the VA
 * bits above it.
 */
static int re_emitted(const struct leaf *l, const struct leaf *stop, unsigned levels)
{
	unsigned bits = 12 + 9 * levels;
	uint64_t mask = (1ull << bits) - 1;
	unsigned lp = l->len == PG ? 1 : l->len == SZ_2M ? 2 : 3;
	unsigned sp = stop->len == PG ? 1 : stop->len == SZ_2M ? 2 : 3;
	unsigned above = 12 + 9 * lp;

	if (l->va >= stop->va)
		return 1;
	return lp >= sp && (l->va & mask) >> above == (stop->va & mask) >> above;
}

/*
 * Stop at random leaves and resume until done: each walk must emit exactly
 * what re_emitted() says, which checks which tables one walker counts as
 * walked across many partial walks.
 */
static void check_resume(struct guest *g, uint64_t root, unsigned levels,
			 const struct leaf *exp, size_t nexp, uint64_t *s)
{
	struct leaf stop = { 0 }, *exp2;
	size_t k, n2, first, stops = 0;
	struct halite_ptw *w;
	int ret;

	exp2 = calloc(nexp + 1, sizeof(*exp2));
	assert_non_null(exp2);
	w = new_walker(0);
	for (;;) {
		for (k = 0, n2 = 0; k < nexp; k++)
			if (!stops || re_emitted(&exp[k], &stop, levels))
				exp2[n2++] = exp[k];
		/* Stop past the last stop, so the walks make progress. */
		for (first = 0; stops && first < n2 && exp2[first].va <= stop.va; first++)
			;
		g->stop_after = 0;
		if (first < n2)
			g->stop_after = first + 1 + t_rand(s) % MIN(n2 - first, 1 + nexp / 8);
		g->stop_ret = 1;
		ret = walk(w, g, root, levels);
		if (!g->stop_after) {
			assert_int_equal(ret, 0);
			expect_leaves(g, exp2, n2);
			break;
		}
		assert_int_equal(ret, 1);
		expect_leaves(g, exp2, g->stop_after);
		stop = exp2[g->stop_after - 1];
		stops++;
	}
	/* Each stop gets at most that many leaves further. */
	assert_true(stops * (1 + nexp / 8) >= nexp);
	halite_ptw_free(w);
	free(exp2);
}

static void random_tree(uint64_t s, unsigned levels, int clustered, int resume)
{
	static const unsigned top[] = { 0, 1, 2, 255, 256, 300, 510, 511 };
	struct halite_ptw *w = new_walker(clustered ? 0 : t_rand(&s) % (1ull << 34));
	unsigned nmaps = 1 + t_rand(&s) % (clustered ? 4000 : 600), i, l;
	struct halite_ptw_stats st;
	size_t nexp = 0, k;
	uint64_t root, t, va, len, gpa, extra, r;
	struct leaf *exp = calloc(nmaps, sizeof(*exp));
	struct guest g;

	assert_non_null(exp);
	g_init(&g, 4096);
	if (t_rand(&s) % 2)
		g_scatter(&g, &s);
	root = g_alloc(&g);
	for (i = 0; i < nmaps; i++) {
		r = t_rand(&s) % 100;
		len = r < 90 ? PG : r < 98 ? SZ_2M : SZ_1G;
		va = (uint64_t)top[t_rand(&s) % N(top)] << (12 + 9 * (levels - 1));
		for (l = levels - 1; l >= 1; l--) {
			unsigned span = !clustered || l == 1 ? 512 : l == 2 ? 16 : 4;

			if (levels == 5 && l == 4)
				span = clustered ? 2 : 512;
			va |= (uint64_t)(t_rand(&s) % span) << (12 + 9 * (l - 1));
		}
		va &= ~(len - 1);
		gpa = t_rand(&s) & ADDR_MAX & ~(len - 1);
		/* Bits a guest may set besides the address: A/D, AVL, pkeys, XD, PAT. */
		extra = t_rand(&s) & (0xfff0000000000e60ull | (len > PG ? E_PAT_LARGE : E_PS));
		if (g_map(&g, root, levels, va, gpa, len, extra))
			continue;
		exp[nexp++] = (struct leaf){ sign_extend(va, levels), gpa, len };
	}
	for (k = 0; k < g.nalloc; k++)
		for (t = g.order[k] * PG, i = 0; i < 512; i++)
			if (!(g_get(&g, t, i) & E_P) && t_rand(&s) % 4 == 0)
				g_set(&g, t, i, t_rand(&s) & ~E_P);
	qsort(exp, nexp, sizeof(*exp), cmp_leaf);

	assert_int_equal(walk(w, &g, root, levels), 0);
	expect_leaves(&g, exp, nexp);
	expect_each_table_read_once(&g);
	st = stats(w);
	assert_int_equal(st.tables_read, g_ntables(&g));
	assert_int_equal(st.entries_present, g_ntables(&g) - 1 + nexp);
	assert_int_equal(st.leaves_4k + st.leaves_2m + st.leaves_1g, nexp);
	assert_int_equal(st.tables_skipped_seen + st.out_of_range + st.reserved_skipped, 0);
	assert_int_equal(st.work, 1 + HALITE_PTW_TABLE_UNITS * st.tables_read + nexp);
	assert_int_equal(st.over_budget, 0);
	halite_ptw_free(w);

	if (resume)
		check_resume(&g, root, levels, exp, nexp, &s);
	free(exp);
	g_fini(&g);
}

static void test_random(void **state)
{
	unsigned i;

	/*
	 * Both depths; every third pair with tables spread out, not clustered.
	 * Stop-and-resume for a quarter of them only: it re-walks a tree about
	 * eight times, which is slow under ThreadSanitizer.
	 */
	for (i = 0; i < 24; i++)
		random_tree(sub_seed(100 + i), 4 + (i & 1), (i >> 1) % 3 != 2, i % 8 < 2);
}

struct speed_ctx {
	struct guest *g;
	uint64_t leaves;
};

static int speed_read(void *ctx, uint64_t gpa, void *page)
{
	return g_read(((struct speed_ctx *)ctx)->g, gpa, page);
}

static int speed_visit(void *ctx, uint64_t va, uint64_t gpa, uint64_t len)
{
	((struct speed_ctx *)ctx)->leaves++;
	return 0;
}

/* Full PDs of full PTs: SPEED_PDS * 2^18 leaves. */
#define SPEED_PDS 1u
#define SPEED_LEAVES (SPEED_PDS * 512u * 512u)
#define SPEED_ENTRIES (SPEED_LEAVES + SPEED_PDS * 512u + SPEED_PDS + 1u)

/* Not a benchmark gate (sanitizer builds are slow): prints the rate. */
static void test_speed(void **state)
{
	struct speed_ctx c;
	struct guest g;
	uint64_t root, pdpt, pd, pt, t0, dt, best = UINT64_MAX;
	unsigned i, j, k, rep;

	g_init(&g, 2 + SPEED_PDS * 513);
	root = g_alloc(&g);
	pdpt = g_alloc(&g);
	g_set(&g, root, 0, pdpt | E_TABLE);
	for (i = 0; i < SPEED_PDS; i++) {
		pd = g_alloc(&g);
		g_set(&g, pdpt, i, pd | E_TABLE);
		for (j = 0; j < 512; j++) {
			pt = g_alloc(&g);
			g_set(&g, pd, j, pt | E_TABLE);
			for (k = 0; k < 512; k++)
				g_set(&g, pt, k, (uint64_t)(i * 512 + j) << 21 | (uint64_t)k << 12 | E_LEAF);
		}
	}
	c.g = &g;
	for (rep = 0; rep < 5; rep++) {
		struct halite_ptw *w = new_walker(8ull << 30);

		c.leaves = 0;
		t0 = now_ns();
		assert_int_equal(halite_ptw_walk(w, root, 4, speed_read, speed_visit, &c), 0);
		dt = now_ns() - t0;
		assert_int_equal(c.leaves, SPEED_LEAVES);
		assert_int_equal(stats(w).entries_present, SPEED_ENTRIES);
		if (dt < best)
			best = dt;
		halite_ptw_free(w);
	}
	print_message("ptwalk: %u entries in %.2f ms: %.1f M entries/s (incl. a 4 KiB copy per table)\n",
		      SPEED_ENTRIES, best / 1e6, SPEED_ENTRIES / (best / 1e3));
	g_fini(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_4k_scattered),
		cmocka_unit_test(test_large_pages),
		cmocka_unit_test(test_kernel_half),
		cmocka_unit_test(test_5level),
		cmocka_unit_test(test_nonpresent_junk),
		cmocka_unit_test(test_reserved_ps_pml4e),
		cmocka_unit_test(test_out_of_range),
		cmocka_unit_test(test_loops),
		cmocka_unit_test(test_blowup),
		cmocka_unit_test(test_shared_kernel_half),
		cmocka_unit_test(test_early_stop),
		cmocka_unit_test(test_read_error),
		cmocka_unit_test(test_work_budget),
		cmocka_unit_test(test_bad_args),
		cmocka_unit_test(test_random),
		cmocka_unit_test(test_speed),
	};

	seed = t_seed("test_ptwalk");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
