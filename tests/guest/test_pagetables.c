// SPDX-License-Identifier: MIT
/*
 * The guest's page tables decode correctly: an independent walker (gtest.h)
 * walks every vCPU's CR3 in a copy of guest memory and must find exactly the
 * mapped pages the builder recorded, with the real entry bits; the table and
 * data frames, in the order a builder walking the address space in VA order
 * would have needed them, must be exactly the documented stride sequence.
 * Variants: holes and junk, shared address space, stride 1 and 7, 2 MiB and
 * 1 GiB pages, 5-level paging, A/D bits left clear.
 */
#include "gtest.h"

struct leaves {
	struct tw_leaf *v;
	size_t n, cap;
};

static void add_leaf(void *ctx, const struct tw_leaf *l)
{
	struct leaves *ls = ctx;

	if (ls->n == ls->cap) {
		ls->cap = ls->cap ? 2 * ls->cap : 1024;
		ls->v = realloc(ls->v, ls->cap * sizeof(*ls->v));
		CHECK(ls->v);
	}
	ls->v[ls->n++] = *l;
}

static void run_variant(const char *name, struct synth_opts *o)
{
	struct synth_guest *g;
	struct synth_info info;
	struct synth_vcpu_info vi[SYNTH_MAX_VCPUS];
	uint64_t memsz, *seq, nseq = 0, tables = 0, junk = 0, holes_seen = 0;
	uint64_t next_2m, next_1g, leaves4k = 0, leaves2m = 0, leaves1g = 0;
	uint8_t *mem, *seen, *kinds;
	bool shared_as = o->flags & SYNTH_F_SHARED_AS;

	fprintf(stderr, "variant %s\n", name);
	o->log_fn = capture_log;
	CHECK_OK(synth_create(&g, o));
	CHECK_OK(synth_info(g, &info));
	memsz = info.mem_bytes;
	CHECK_EQ(memsz, o->mem_bytes);
	CHECK_EQ(info.gpa_base, 0);
	CHECK_EQ(info.paging_levels, o->paging_levels ? o->paging_levels : 4);
	mem = xmalloc(memsz);
	CHECK_OK(synth_copy_memory(g, mem));
	kinds = xmalloc(memsz / 4096);
	CHECK_EQ(synth_frame_kinds(g, 0, kinds, memsz / 4096), memsz / 4096);
	seen = calloc(memsz / 4096, 1);
	seq = xmalloc(memsz / 4096 * sizeof(uint64_t));
	next_1g = info.huge1g_base_pfn;
	next_2m = info.huge2m_base_pfn;

	for (unsigned v = 0; v < info.nvcpus; v++) {
		CHECK_OK(synth_vcpu_info(g, v, &vi[v]));
		CHECK_EQ(vi[v].paging_levels, info.paging_levels);
		CHECK(vi[v].tid > 0);
		if (shared_as)
			CHECK_EQ(vi[v].cr3, vi[0].cr3);
		for (unsigned w = 0; w < v && !shared_as; w++)
			CHECK(vi[v].cr3 != vi[w].cr3);
	}

	for (unsigned v = 0; v < info.nvcpus; v++) {
		unsigned v_last = shared_as ? info.nvcpus - 1 : v;
		struct leaves ls = { 0 };
		struct tw_stats st;
		uint64_t nexp = 0, *eva, *egpa, k = 0;

		if (shared_as && v > 0)
			break;
		tw_walk(mem, memsz, vi[v].cr3, (int)info.paging_levels, add_leaf, &ls, &st);
		CHECK_EQ(st.errors, 0);
		tables += st.tables;
		junk += st.nonpresent_junk;

		/* What the builder says is mapped under this root, in VA order. */
		for (unsigned w = v; w <= v_last; w++)
			nexp += vi[w].map_units;
		eva = xmalloc(nexp * 8);
		egpa = xmalloc(nexp * 8);
		for (unsigned w = v, off = 0; w <= v_last; w++) {
			CHECK_EQ(synth_vcpu_pages(g, w, 0, eva + off, egpa + off, vi[w].map_units),
				 vi[w].map_units);
			off += (unsigned)vi[w].map_units;
		}

		for (size_t i = 0; i < ls.n; i++) {
			const struct tw_leaf *l = &ls.v[i];
			uint64_t want = X86_P | X86_RW | X86_US | X86_NX;
			uint64_t ad = X86_A | X86_D;

			CHECK_EQ(l->entry & want, want);
			CHECK_EQ(l->entry & ad, (o->flags & SYNTH_F_AD_BITS) ? 0 : ad);
			for (int p = 0; p < l->npath; p++) {
				uint64_t pfn = l->path[p] >> 12;

				CHECK_EQ(kinds[pfn], SYNTH_FRAME_PT);
				if (!seen[pfn]) {
					seen[pfn] = 1;
					seq[nseq++] = pfn;
				}
			}
			if (l->level == 1) {
				leaves4k++;
				seq[nseq++] = l->pa >> 12;
				CHECK(!(l->entry & X86_PS));
			} else if (l->level == 2) {
				leaves2m++;
				CHECK(l->entry & X86_PS);
				CHECK_EQ(l->pa >> 12, next_2m);
				next_2m += 512;
			} else {
				leaves1g++;
				CHECK(l->entry & X86_PS);
				CHECK_EQ(l->pa >> 12, next_1g);
				next_1g += 512 * 512;
			}
			/* Each 4 KiB piece is the builder's next unit. */
			for (uint64_t off = 0; off < l->size; off += 4096, k++) {
				CHECK(k < nexp);
				CHECK_EQ(l->va + off, eva[k]);
				CHECK_EQ(l->pa + off, egpa[k]);
				CHECK_EQ(kinds[(l->pa + off) >> 12] & 0x7f, SYNTH_FRAME_MAPPED);
			}
			if (o->hole_every && l->level == 1) {
				unsigned w = v;

				while (w < v_last && l->va >= vi[w + 1].vbase)
					w++;
				CHECK((l->va - vi[w].vbase) / 4096 % o->hole_every !=
				      o->hole_every - 1);
				if (i + 1 < ls.n && ls.v[i + 1].level == 1 &&
				    ls.v[i + 1].va - l->va == 8192)
					holes_seen++;
			}
		}
		CHECK_EQ(k, nexp);
		/* The working set is the first ws_units units, inside the mapping. */
		for (unsigned w = v; w <= v_last; w++) {
			CHECK(vi[w].ws_units <= vi[w].map_units);
			CHECK(vi[w].vbase % (1ull << 30) == 0);
			CHECK(vi[w].vspan % (1ull << 30) == 0);
		}
		free(eva);
		free(egpa);
		free(ls.v);
	}

	/* Page-table frames: exactly the ones the builder counts, all of kind PT. */
	CHECK_EQ(tables, info.pt_frames);
	for (uint64_t pfn = 0, n = 0; pfn < memsz / 4096; pfn++) {
		n += kinds[pfn] == SYNTH_FRAME_PT;
		if (pfn + 1 == memsz / 4096)
			CHECK_EQ(n, info.pt_frames);
	}
	/* Allocation order: the documented stride sequence, frame for frame. */
	CHECK_EQ(nseq, info.small_used);
	for (uint64_t k = 0; k < nseq; k++)
		CHECK_EQ(seq[k], expected_small_frame(info.small_base_pfn, info.small_frames,
						       info.stride, k));
	CHECK_EQ(info.stride, o->stride ? o->stride : 16);
	CHECK_EQ(leaves2m, (uint64_t)o->huge_2m * info.nvcpus);
	CHECK_EQ(leaves1g, (uint64_t)o->huge_1g * info.nvcpus);
	CHECK(leaves4k > 0);
	if (o->flags & SYNTH_F_NP_JUNK)
		CHECK(junk > 0);
	else
		CHECK_EQ(junk, 0);
	if (o->hole_every)
		CHECK(holes_seen > 0);
	fprintf(stderr, "  %" PRIu64 " tables, %" PRIu64 " 4K / %" PRIu64 " 2M / %" PRIu64
		" 1G leaves, %" PRIu64 " junk entries, %" PRIu64 " allocations in stride %u\n",
		tables, leaves4k, leaves2m, leaves1g, junk, nseq, info.stride);

	synth_free(g);
	free(mem);
	free(kinds);
	free(seen);
	free(seq);
}

int main(void)
{
	uint64_t seed = t_seed("guest_pagetables");

	{
		SYNTH_OPTS(o, .mem_bytes = 64 << 20, .nvcpus = 4, .map_bytes = 4 << 20,
			   .ws_bytes = 2 << 20, .hole_every = 5, .flags = SYNTH_F_NP_JUNK,
			   .seed = seed);
		run_variant("4-level, stride 16, holes, junk", &o);
	}
	{
		SYNTH_OPTS(o, .mem_bytes = 32 << 20, .nvcpus = 3, .map_bytes = 3 << 20,
			   .stride = 7, .flags = SYNTH_F_SHARED_AS, .seed = seed,
			   .backing = SYNTH_MEM_SHARED);
		run_variant("shared address space, stride 7, memfd", &o);
	}
	{
		SYNTH_OPTS(o, .mem_bytes = 16 << 20, .nvcpus = 2, .map_bytes = 2 << 20,
			   .stride = 1, .flags = SYNTH_F_AD_BITS, .seed = seed);
		run_variant("stride 1, A/D clear", &o);
	}
	{
		SYNTH_OPTS(o, .mem_bytes = 64 << 20, .nvcpus = 2, .huge_2m = 3,
			   .map_bytes = (6 << 20) + (1 << 20) + 4096, .hole_every = 9,
			   .flags = SYNTH_F_NP_JUNK, .seed = seed);
		run_variant("2 MiB pages", &o);
	}
	{
		SYNTH_OPTS(o, .mem_bytes = 64 << 20, .nvcpus = 3, .paging_levels = 5,
			   .map_bytes = (2 << 20) + (512 << 10), .huge_2m = 1, .hole_every = 3,
			   .flags = SYNTH_F_NP_JUNK, .seed = seed, .backing = SYNTH_MEM_SHARED);
		run_variant("5-level, 2 MiB pages, memfd", &o);
	}
	{
		SYNTH_OPTS(o, .mem_bytes = 16 << 20, .nvcpus = 16, .map_bytes = 256 << 10,
			   .stride = 512, .flags = SYNTH_F_SHARED_AS | SYNTH_F_NP_JUNK,
			   .paging_levels = 5, .seed = seed);
		run_variant("16 vCPUs, stride 512, 5-level shared", &o);
	}
#ifndef __SANITIZE_THREAD__
	/*
	 * Not under ThreadSanitizer: nothing here is threaded, and a GiB of
	 * memory through its shadow takes half a minute.
	 */
	{
		/* Zeroed data: a 1 GiB page is a lot of memory to fill with patterns. */
		SYNTH_OPTS(o, .mem_bytes = (1ull << 30) + (32 << 20), .nvcpus = 1,
			   .huge_1g = 1, .huge_2m = 1, .map_bytes = (1ull << 30) + (3 << 20),
			   .zero_pct = 100, .untouched_pct = 1, .flags = SYNTH_F_NP_JUNK,
			   .paging_levels = 5, .seed = seed);
		run_variant("1 GiB page, 5-level", &o);
	}
#endif
	return 0;
}
