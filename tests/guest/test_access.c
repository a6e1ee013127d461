// SPDX-License-Identifier: MIT
/*
 * Accesses land where translation says. The seq pattern is documented (access
 * i: unit i mod ws_units, word (i / ws_units) mod 512), so the test computes
 * each access's VA itself, translates it with its own walker in the memory
 * copied before the run, and then requires of the copy after the run: every
 * word written k times grew by exactly k * SYNTH_WRITE_ADD, every other byte
 * is unchanged, and the vCPU's log lists exactly those frames in order.
 * Then with random accesses, a TLB and A/D bits: only written pages and
 * page-table pages change, and A/D bits are set exactly where the hardware
 * would set them.
 */
#include "gtest.h"

#define K 1500

struct wcount {
	uint64_t *cnt;	/* per 8-byte word of memory */
};


/* The guest's memory before and after one whole run, paused at the end. */
static void run_between_copies(struct synth_guest *g, uint8_t *before, uint8_t *after)
{
	CHECK_OK(synth_copy_memory(g, before));
	CHECK_OK(synth_start(g));
	CHECK_OK(synth_wait_done(g, 30000));
	CHECK_OK(synth_pause(g));
	CHECK_OK(synth_copy_memory(g, after));
}

static void seq_writes(uint64_t seed)
{
	SYNTH_OPTS(o, .mem_bytes = 32 << 20, .nvcpus = 3, .map_bytes = 2 << 20,
		   .ws_bytes = (1 << 20) + 4096 * 3, .hole_every = 7, .write_pct = 100,
		   .max_accesses = K, .log_mode = SYNTH_LOG_ALL, .log_entries = K,
		   .flags = SYNTH_F_NP_JUNK, .seed = seed, .log_fn = capture_log);
	struct synth_guest *g;
	struct synth_info info;
	uint8_t *before, *after;
	uint64_t *cnt, words, *log = xmalloc(K * 8);
	uint64_t changed_words = 0;

	CHECK_OK(synth_create(&g, &o));
	CHECK_OK(synth_info(g, &info));
	words = info.mem_bytes / 8;
	before = xmalloc(info.mem_bytes);
	after = xmalloc(info.mem_bytes);
	cnt = calloc(words, 8);
	CHECK(cnt);
	run_between_copies(g, before, after);

	for (unsigned v = 0; v < info.nvcpus; v++) {
		struct synth_vcpu_info vi;
		struct synth_vcpu_stats st;
		uint64_t *units;

		CHECK_OK(synth_vcpu_info(g, v, &vi));
		CHECK_OK(synth_vcpu_stats(g, v, &st));
		CHECK_EQ(st.accesses, K);
		CHECK_EQ(st.writes, K);
		CHECK_EQ(st.faults, 0);
		CHECK_EQ(st.walks, K);
		CHECK_EQ(st.log_len, K);
		CHECK_EQ(st.log_dropped, 0);
		CHECK(st.done);
		CHECK_EQ(vi.ws_units, o.ws_bytes / 4096);
		units = xmalloc(vi.ws_units * 8);
		CHECK_EQ(synth_vcpu_pages(g, v, 0, units, NULL, vi.ws_units), vi.ws_units);
		CHECK_EQ(synth_log_read(g, v, 0, log, K), K);
		for (uint64_t i = 0; i < K; i++) {
			uint64_t va = units[i % vi.ws_units] + (i / vi.ws_units) * 8 % 4096, pa;

			CHECK_OK(tw_translate(before, info.mem_bytes, vi.cr3, 4, va, &pa, NULL) ? -EFAULT : 0);
			cnt[pa / 8]++;
			CHECK_EQ(log[i], (pa >> 12) | SYNTH_LOG_WRITE);
		}
		free(units);
	}
	for (uint64_t w = 0; w < words; w++) {
		uint64_t b, a;

		memcpy(&b, before + w * 8, 8);
		memcpy(&a, after + w * 8, 8);
		CHECK_EQ(a, b + cnt[w] * SYNTH_WRITE_ADD);
		changed_words += a != b;
	}
	fprintf(stderr, "seq: %" PRIu64 " words changed, all at translated GPAs\n", changed_words);
	CHECK(changed_words > 0);
	CHECK_OK(synth_stop(g));
	synth_free(g);
	free(before);
	free(after);
	free(cnt);
	free(log);
}

/* With LOG_WALK the log is the frames each walk reads, then the data frame. */
static void walk_log(uint64_t seed)
{
	SYNTH_OPTS(o, .mem_bytes = 16 << 20, .nvcpus = 2, .map_bytes = 1 << 20,
		   .write_pct = 30, .max_accesses = 300, .log_mode = SYNTH_LOG_ALL,
		   .log_entries = 300 * 6, .paging_levels = 5, .flags = SYNTH_F_LOG_WALK,
		   .seed = seed);
	struct synth_guest *g;
	struct synth_info info;
	uint8_t *mem;
	uint64_t *log = xmalloc(300 * 6 * 8);

	CHECK_OK(synth_create(&g, &o));
	CHECK_OK(synth_info(g, &info));
	mem = xmalloc(info.mem_bytes);
	CHECK_OK(synth_copy_memory(g, mem));
	CHECK_OK(synth_start(g));
	CHECK_OK(synth_wait_done(g, 30000));
	CHECK_OK(synth_pause(g));
	for (unsigned v = 0; v < info.nvcpus; v++) {
		struct synth_vcpu_info vi;
		uint64_t *units, n, writes = 0;

		CHECK_OK(synth_vcpu_info(g, v, &vi));
		units = xmalloc(vi.ws_units * 8);
		CHECK_EQ(synth_vcpu_pages(g, v, 0, units, NULL, vi.ws_units), vi.ws_units);
		n = (uint64_t)synth_log_read(g, v, 0, log, 300 * 6);
		CHECK_EQ(n, 300 * 6);
		for (uint64_t i = 0; i < 300; i++) {
			const uint64_t *e = log + i * 6;
			uint64_t va = units[i % vi.ws_units] + (i / vi.ws_units) * 8 % 4096;
			uint64_t table = vi.cr3, pa;

			/* PML5, PML4, PDPT, PD, PT: each the previous entry's target. */
			for (int lvl = 5; lvl >= 1; lvl--) {
				uint64_t ent;

				CHECK_EQ(e[5 - lvl], (table >> 12) | SYNTH_LOG_PT);
				ent = tw_read(mem, table + ((va >> (12 + 9 * (lvl - 1))) & 511) * 8);
				table = ent & X86_ADDR_MASK;
			}
			CHECK_OK(tw_translate(mem, info.mem_bytes, vi.cr3, 5, va, &pa, NULL) ? -EFAULT : 0);
			CHECK_EQ(SYNTH_LOG_PFN(e[5]), pa >> 12);
			writes += !!(e[5] & SYNTH_LOG_WRITE);
		}
		CHECK(writes > 0 && writes < 300);
		free(units);
	}
	synth_free(g);
	free(mem);
	free(log);
}

/* Random accesses through a TLB with A/D bits: the MMU writes page tables too. */
static void random_ad(uint64_t seed)
{
	enum { N = 4000 };
	SYNTH_OPTS(o, .mem_bytes = 32 << 20, .nvcpus = 2, .map_bytes = 1 << 20,
		   .ws_bytes = 512 << 10, .pattern = SYNTH_PAT_RANDOM, .write_pct = 20,
		   .max_accesses = N, .log_mode = SYNTH_LOG_ALL, .log_entries = N,
		   .tlb_entries = 64, .flags = SYNTH_F_AD_BITS, .seed = seed);
	struct synth_guest *g;
	struct synth_info info;
	uint8_t *before, *after, *touched, *written, *kinds;
	uint64_t *log = xmalloc(N * 8), pages;

	CHECK_OK(synth_create(&g, &o));
	CHECK_OK(synth_info(g, &info));
	pages = info.mem_bytes / 4096;
	before = xmalloc(info.mem_bytes);
	after = xmalloc(info.mem_bytes);
	touched = calloc(pages, 1);
	written = calloc(pages, 1);
	kinds = xmalloc(pages);
	CHECK_EQ(synth_frame_kinds(g, 0, kinds, pages), pages);
	run_between_copies(g, before, after);

	for (unsigned v = 0; v < info.nvcpus; v++) {
		struct synth_vcpu_stats st;

		CHECK_OK(synth_vcpu_stats(g, v, &st));
		CHECK_EQ(st.accesses, N);
		CHECK_EQ(st.faults, 0);
		/* 128 pages through 64 entries: some hits, some misses. */
		CHECK(st.walks < N && st.walks > N / 4);
		CHECK_EQ(synth_log_read(g, v, 0, log, N), N);
		for (unsigned i = 0; i < N; i++) {
			touched[SYNTH_LOG_PFN(log[i])] = 1;
			if (log[i] & SYNTH_LOG_WRITE)
				written[SYNTH_LOG_PFN(log[i])] = 1;
		}
	}
	for (uint64_t p = 0; p < pages; p++) {
		bool same = !memcmp(before + p * 4096, after + p * 4096, 4096);

		if (kinds[p] == SYNTH_FRAME_PT)
			continue;
		CHECK(same == !written[p]);
	}
	/* Every leaf: A iff the page was accessed, D iff it was written. */
	for (unsigned v = 0; v < info.nvcpus; v++) {
		struct synth_vcpu_info vi;
		uint64_t *va, *gpa;

		CHECK_OK(synth_vcpu_info(g, v, &vi));
		va = xmalloc(vi.map_units * 8);
		gpa = xmalloc(vi.map_units * 8);
		CHECK_EQ(synth_vcpu_pages(g, v, 0, va, gpa, vi.map_units), vi.map_units);
		for (uint64_t u = 0; u < vi.map_units; u++) {
			uint64_t pa, epa, e;

			CHECK_OK(tw_translate(after, info.mem_bytes, vi.cr3, 4, va[u], &pa, &epa) ? -EFAULT : 0);
			CHECK_EQ(pa, gpa[u]);
			e = tw_read(after, epa);
			CHECK_EQ(!!(e & X86_A), touched[pa >> 12]);
			CHECK_EQ(!!(e & X86_D), written[pa >> 12]);
			CHECK_EQ(tw_read(before, epa) & (X86_A | X86_D), 0);
		}
		free(va);
		free(gpa);
	}
	synth_free(g);
	free(before);
	free(after);
	free(touched);
	free(written);
	free(kinds);
	free(log);
}

int main(void)
{
	uint64_t seed = t_seed("guest_access");

	seq_writes(seed);
	walk_log(seed);
	random_ad(seed);
	return 0;
}
