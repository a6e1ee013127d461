// SPDX-License-Identifier: MIT
/*
 * The guest's page tables: the frame allocator, the builder and the software
 * MMU. The allocation scheme and the virtual layout are described in synth.h;
 * the entry format is the x86-64 one (SDM vol. 3, 4.5), 4- or 5-level.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "internal.h"

/*
 * Small frames: pass r walks H + r, H + r + stride, ... so two consecutive
 * allocations are @stride frames apart, like the paper's workload that
 * allocates "in a 16 page stride" to fragment physical memory.
 */
struct alloc {
	uint64_t base, frames, stride;
	uint64_t r, j;
	uint64_t used;
};

static int alloc_small(struct alloc *a, uint64_t *pfn)
{
	while (a->r < a->stride && a->r < a->frames) {
		uint64_t rel = a->r + a->j * a->stride;

		if (rel < a->frames) {
			a->j++;
			a->used++;
			*pfn = a->base + rel;
			return 0;
		}
		a->r++;
		a->j = 0;
	}
	return -ENOSPC;
}

struct builder {
	struct synth_guest *g;
	uint8_t *mem;		/* where the tables are written: guest memory, or scratch */
	struct alloc a;
	uint64_t junk;		/* rng for junk in non-present entries */
	uint64_t next_1g, next_2m;
	uint64_t mid, leaf;	/* flags of present entries */
};

static inline uint64_t *entry(struct builder *b, uint64_t table, uint64_t va, int lvl)
{
	unsigned idx = (unsigned)(va >> (PG_SHIFT + 9 * (lvl - 1))) & 511;

	return (uint64_t *)(b->mem + table + idx * 8);
}

static int new_table(struct builder *b, uint64_t *pfn)
{
	struct synth_guest *g = b->g;
	uint64_t *t;
	int ret = alloc_small(&b->a, pfn);

	if (ret)
		return ret;
	g->kinds[*pfn] = SYNTH_FRAME_PT;
	g->info.pt_frames++;
	t = (uint64_t *)(b->mem + (*pfn << PG_SHIFT));
	/* Written even when zero: a page-table page is a touched page. */
	if (g->o.flags & SYNTH_F_NP_JUNK) {
		for (unsigned i = 0; i < 512; i++)
			t[i] = synth_rand(&b->junk) & ~PTE_P;
	} else {
		memset(t, 0, PG_SIZE);
	}
	return 0;
}

/*
 * The entry for @va at level @leaf (1: PTE, 2: PDE, 3: PDPTE) in the tree
 * at @root, creating the tables above it on the way.
 */
static int walk_create(struct builder *b, uint64_t root, uint64_t va, int leaf, uint64_t **out)
{
	struct synth_guest *g = b->g;
	uint64_t table = root;

	for (int lvl = (int)g->o.paging_levels; lvl > leaf; lvl--) {
		uint64_t *e = entry(b, table, va, lvl);
		uint64_t pfn;
		int ret;

		if (!(*e & PTE_P)) {
			ret = new_table(b, &pfn);
			if (ret)
				return ret;
			*e = (pfn << PG_SHIFT) | b->mid;
		}
		table = *e & PTE_ADDR;
	}
	*out = entry(b, table, va, leaf);
	return 0;
}

static void record_units(struct synth_vcpu *vc, uint64_t *u, uint64_t va, uint64_t gpa,
			 uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		vc->unit_va[*u] = va + i * PG_SIZE;
		vc->unit_gpa[*u] = gpa + i * PG_SIZE;
		(*u)++;
	}
}

static int map_vcpu(struct builder *b, struct synth_vcpu *vc, uint64_t root)
{
	struct synth_guest *g = b->g;
	const struct synth_opts *o = &g->o;
	uint64_t n4k = (o->map_bytes - o->huge_2m * (2ull << 20) - o->huge_1g * (1ull << 30)) /
		       PG_SIZE;
	uint64_t va = vc->vbase, u = 0, *e, pfn, p;
	int ret;

	for (p = 0; n4k; p++, va += PG_SIZE) {
		if (o->hole_every && p % o->hole_every == o->hole_every - 1)
			continue;
		ret = walk_create(b, root, va, 1, &e);
		if (ret)
			return ret;
		/* The data frame after the tables it needs: allocation order. */
		ret = alloc_small(&b->a, &pfn);
		if (ret)
			return ret;
		g->kinds[pfn] = SYNTH_FRAME_MAPPED;
		*e = (pfn << PG_SHIFT) | b->leaf;
		record_units(vc, &u, va, pfn << PG_SHIFT, 1);
		n4k--;
	}
	va = (va + (2ull << 20) - 1) & ~((2ull << 20) - 1);
	for (unsigned i = 0; i < o->huge_2m; i++, va += 2ull << 20) {
		ret = walk_create(b, root, va, 2, &e);
		if (ret)
			return ret;
		pfn = b->next_2m;
		b->next_2m += HUGE2M_FRAMES;
		memset(g->kinds + pfn, SYNTH_FRAME_MAPPED, HUGE2M_FRAMES);
		*e = (pfn << PG_SHIFT) | b->leaf | PTE_PS;
		record_units(vc, &u, va, pfn << PG_SHIFT, HUGE2M_FRAMES);
	}
	if (o->huge_1g)
		va = (va + (1ull << 30) - 1) & ~((1ull << 30) - 1);
	for (unsigned i = 0; i < o->huge_1g; i++, va += 1ull << 30) {
		ret = walk_create(b, root, va, 3, &e);
		if (ret)
			return ret;
		pfn = b->next_1g;
		b->next_1g += HUGE1G_FRAMES;
		memset(g->kinds + pfn, SYNTH_FRAME_MAPPED, HUGE1G_FRAMES);
		*e = (pfn << PG_SHIFT) | b->leaf | PTE_PS;
		record_units(vc, &u, va, pfn << PG_SHIFT, HUGE1G_FRAMES);
	}
	return u == vc->map_units ? 0 : -EINVAL;
}

int synth_build_tables(struct synth_guest *g, uint8_t *mem)
{
	const struct synth_opts *o = &g->o;
	uint64_t n1g = (uint64_t)o->huge_1g * g->nvcpus, n2m = (uint64_t)o->huge_2m * g->nvcpus;
	uint64_t huge = n1g * HUGE1G_FRAMES + n2m * HUGE2M_FRAMES;
	uint64_t untouched = g->nframes * o->untouched_pct / 100, pfn, root = 0;
	struct builder b = { .g = g, .mem = mem };
	int ret;

	if (huge >= g->nframes) {
		synth_err(g, "huge pages (%llu MiB) leave no memory for page tables",
			  (unsigned long long)(huge >> 8));
		return -EINVAL;
	}
	b.next_1g = 0;
	b.next_2m = n1g * HUGE1G_FRAMES;
	b.a.base = huge;
	b.a.frames = g->nframes - huge;
	b.a.stride = o->stride;
	b.junk = synth_seed(o->seed, 0x6a756e6b); /* "junk" */
	if (o->flags & SYNTH_F_AD_BITS) {
		b.mid = PTE_P | PTE_RW | PTE_US;
		b.leaf = PTE_P | PTE_RW | PTE_US | PTE_NX;
	} else {
		b.mid = PTE_P | PTE_RW | PTE_US | PTE_A;
		b.leaf = PTE_P | PTE_RW | PTE_US | PTE_NX | PTE_A | PTE_D;
	}

	g->info.huge1g_base_pfn = 0;
	g->info.huge2m_base_pfn = b.next_2m;
	g->info.small_base_pfn = b.a.base;
	g->info.small_frames = b.a.frames;

	for (unsigned v = 0; v < g->nvcpus; v++) {
		struct synth_vcpu *vc = &g->vcpu[v];

		if (v == 0 || !(o->flags & SYNTH_F_SHARED_AS)) {
			ret = new_table(&b, &pfn);
			if (ret)
				goto nospace;
			root = pfn << PG_SHIFT;
		}
		vc->cr3 = root;
		ret = map_vcpu(&b, vc, root);
		if (ret == -ENOSPC)
			goto nospace;
		if (ret)
			return ret;
	}
	g->info.small_used = b.a.used;
	if (b.a.frames - b.a.used < untouched) {
		synth_err(g, "page tables and mapped pages take %llu of %llu small frames: "
			  "no room for %llu untouched frames (untouched_pct %u)",
			  (unsigned long long)b.a.used, (unsigned long long)b.a.frames,
			  (unsigned long long)untouched, o->untouched_pct);
		return -EINVAL;
	}
	/* The rest of memory, mapped nowhere, but for the untouched tail. */
	while (b.a.used < b.a.frames - untouched) {
		if (alloc_small(&b.a, &pfn))
			break;
		g->kinds[pfn] = SYNTH_FRAME_UNMAPPED;
	}
	g->info.untouched_frames = untouched;
	return 0;

nospace:
	synth_err(g, "working set does not fit: %u vCPUs x %llu KiB mapped plus page tables "
		  "need more than the %llu KiB of memory",
		  g->nvcpus, (unsigned long long)(o->map_bytes >> 10),
		  (unsigned long long)(g->nframes * 4));
	return -EINVAL;
}

int synth_mmu_translate(struct synth_vcpu *vc, uint64_t va, bool write, uint64_t *gpa)
{
	struct synth_guest *g = vc->g;
	uint64_t memsz = g->nframes << PG_SHIFT, table = vc->cr3 & PTE_ADDR;
	bool ad = g->o.flags & SYNTH_F_AD_BITS;
	bool logwalk = g->o.log_mode && (g->o.flags & SYNTH_F_LOG_WALK);

	for (int lvl = (int)g->o.paging_levels; lvl >= 1; lvl--) {
		unsigned shift = PG_SHIFT + 9 * (lvl - 1);
		uint64_t ea = table + (((va >> shift) & 511) << 3), *ep, e;
		bool leaf;

		if (ea + 8 > memsz)
			return -EFAULT;
		ep = (uint64_t *)(g->mem + ea);
		/* Relaxed: the engine may read (or, with A/D, we may write) it concurrently. */
		e = __atomic_load_n(ep, __ATOMIC_RELAXED);
		if (logwalk)
			synth_log_append(vc, (table >> PG_SHIFT) | SYNTH_LOG_PT);
		if (!(e & PTE_P) || (write && !(e & PTE_RW)))
			return -EFAULT;
		if ((e & PTE_PS) && lvl > 3)
			return -EFAULT; /* reserved bit at PML4/PML5 level */
		leaf = lvl == 1 || (e & PTE_PS);
		if (ad) {
			uint64_t set = PTE_A | (leaf && write ? PTE_D : 0);

			/* The hardware sets A/D with a locked OR, only when clear. */
			if ((e & set) != set)
				__atomic_fetch_or(ep, set, __ATOMIC_RELAXED);
		}
		if (leaf) {
			uint64_t mask = lvl == 1 ? PTE_ADDR : lvl == 2 ? PTE_ADDR_2M : PTE_ADDR_1G;
			uint64_t pa = (e & mask) | (va & ((1ull << shift) - 1));

			if ((pa & ~7ull) + 8 > memsz)
				return -EFAULT;
			*gpa = pa;
			return 0;
		}
		table = e & PTE_ADDR;
	}
	return -EFAULT;
}
