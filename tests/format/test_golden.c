/* SPDX-License-Identifier: MIT */
/*
 * Every golden file in tests/golden/ (written once by golden_gen from
 * golden_data.h) must keep reading, field for field and byte for byte, with
 * every later reader. The files themselves are pinned by their hash: a
 * regenerated or edited golden file fails here before anything else does.
 *
 *   test_golden DIR     (DIR: tests/golden)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include <halite/halite.h>

#include "golden_data.h"
#include "test_util.h"

/* What golden_gen wrote, per file, in golden_codecs order. */
static const struct {
	uint64_t file_size;
	uint64_t lb_count;
	uint64_t mb_compressed;
	uint64_t stored_bytes;
	uint64_t xxh3; /* XXH3_64bits of the whole file */
} pinned[GOLDEN_NFILES] = {
	{ 112496, 13, 0, 102400, 0x37d74312caeaff13ull },  /* v1.0-none.hlt */
	{ 96056, 11, 10, 55386, 0xf267b59df4af9b3eull },   /* v1.0-lz4.hlt */
	{ 79632, 9, 10, 45441, 0x81716dc185298183ull },	   /* v1.0-zlib.hlt */
	{ 79632, 9, 10, 46095, 0x3424882be79dd18dull },	   /* v1.0-zstd.hlt */
	{ 112744, 13, 0, 102400, 0x1cbc13f9a1fd86afull },  /* v1.1-none.hlt */
	{ 96304, 11, 10, 55386, 0x921c3f16cb20ed2cull },   /* v1.1-lz4.hlt */
	{ 79880, 9, 10, 45441, 0x2e2331ecffd6baf5ull },	   /* v1.1-zlib.hlt */
	{ 79880, 9, 10, 46095, 0x0c9ee273472fe68aull },	   /* v1.1-zstd.hlt */
};

static const char *golden_dir;

static char *path_of(size_t i)
{
	char *p;

	assert_true(asprintf(&p, "%s/%s", golden_dir, golden_codecs[i].file) > 0);
	return p;
}

static void check_pinned(size_t i, const char *path)
{
	size_t len = 0;
	char *b = t_slurp(path, &len);
	uint64_t h;

	assert_non_null(b);
	h = XXH3_64bits(b, len);
	free(b);
	if ((uint64_t)len != pinned[i].file_size || h != pinned[i].xxh3)
		fail_msg("%s: %zu bytes, XXH3 0x%016llx; the committed file had %llu bytes, XXH3 "
			 "0x%016llx. Golden files must never change (tests/golden/README.md).",
			 path, len, (unsigned long long)h, (unsigned long long)pinned[i].file_size,
			 (unsigned long long)pinned[i].xxh3);
}

static void check_header(size_t i, struct halite_reader *r)
{
	const struct halite_file_info *fi = halite_reader_info(r);
	static const uint8_t zero_uuid[16];
	uint64_t mem = 0;

	assert_int_equal(fi->version_major, 1);
	assert_int_equal(fi->version_minor, golden_codecs[i].minor);
	/* 1.1: bit 0, the chunked index */
	assert_int_equal(fi->incompat_flags, golden_codecs[i].minor ? 1 : 0);
	assert_int_equal(fi->compat_flags, 0);
	assert_memory_not_equal(fi->uuid, zero_uuid, 16);
	/* Written in 2025 or later, before 2100. */
	assert_true(fi->created_ns > 1735689600ull * 1000000000ull);
	assert_true(fi->created_ns < 4102444800ull * 1000000000ull);
	assert_int_equal(fi->page_size, GOLDEN_PAGE);
	assert_int_equal(fi->mb_pages, GOLDEN_MB_PAGES);
	assert_int_equal(fi->mb_size, GOLDEN_MB_SIZE);
	assert_int_equal(fi->lb_size, GOLDEN_LB_SIZE);
	assert_int_equal(fi->codec, golden_codecs[i].codec);
	assert_int_equal(fi->codec_level, golden_codecs[i].level);
	assert_int_equal(fi->file_size, pinned[i].file_size);
	assert_int_equal(fi->data_offset, 4096);
	assert_int_equal(fi->lb_count, pinned[i].lb_count);
	assert_int_equal(fi->mb_count, GOLDEN_NMB);
	assert_int_equal(fi->region_count, GOLDEN_NREGIONS);
	assert_int_equal(fi->mb_untouched, 3);
	assert_int_equal(fi->mb_zero, 2);
	assert_int_equal(fi->mb_stored, 13);
	assert_int_equal(fi->mb_compressed, pinned[i].mb_compressed);
	assert_int_equal(fi->stored_bytes, pinned[i].stored_bytes);
	for (uint32_t k = 0; k < GOLDEN_NREGIONS; k++)
		mem += golden_regions[k].length;
	assert_int_equal(fi->memory_bytes, mem);
}

static void check_regions(struct halite_reader *r)
{
	uint64_t first = 0;

	for (uint32_t k = 0; k < GOLDEN_NREGIONS; k++) {
		const struct halite_region_info *ri = halite_reader_region(r, k);
		uint64_t n = (golden_regions[k].length + GOLDEN_MB_SIZE - 1) / GOLDEN_MB_SIZE;

		assert_non_null(ri);
		assert_string_equal(ri->name, golden_regions[k].name);
		assert_int_equal(ri->gpa, golden_regions[k].gpa);
		assert_int_equal(ri->length, golden_regions[k].length);
		assert_int_equal(ri->first_mb, first);
		assert_int_equal(ri->mb_count, n);
		assert_int_equal(halite_reader_find_region(r, golden_regions[k].name), (int)k);
		first += n;
	}
	assert_null(halite_reader_region(r, GOLDEN_NREGIONS));
	assert_int_equal(halite_reader_find_region(r, "pc.ra"), -HALITE_E_NOT_FOUND);
	assert_int_equal(first, GOLDEN_NMB);
}

/* Every MB: state, encoding, size and bytes. */
static void check_mbs(size_t i, struct halite_reader *r)
{
	uint8_t *lb = halite_reader_alloc_lb(r);
	uint8_t want[GOLDEN_MB_SIZE], got[GOLDEN_MB_SIZE];
	uint64_t compressed = 0;

	assert_non_null(lb);
	for (uint64_t m = 0; m < GOLDEN_NMB; m++) {
		struct halite_mb_loc loc;
		uint32_t bytes = halite_reader_mb_bytes(r, m);
		int cls = golden_class_of[m];

		assert_int_equal(bytes, m == GOLDEN_NMB - 1 ? 4096 : GOLDEN_MB_SIZE);
		assert_int_equal(halite_reader_mb_lookup(r, m, &loc), 0);
		switch (cls) {
		case G_UNTOUCHED:
			assert_int_equal(loc.state, HALITE_MB_UNTOUCHED);
			break;
		case G_ZERO_DATA:
		case G_ZERO_PUT:
			assert_int_equal(loc.state, HALITE_MB_ZERO);
			break;
		default:
			assert_int_equal(loc.state, HALITE_MB_STORED);
			/* Random data never shrinks; everything else does, unless there is no codec. */
			assert_int_equal(loc.compressed,
					 cls != G_RANDOM && golden_codecs[i].codec != HALITE_CODEC_NONE);
			compressed += loc.compressed;
			assert_int_equal(halite_reader_read_lb(r, loc.lb, lb), 0);
			break;
		}
		golden_mb_data(m, bytes, want);
		memset(got, 0x5a, sizeof(got));
		assert_int_equal(halite_reader_decode_mb(r, m, lb, got), 0);
		assert_memory_equal(got, want, bytes);
		memset(got, 0x5a, sizeof(got));
		assert_int_equal(halite_reader_read_mb(r, m, got), 0);
		assert_memory_equal(got, want, bytes);
	}
	assert_int_equal(compressed, pinned[i].mb_compressed);
	halite_reader_free_lb(lb);
}

/*
 * Streams: each stream's LBs, in file order, hold exactly the MBs put to it,
 * in put order, packed from offset 0; seq counts 0, 1, ...; every LB verifies.
 */
static void check_streams(struct halite_reader *r)
{
	const struct halite_file_info *fi = halite_reader_info(r);
	uint64_t pos[GOLDEN_NSTREAMS] = { 0 };
	uint32_t seq[GOLDEN_NSTREAMS] = { 0 };
	uint64_t want[GOLDEN_NSTREAMS][GOLDEN_NPUTS];
	uint64_t nwant[GOLDEN_NSTREAMS] = { 0 };
	uint8_t *buf = halite_reader_alloc_lb(r);

	for (size_t k = 0; k < GOLDEN_NPUTS; k++) {
		uint64_t m = golden_puts[k].mb;

		if (m == G_FLUSH || golden_class_of[m] == G_ZERO_DATA || golden_class_of[m] == G_ZERO_PUT)
			continue;
		for (uint32_t s = 0; s < GOLDEN_NSTREAMS; s++)
			if (golden_streams[s] == golden_puts[k].stream)
				want[s][nwant[s]++] = m;
	}
	for (uint64_t lb = 0; lb < fi->lb_count; lb++) {
		struct halite_lb_info li;
		const uint64_t *mbs;
		uint32_t n, s, used = 0;

		assert_int_equal(halite_reader_lb_info(r, lb, &li), 0);
		for (s = 0; s < GOLDEN_NSTREAMS && golden_streams[s] != li.stream; s++)
			;
		assert_true(s < GOLDEN_NSTREAMS);
		assert_int_equal(li.seq, seq[s]++);
		assert_int_equal(li.offset, fi->data_offset + lb * GOLDEN_LB_SIZE);
		assert_int_equal(halite_reader_lb_members(r, lb, &mbs, &n), 0);
		assert_int_equal(n, li.mb_count);
		assert_true(n >= 1);
		for (uint32_t j = 0; j < n; j++) {
			struct halite_mb_loc loc;

			assert_true(pos[s] < nwant[s]);
			assert_int_equal(mbs[j], want[s][pos[s]++]);
			assert_int_equal(halite_reader_mb_lookup(r, mbs[j], &loc), 0);
			assert_int_equal(loc.lb, lb);
			assert_int_equal(loc.offset, used);
			used += loc.length;
		}
		assert_int_equal(li.used, used);
		assert_int_equal(halite_reader_read_lb(r, lb, buf), 0);
		assert_int_equal(halite_reader_verify_lb(r, lb, buf), 0);
		for (uint32_t k = used; k < GOLDEN_LB_SIZE; k++)
			assert_int_equal(buf[k], 0); /* slack is zero */
	}
	for (uint32_t s = 0; s < GOLDEN_NSTREAMS; s++)
		assert_int_equal(pos[s], nwant[s]);
	halite_reader_free_lb(buf);
}

static void check_sections(size_t i, struct halite_reader *r)
{
	static const uint32_t types_1_0[] = {
		HALITE_SECTION_REGIONS, HALITE_SECTION_MB_MAP, HALITE_SECTION_LB_TABLE,
		HALITE_SECTION_VCPUS, HALITE_SECTION_DEVICE_STATE, HALITE_SECTION_METADATA,
		HALITE_SECTION_SAVE_STATS,
	};
	static const uint32_t types_1_1[] = {
		HALITE_SECTION_REGIONS, HALITE_SECTION_MB_MAP, HALITE_SECTION_LB_TABLE,
		HALITE_SECTION_LB_MEMBERS, HALITE_SECTION_INDEX, HALITE_SECTION_VCPUS,
		HALITE_SECTION_DEVICE_STATE, HALITE_SECTION_METADATA, HALITE_SECTION_SAVE_STATS,
	};
	const uint32_t *types = golden_codecs[i].minor ? types_1_1 : types_1_0;
	uint32_t nsec = golden_codecs[i].minor ? 9 : 7;
	uint8_t dev[GOLDEN_DEV_LEN];
	const struct halite_root *roots;
	uint32_t vcpus, nroots, n, type, len;
	const void *data, *value;
	const char *key;
	uint64_t dlen, off, slen, v;

	assert_int_equal(halite_reader_section_count(r), nsec);
	assert_int_equal(halite_reader_verify_index(r), 0);
	for (uint32_t k = 0; k < nsec; k++) {
		assert_int_equal(halite_reader_section(r, k, &type, &off, &slen), 0);
		assert_int_equal(type, types[k]);
		assert_int_equal(halite_reader_verify_section(r, k), 0);
	}

	assert_int_equal(halite_reader_vcpus(r, &vcpus, &roots, &nroots), 0);
	assert_int_equal(vcpus, GOLDEN_VCPUS);
	assert_int_equal(nroots, GOLDEN_NROOTS);
	for (uint32_t k = 0; k < GOLDEN_NROOTS; k++) {
		assert_int_equal(roots[k].vcpu, golden_roots[k].vcpu);
		assert_int_equal(roots[k].mode, golden_roots[k].mode);
		assert_int_equal(roots[k].cr3, golden_roots[k].cr3);
	}

	golden_device_state(dev);
	assert_int_equal(halite_reader_device_state(r, &data, &dlen), 0);
	assert_int_equal(dlen, GOLDEN_DEV_LEN);
	assert_memory_equal(data, dev, GOLDEN_DEV_LEN);

	n = halite_reader_meta_count(r);
	assert_int_equal(n, GOLDEN_NMETA + 1);
	for (uint32_t k = 0; k < GOLDEN_NMETA; k++) {
		assert_int_equal(halite_reader_meta(r, k, &key, &value, &len), 0);
		assert_string_equal(key, golden_meta[k].key);
		assert_int_equal(len, golden_meta[k].len);
		if (len)
			assert_memory_equal(value, golden_meta[k].value, len);
	}
	assert_int_equal(halite_reader_meta(r, GOLDEN_NMETA, &key, &value, &len), 0);
	assert_string_equal(key, "codec");
	assert_int_equal(len, strlen(halite_codec_name(golden_codecs[i].codec)));
	assert_memory_equal(value, halite_codec_name(golden_codecs[i].codec), len);
	assert_int_equal(halite_reader_meta(r, n, &key, &value, &len), -ERANGE);

	assert_int_equal(halite_reader_stat_count(r), GOLDEN_NSTATS);
	for (uint32_t k = 0; k < GOLDEN_NSTATS; k++) {
		assert_int_equal(halite_reader_stat(r, k, &key, &v), 0);
		assert_string_equal(key, golden_stats[k].key);
		assert_int_equal(v, golden_stats[k].value);
	}
	assert_int_equal(halite_reader_stat(r, GOLDEN_NSTATS, &key, &v), -ERANGE);
}

static void test_file(void **state)
{
	size_t i = (size_t)(uintptr_t)*state;
	char *path = path_of(i), err[512];
	HALITE_OPTS(halite_reader_opts, o);
	struct halite_reader *r;
	int ret;

	check_pinned(i, path);
	o.errbuf = err;
	o.errbuf_len = sizeof(err);
	ret = halite_reader_open(&r, path, &o);
	if (ret)
		fail_msg("%s: %s", path, err);
	check_header(i, r);
	check_regions(r);
	check_mbs(i, r);
	check_streams(r);
	check_sections(i, r);
	halite_reader_free(r);
	free(path);
}

int main(int argc, char **argv)
{
	struct CMUnitTest tests[GOLDEN_NFILES];

	if (argc != 2) {
		fprintf(stderr, "usage: %s GOLDEN_DIR\n", argv[0]);
		return 2;
	}
	golden_dir = argv[1];
	for (size_t i = 0; i < GOLDEN_NFILES; i++)
		tests[i] = (struct CMUnitTest){ .name = golden_codecs[i].file,
						.test_func = test_file,
						.initial_state = (void *)(uintptr_t)i };
	return cmocka_run_group_tests(tests, NULL, NULL);
}
