// SPDX-License-Identifier: MIT
/*
 * x86-64 guest page-table walker (Intel SDM vol. 3, 4.5: 4-level and 5-level
 * paging), for saving memory in guest-virtual order (paper section 5.2).
 *
 * The tables come from the guest, so they are hostile input. Choices:
 *
 * - Each table page is walked at most once per walker object, across all
 *   roots, keyed by its guest-physical address alone. That one rule bounds
 *   the tables read by the number of distinct readable table pages (each
 *   at most 512 entries) and covers every bad shape at once: an entry
 *   pointing back up the tree (loops, including the recursive self-map
 *   Windows uses), many entries pointing at one table (exponential
 *   blow-up: 512 PML4Es -> one PDPT -> one PD ... is 2^36 leaves if
 *   followed), and tables shared by many address spaces (the kernel half).
 *   The engine saves each page once anyway, so re-walking a shared table
 *   would only cost time. What it costs: a table reached again at another
 *   level (a self-map) contributes no leaves under that second reading, so
 *   the pages only it maps (the page tables themselves) get no virtual
 *   address from this walker.
 *
 * - A table joins the set when its walk finishes. A reference back to a
 *   table still being walked (a loop) is caught by comparing against the at
 *   most four tables above on the current path. Depth-first order makes the
 *   two together equivalent to marking on entry, and when a walk stops
 *   early or fails, the unfinished tables were simply never marked: a later
 *   walk of the same root picks up where it stopped (re-visiting the leaves
 *   of those unfinished tables) and nothing has to be undone.
 *
 * - The set is open addressing with linear probing over GPA | 1 (GPAs are
 *   page aligned, so 0 can mean empty), kept at most half full and doubled
 *   when needed; nothing is ever removed. Its first size comes from the
 *   guest size: one page table per 2 MiB of guest memory is what a fully
 *   4 KiB-mapped address space needs.
 *
 * - Reserved bits make an entry that the CPU would fault on, so the guest
 *   cannot be using it: PS in a PML5E/PML4E, and address bits below the
 *   page size in a 1 GiB or 2 MiB leaf (bits 13..29 or 13..20; bit 12 is
 *   PAT). Such entries are skipped and counted. MAXPHYADDR is taken as 52:
 *   the guest's real one is not known here, and a smaller one only means
 *   some addresses point outside guest memory, which the read callback
 *   reports. Bits 52..63 (ignored, protection keys, XD) are not looked at.
 *
 * - A table pointer outside guest memory (the read callback says -ERANGE)
 *   is skipped and stays in the set, so it is tried once. Leaf addresses are
 *   passed on unchecked: the walker does not know the guest's memory map.
 *
 * - Nothing is allocated per entry: one 4 KiB buffer per level lives in the
 *   walker, and recursion is at most five deep.
 *
 * - Walking each table once bounds the tables, not the work behind them: a
 *   guest can fill its memory with tables (P pages of it: P tables, 512 P
 *   leaves), and every leaf costs the visit callback whatever it does with
 *   it. So the walker also counts work, in units that each cost a few ns
 *   (the save engine measures 9 on average): a table page read is 512 (the
 *   copy and the scan of its entries), a leaf 1, a walk 1, and the callback
 *   charges its own (the save engine: one per memory block it looks at,
 *   whether it saves it or not). The owner sets a budget proportional to
 *   guest memory; the step that would pass it is refused with -EDQUOT, and
 *   every one after it, so the work of one walker over all its roots never
 *   exceeds the budget. Pointers outside guest memory cost a table's units
 *   too: they stay in the set, and a table of 512 distinct ones must not
 *   grow the set faster than real tables can.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "endian_util.h"
#include "ptwalk.h"

#define PTW_PAGE_SIZE 4096u
#define PTW_ENTRIES 512u
#define PTW_MAX_LEVELS 5u

#define PTE_P (1ull << 0)
#define PTE_A (1ull << 5)
#define PTE_PS (1ull << 7)
/* Address bits 12..51 of a table pointer or 4 KiB leaf (MAXPHYADDR 52). */
#define PTE_ADDR 0x000ffffffffff000ull
#define PTE_ADDR_2M 0x000fffffffe00000ull
#define PTE_ADDR_1G 0x000fffffc0000000ull
/* Reserved address bits of large leaves: below the page size, above PAT. */
#define PTE_RSVD_2M 0x00000000001fe000ull
#define PTE_RSVD_1G 0x000000003fffe000ull

/* 2^22 slots (32 MiB) is the first size for 4 TiB of guest: no bigger, grow instead. */
#define PTW_SET_MIN_BITS 10u
#define PTW_SET_MAX_INIT_BITS 22u

struct halite_ptw {
	uint64_t *slot; /* GPA | 1 of each table walked, 0 = empty */
	uint64_t nslots; /* a power of two */
	uint64_t used;
	unsigned shift; /* 64 - log2(nslots), for the multiplicative hash */
	uint64_t budget; /* of st.work; UINT64_MAX: none */
	struct halite_ptw_stats st;
	uint8_t page[PTW_MAX_LEVELS][PTW_PAGE_SIZE]; /* one per level being walked */
};

struct ptw_walk {
	struct halite_ptw *w;
	halite_ptw_read_fn rd;
	halite_ptw_visit_fn visit;
	void *ctx;
	unsigned levels;
	unsigned va_bits; /* 48 or 57 */
	uint64_t path[PTW_MAX_LEVELS]; /* [l - 1]: the level-l table being walked */
};

static inline uint64_t set_home(const struct halite_ptw *w, uint64_t key)
{
	/* Fibonacci hashing: table GPAs are often consecutive pages. */
	return (key * 0x9e3779b97f4a7c15ull) >> w->shift;
}

/* The slot holding @key, or the empty slot where it would go. */
static uint64_t set_find(const struct halite_ptw *w, uint64_t key)
{
	uint64_t mask = w->nslots - 1, i = set_home(w, key);

	while (w->slot[i] && w->slot[i] != key)
		i = (i + 1) & mask;
	return i;
}

static int set_alloc(struct halite_ptw *w, unsigned bits)
{
	uint64_t *slot = calloc((size_t)1 << bits, sizeof(*slot));

	if (!slot)
		return -ENOMEM;
	w->slot = slot;
	w->nslots = (uint64_t)1 << bits;
	w->shift = 64 - bits;
	return 0;
}

static int set_grow(struct halite_ptw *w)
{
	uint64_t *old = w->slot, n = w->nslots, i;
	int ret;

	if (w->shift <= 64 - 40) /* 2^40 slots: more tables than 52-bit GPAs hold */
		return -ENOMEM;
	ret = set_alloc(w, 64 - w->shift + 1);
	if (ret)
		return ret;
	for (i = 0; i < n; i++)
		if (old[i])
			w->slot[set_find(w, old[i])] = old[i];
	free(old);
	return 0;
}

static int set_has(const struct halite_ptw *w, uint64_t gpa)
{
	return w->slot[set_find(w, gpa | 1)] != 0;
}

/* 0 (also if @gpa was there already) or -ENOMEM. */
static int set_add(struct halite_ptw *w, uint64_t gpa)
{
	uint64_t key = gpa | 1, i;
	int ret;

	i = set_find(w, key);
	if (w->slot[i])
		return 0;
	if (2 * (w->used + 1) > w->nslots) {
		ret = set_grow(w);
		if (ret)
			return ret;
		i = set_find(w, key);
	}
	w->slot[i] = key;
	w->used++;
	return 0;
}

int halite_ptw_create(struct halite_ptw **wp, uint64_t guest_mem_bytes_hint)
{
	struct halite_ptw *w;
	uint64_t tables = (guest_mem_bytes_hint >> 21) + 64;
	unsigned bits = PTW_SET_MIN_BITS;

	if (!wp)
		return -EINVAL;
	while (bits < PTW_SET_MAX_INIT_BITS && ((uint64_t)1 << bits) < 2 * tables)
		bits++;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->budget = UINT64_MAX;
	if (set_alloc(w, bits)) {
		free(w);
		return -ENOMEM;
	}
	*wp = w;
	return 0;
}

void halite_ptw_free(struct halite_ptw *w)
{
	if (!w)
		return;
	free(w->slot);
	free(w);
}

void halite_ptw_stats(const struct halite_ptw *w, struct halite_ptw_stats *st)
{
	*st = w->st;
}

void halite_ptw_set_budget(struct halite_ptw *w, uint64_t units)
{
	w->budget = units;
}

int halite_ptw_charge(struct halite_ptw *w, uint64_t units)
{
	if (w->st.over_budget || w->st.work > w->budget || units > w->budget - w->st.work) {
		w->st.over_budget = 1;
		return -EDQUOT;
	}
	w->st.work += units;
	return 0;
}

static int ptw_leaf(struct ptw_walk *k, uint64_t va, uint64_t e, uint64_t gpa, uint64_t len)
{
	int ret = halite_ptw_charge(k->w, 1);

	if (ret)
		return ret;
	if (e & PTE_A)
		k->w->st.leaves_accessed++;
	if (len == 1ull << 12)
		k->w->st.leaves_4k++;
	else if (len == 1ull << 21)
		k->w->st.leaves_2m++;
	else
		k->w->st.leaves_1g++;
	/* Sign-extend the top translated bit: 47 for 4-level, 56 for 5-level. */
	if (va >> (k->va_bits - 1))
		va |= ~0ull << k->va_bits;
	return k->visit(k->ctx, va, gpa, len);
}

/* Walk the table at @gpa of @level (1 = PT ... 5 = PML5) mapping from @va. */
static int ptw_table(struct ptw_walk *k, uint64_t gpa, unsigned level, uint64_t va)
{
	struct halite_ptw *w = k->w;
	const uint8_t *page = w->page[level - 1];
	unsigned shift = 12 + 9 * (level - 1), i;
	uint64_t e, eva;
	int ret;

	for (i = level; i < k->levels; i++)
		if (k->path[i] == gpa)
			goto seen;
	if (set_has(w, gpa))
		goto seen;
	ret = halite_ptw_charge(w, HALITE_PTW_TABLE_UNITS);
	if (ret)
		return ret;
	ret = k->rd(k->ctx, gpa, w->page[level - 1]);
	if (ret == -ERANGE) {
		w->st.out_of_range++;
		return set_add(w, gpa);
	}
	if (ret < 0)
		return ret;
	w->st.tables_read++;
	k->path[level - 1] = gpa;

	for (i = 0; i < PTW_ENTRIES; i++) {
		e = halite_get_le64(page + 8 * i);
		/* Non-present: every other bit is the guest's to use, e.g. swap entries. */
		if (!(e & PTE_P))
			continue;
		w->st.entries_present++;
		eva = va | (uint64_t)i << shift;
		if (level == 1) {
			/* Bit 7 of a PTE is PAT, not PS. */
			ret = ptw_leaf(k, eva, e, e & PTE_ADDR, 1ull << 12);
		} else if (!(e & PTE_PS)) {
			ret = ptw_table(k, e & PTE_ADDR, level - 1, eva);
		} else if (level == 2 && !(e & PTE_RSVD_2M)) {
			ret = ptw_leaf(k, eva, e, e & PTE_ADDR_2M, 1ull << 21);
		} else if (level == 3 && !(e & PTE_RSVD_1G)) {
			ret = ptw_leaf(k, eva, e, e & PTE_ADDR_1G, 1ull << 30);
		} else {
			w->st.reserved_skipped++;
			continue;
		}
		if (ret)
			return ret;
	}
	return set_add(w, gpa);
seen:
	w->st.tables_skipped_seen++;
	return 0;
}

int halite_ptw_walk(struct halite_ptw *w, uint64_t cr3, unsigned levels,
		    halite_ptw_read_fn rd, halite_ptw_visit_fn visit, void *ctx)
{
	struct ptw_walk k = {
		.w = w, .rd = rd, .visit = visit, .ctx = ctx, .levels = levels,
		.va_bits = 12 + 9 * levels,
	};
	int ret;

	if (!w || !rd || !visit || (levels != 4 && levels != 5))
		return -EINVAL;
	/* A root seen before costs no table read, but a guest can name many. */
	ret = halite_ptw_charge(w, 1);
	if (ret)
		return ret;
	return ptw_table(&k, cr3 & PTE_ADDR, levels, 0);
}
