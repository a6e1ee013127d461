// SPDX-License-Identifier: MIT
/*
 * Never-touched memory stays unpopulated (mincore), before and after running
 * and after a ground-truth copy, and reads as zero; the untouched and the
 * zero-page counts are exact; filled pages follow t_fill's scheme. For anon
 * memory (THP must not populate neighbours) and for a memfd.
 */
#include <sys/mman.h>
#include <unistd.h>

#include "gtest.h"

static uint64_t check_residency(const struct synth_info *info, const uint8_t *kinds,
				const char *when)
{
	uint64_t pages = info->mem_bytes / 4096, resident = 0;
	unsigned char *vec = xmalloc(pages);

	CHECK_OK(mincore(info->local_addr, info->mem_bytes, vec) ? -errno : 0);
	for (uint64_t p = 0; p < pages; p++) {
		bool untouched = kinds[p] == SYNTH_FRAME_UNTOUCHED;

		if (untouched == !!(vec[p] & 1)) {
			fprintf(stderr, "%s: frame %" PRIu64 " kind %u resident %u\n", when, p,
				kinds[p], vec[p] & 1);
			exit(1);
		}
		resident += vec[p] & 1;
	}
	free(vec);
	return resident;
}

static void run(unsigned backing, unsigned untouched_pct, unsigned zero_pct, unsigned compress,
		uint64_t seed)
{
	SYNTH_OPTS(o, .mem_bytes = 64 << 20, .nvcpus = 2, .map_bytes = 4 << 20,
		   .ws_bytes = 2 << 20, .untouched_pct = untouched_pct, .zero_pct = zero_pct,
		   .compress_pct = compress, .backing = backing, .write_pct = 0, .seed = seed,
		   .log_fn = capture_log);
	struct synth_guest *g;
	struct synth_info info;
	uint64_t pages, untouched = 0, data = 0, zero = 0, pt = 0, resident;
	uint8_t *kinds, *buf;
	unsigned r = compress * 256 / 100;

	fprintf(stderr, "%s: untouched %u%%, zero %u%%, compress %u%%\n",
		backing == SYNTH_MEM_SHARED ? "memfd" : "anon", untouched_pct, zero_pct, compress);
	CHECK_OK(synth_create(&g, &o));
	CHECK_OK(synth_info(g, &info));
	pages = info.mem_bytes / 4096;
	kinds = xmalloc(pages);
	buf = xmalloc(info.mem_bytes);
	CHECK_EQ(synth_frame_kinds(g, 0, kinds, pages), pages);
	for (uint64_t p = 0; p < pages; p++) {
		uint8_t k = kinds[p] & 0x7f;

		untouched += kinds[p] == SYNTH_FRAME_UNTOUCHED;
		pt += kinds[p] == SYNTH_FRAME_PT;
		if (k == SYNTH_FRAME_MAPPED || k == SYNTH_FRAME_UNMAPPED) {
			data++;
			zero += !!(kinds[p] & SYNTH_FRAME_ZERO);
		}
	}
	CHECK_EQ(untouched, pages * untouched_pct / 100);
	CHECK_EQ(untouched, info.untouched_frames);
	CHECK_EQ(pt, info.pt_frames);
	CHECK_EQ(data, info.data_frames);
	CHECK_EQ(data + pt + untouched, pages);
	CHECK_EQ(zero, data * zero_pct / 100);
	CHECK_EQ(zero, info.zero_frames);

	resident = check_residency(&info, kinds, "after create");
	CHECK_EQ(resident, pages - untouched);
	CHECK_OK(synth_copy_memory(g, buf));
	check_residency(&info, kinds, "after copy");

	/* The contents: zero pages and untouched ones are all-zero, no other is. */
	for (uint64_t p = 0; p < pages; p++) {
		const uint8_t *pg = buf + p * 4096;
		bool allzero = pg[0] == 0 && !memcmp(pg, pg + 1, 4095);
		bool should = kinds[p] == SYNTH_FRAME_UNTOUCHED || (kinds[p] & SYNTH_FRAME_ZERO);

		CHECK_EQ(allzero, should);
		if (should || kinds[p] == SYNTH_FRAME_PT)
			continue;
		/* t_fill: past the random share of each 256-byte run, i / 7. */
		for (unsigned i = 0; i < 4096; i++)
			if (i % 256 >= r && pg[i] != (uint8_t)(i / 7)) {
				fprintf(stderr, "frame %" PRIu64 " byte %u\n", p, i);
				exit(1);
			}
	}

	/* Reads only, over the working set: still nothing new populated. */
	CHECK_OK(synth_start(g));
	sleep_ms(30);
	CHECK_OK(synth_pause(g));
	check_residency(&info, kinds, "after running");
	fprintf(stderr, "  %" PRIu64 " frames: %" PRIu64 " untouched (unpopulated), %" PRIu64
		" data of which %" PRIu64 " zero, %" PRIu64 " page tables\n",
		pages, untouched, data, zero, pt);
	synth_free(g);
	free(kinds);
	free(buf);
}

int main(void)
{
	uint64_t seed = t_seed("guest_untouched");

	run(SYNTH_MEM_ANON, 40, 25, 50, seed);
	run(SYNTH_MEM_ANON, 0, 0, 100, seed);
	run(SYNTH_MEM_ANON, 85, 100, 1, seed);
	run(SYNTH_MEM_SHARED, 33, 10, 30, seed);
	return 0;
}
