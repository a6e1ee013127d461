// SPDX-License-Identifier: MIT
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <halite/codec.h>
#include <halite/errors.h>

#include "test_util.h"

#define GUARD 64
#define GUARD_BYTE 0xa5

static uint64_t seed;

/* A per-case stream derived from the printed seed (xorshift must not start at 0). */
static uint64_t sub_seed(uint64_t k)
{
	uint64_t s = seed ^ (k * 0x9e3779b97f4a7c15ull);

	return s ? s : 1;
}

static const int codecs[] = { HALITE_CODEC_LZ4, HALITE_CODEC_ZLIB, HALITE_CODEC_ZSTD };

/* 0%, 50% and 100% compressible (tests/test_util.h: share of random bytes). */
enum kind { INCOMPRESSIBLE = 100, HALF = 50, PATTERN = 0 };

static void make_data(uint64_t *s, void *buf, size_t len, enum kind kind)
{
	t_fill(buf, len, (unsigned)kind, s);
}

/* A buffer of @len with GUARD bytes of a known pattern on each side. */
static unsigned char *guarded_alloc(size_t len)
{
	unsigned char *b = malloc(len + 2 * GUARD);

	assert_non_null(b);
	memset(b, GUARD_BYTE, len + 2 * GUARD);
	return b + GUARD;
}

static void guarded_check(const unsigned char *p, size_t len)
{
	size_t i;

	for (i = 0; i < GUARD; i++) {
		assert_int_equal(p[-1 - (ptrdiff_t)i], GUARD_BYTE);
		assert_int_equal(p[len + i], GUARD_BYTE);
	}
}

static void guarded_free(unsigned char *p)
{
	free(p - GUARD);
}

static void round_trip(int codec, int level, size_t size, enum kind kind, uint64_t *s)
{
	unsigned char *src = malloc(size), *cmp = malloc(size), *out = guarded_alloc(size);
	int n, ret;

	assert_non_null(src);
	assert_non_null(cmp);
	make_data(s, src, size, kind);
	n = halite_compress(codec, level, src, size, cmp, size);
	if (kind == INCOMPRESSIBLE) {
		assert_int_equal(n, -HALITE_E_LIMIT);
	} else {
		if (n <= 0 || (size_t)n >= size)
			fail_msg("%s level %d, %zu bytes %d%% random: compressed to %d",
				 halite_codec_name(codec), level, size, (int)kind, n);
		ret = halite_decompress(codec, cmp, (size_t)n, out, size);
		assert_int_equal(ret, 0);
		assert_memory_equal(out, src, size);
		guarded_check(out, size);
	}
	free(src);
	free(cmp);
	guarded_free(out);
}

static void test_round_trip(void **state)
{
	static const size_t sizes[] = { 4096, 8192, 2u << 20 };
	static const int levels[] = { 0, 1, -5, 3, 9 };
	uint64_t s = sub_seed(0);
	static const enum kind kinds[] = { INCOMPRESSIBLE, HALF, PATTERN };
	size_t c, z, k, l;

	for (c = 0; c < sizeof(codecs) / sizeof(codecs[0]); c++)
		for (z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++)
			for (k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
				for (l = 0; l < sizeof(levels) / sizeof(levels[0]); l++) {
					/* High levels on 2 MiB only cost time. */
					if (sizes[z] > 8192 && levels[l] > 3)
						continue;
					round_trip(codecs[c], levels[l], sizes[z], kinds[k], &s);
				}
	/* The strongest levels, on one block each. */
	round_trip(HALITE_CODEC_LZ4, 12, 8192, HALF, &s);
	round_trip(HALITE_CODEC_LZ4, 1000, 4096, HALF, &s);
	round_trip(HALITE_CODEC_ZSTD, 19, 8192, HALF, &s);
	round_trip(HALITE_CODEC_ZLIB, 100, 4096, HALF, &s);
}

/* Zero pages are the common case in guest memory: every codec must crush them. */
static void test_zero_page(void **state)
{
	unsigned char src[4096] = { 0 }, cmp[4096], out[4096];
	size_t c;
	int n;

	for (c = 0; c < sizeof(codecs) / sizeof(codecs[0]); c++) {
		n = halite_compress(codecs[c], 0, src, sizeof(src), cmp, sizeof(cmp));
		assert_true(n > 0 && n < 64);
		memset(out, 1, sizeof(out));
		assert_int_equal(halite_decompress(codecs[c], cmp, (size_t)n, out, sizeof(out)), 0);
		assert_memory_equal(out, src, sizeof(src));
	}
}

/* Any int is a level: out-of-range ones are clamped, never undefined. */
static void test_extreme_levels(void **state)
{
	static const int levels[] = { INT_MIN, INT_MIN + 1, -1000000, 1000000, INT_MAX };
	unsigned char src[4096] = { 0 }, cmp[4096], out[4096];
	size_t c, l;
	int n;

	src[100] = 1;
	for (c = 0; c < sizeof(codecs) / sizeof(codecs[0]); c++)
		for (l = 0; l < sizeof(levels) / sizeof(levels[0]); l++) {
			n = halite_compress(codecs[c], levels[l], src, sizeof(src), cmp, sizeof(cmp));
			if (n == -HALITE_E_LIMIT)
				continue;
			assert_true(n > 0 && n < (int)sizeof(src));
			assert_int_equal(halite_decompress(codecs[c], cmp, (size_t)n, out, sizeof(out)), 0);
			assert_memory_equal(out, src, sizeof(src));
		}
}

static void test_none(void **state)
{
	unsigned char src[4096], out[4096];

	memset(src, 0, sizeof(src));
	/* Raw is never smaller than raw: the caller stores it as is. */
	assert_int_equal(halite_compress(HALITE_CODEC_NONE, 0, src, sizeof(src), out, sizeof(out)),
			 -HALITE_E_LIMIT);
	src[7] = 42;
	assert_int_equal(halite_decompress(HALITE_CODEC_NONE, src, sizeof(src), out, sizeof(out)), 0);
	assert_memory_equal(src, out, sizeof(src));
	assert_int_equal(halite_decompress(HALITE_CODEC_NONE, src, 4095, out, sizeof(out)),
			 -HALITE_E_CODEC);
}

static void test_limits(void **state)
{
	unsigned char src[4096] = { 0 }, dst[4096];
	size_t c;

	for (c = 0; c < sizeof(codecs) / sizeof(codecs[0]); c++) {
		/* Compressible, but the output does not fit. */
		assert_int_equal(halite_compress(codecs[c], 0, src, sizeof(src), dst, 4),
				 -HALITE_E_LIMIT);
		assert_int_equal(halite_compress(codecs[c], 0, src, sizeof(src), dst, 0),
				 -HALITE_E_LIMIT);
		/* Nothing, or one byte, cannot get smaller. */
		assert_int_equal(halite_compress(codecs[c], 0, src, 0, dst, sizeof(dst)),
				 -HALITE_E_LIMIT);
		assert_int_equal(halite_compress(codecs[c], 0, src, 1, dst, sizeof(dst)),
				 -HALITE_E_LIMIT);
	}
	assert_int_equal(halite_compress(HALITE_CODEC_DEFAULT, 0, src, sizeof(src), dst, sizeof(dst)),
			 -HALITE_E_NO_CODEC);
	assert_int_equal(halite_compress(HALITE_CODEC_MAX, 0, src, sizeof(src), dst, sizeof(dst)),
			 -HALITE_E_NO_CODEC);
	assert_int_equal(halite_compress(-1, 0, src, sizeof(src), dst, sizeof(dst)),
			 -HALITE_E_NO_CODEC);
	assert_int_equal(halite_decompress(HALITE_CODEC_DEFAULT, src, 16, dst, sizeof(dst)),
			 -HALITE_E_NO_CODEC);
	assert_int_equal(halite_decompress(99, src, 16, dst, sizeof(dst)), -HALITE_E_NO_CODEC);
}

/* Compress 4 KiB of half-compressible data for the hostile-input tests. */
static int make_block(int codec, uint64_t *s, unsigned char *src, unsigned char *cmp)
{
	int n;

	make_data(s, src, 4096, HALF);
	n = halite_compress(codec, 0, src, 4096, cmp, 4096);
	assert_true(n > 0);
	return n;
}

static void test_wrong_size(void **state)
{
	static const size_t wrong[] = { 0, 1, 4095, 4097, 8192 };
	unsigned char src[4096], cmp[4096];
	uint64_t s = sub_seed(1);
	size_t c, w;

	for (c = 0; c < sizeof(codecs) / sizeof(codecs[0]); c++) {
		int n = make_block(codecs[c], &s, src, cmp);

		for (w = 0; w < sizeof(wrong) / sizeof(wrong[0]); w++) {
			unsigned char *out = guarded_alloc(wrong[w]);

			assert_int_equal(halite_decompress(codecs[c], cmp, (size_t)n, out, wrong[w]),
					 -HALITE_E_CODEC);
			guarded_check(out, wrong[w]);
			guarded_free(out);
		}
	}
}

static void test_truncated(void **state)
{
	unsigned char src[4096], cmp[4096];
	unsigned char *out = guarded_alloc(4096);
	uint64_t s = sub_seed(2);
	size_t c;
	int k;

	for (c = 0; c < sizeof(codecs) / sizeof(codecs[0]); c++) {
		int n = make_block(codecs[c], &s, src, cmp);
		unsigned char *in;

		/* Every proper prefix, in an exact-size buffer so ASan sees overreads. */
		for (k = 0; k < n; k++) {
			in = malloc(k ? (size_t)k : 1);
			memcpy(in, cmp, (size_t)k);
			assert_int_equal(halite_decompress(codecs[c], in, (size_t)k, out, 4096),
					 -HALITE_E_CODEC);
			guarded_check(out, 4096);
			free(in);
		}
		/* One byte too many: zlib and zstd frames know where they end. */
		cmp[n] = 0;
		k = halite_decompress(codecs[c], cmp, (size_t)n + 1, out, 4096);
		if (codecs[c] == HALITE_CODEC_LZ4)
			assert_true(k == 0 || k == -HALITE_E_CODEC);
		else
			assert_int_equal(k, -HALITE_E_CODEC);
		guarded_check(out, 4096);
	}
	guarded_free(out);
}

static void test_garbage(void **state)
{
	unsigned char *out = guarded_alloc(4096);
	unsigned char junk[2048];
	uint64_t s = sub_seed(3);
	size_t c;
	int i, ret;

	for (c = 0; c < sizeof(codecs) / sizeof(codecs[0]); c++) {
		for (i = 0; i < 2000; i++) {
			size_t len = (size_t)(t_rand(&s) % sizeof(junk));

			t_fill(junk, len, 100, &s);
			ret = halite_decompress(codecs[c], junk, len, out, 4096);
			/*
			 * An LZ4 block has no header to reject; only "no
			 * crash, exact size" is promised. zlib and zstd check
			 * a header first.
			 */
			if (codecs[c] == HALITE_CODEC_LZ4)
				assert_true(ret == 0 || ret == -HALITE_E_CODEC);
			else
				assert_int_equal(ret, -HALITE_E_CODEC);
			guarded_check(out, 4096);
		}
	}
	guarded_free(out);
}

static void test_bit_flips(void **state)
{
	unsigned char src[4096], cmp[4096];
	unsigned char *out = guarded_alloc(4096);
	uint64_t s = sub_seed(4);
	size_t c;
	int n, bit, ret, detected;

	for (c = 0; c < sizeof(codecs) / sizeof(codecs[0]); c++) {
		n = make_block(codecs[c], &s, src, cmp);
		detected = 0;
		for (bit = 0; bit < n * 8; bit++) {
			cmp[bit / 8] ^= (unsigned char)(1u << (bit % 8));
			ret = halite_decompress(codecs[c], cmp, (size_t)n, out, 4096);
			cmp[bit / 8] ^= (unsigned char)(1u << (bit % 8));
			assert_true(ret == 0 || ret == -HALITE_E_CODEC);
			guarded_check(out, 4096);
			detected += ret == -HALITE_E_CODEC;
		}
		print_message("# %s: %d of %d single-bit flips detected\n",
			      halite_codec_name(codecs[c]), detected, n * 8);
		/*
		 * zlib carries an Adler-32: only the padding bits before it can
		 * flip unnoticed. lz4 and zstd (no content checksum) may
		 * decode a flipped literal; the file format's checksum covers
		 * that.
		 */
		if (codecs[c] == HALITE_CODEC_ZLIB)
			assert_true(detected >= n * 8 - 8);
		/* Unflipped still decodes. */
		assert_int_equal(halite_decompress(codecs[c], cmp, (size_t)n, out, 4096), 0);
		assert_memory_equal(out, src, 4096);
	}
	guarded_free(out);
}

static void test_parse_name(void **state)
{
	int c;

	for (c = HALITE_CODEC_NONE; c < HALITE_CODEC_MAX; c++) {
		const char *name = halite_codec_name(c);

		assert_non_null(name);
		assert_int_equal(halite_codec_parse(name), c);
	}
	assert_string_equal(halite_codec_name(HALITE_CODEC_NONE), "none");
	assert_string_equal(halite_codec_name(HALITE_CODEC_LZ4), "lz4");
	assert_string_equal(halite_codec_name(HALITE_CODEC_ZLIB), "zlib");
	assert_string_equal(halite_codec_name(HALITE_CODEC_ZSTD), "zstd");
	assert_null(halite_codec_name(HALITE_CODEC_DEFAULT));
	assert_null(halite_codec_name(HALITE_CODEC_MAX));
	assert_null(halite_codec_name(-1));
	assert_int_equal(halite_codec_parse("gzip"), -HALITE_E_NO_CODEC);
	assert_int_equal(halite_codec_parse(""), -HALITE_E_NO_CODEC);
	assert_int_equal(halite_codec_parse("lz4 "), -HALITE_E_NO_CODEC);
	assert_int_equal(halite_codec_parse(NULL), -HALITE_E_NO_CODEC);
}

/* Per-thread codec contexts: threads must not see each other's state. */
struct mt_arg {
	uint64_t seed;
	int failures;
};

static void *mt_worker(void *p)
{
	struct mt_arg *a = p;
	unsigned char src[8192], cmp[8192], out[8192];
	int i;

	for (i = 0; i < 300; i++) {
		int codec = codecs[t_rand(&a->seed) % 3];
		int level = (int)(t_rand(&a->seed) % 12) - 2;
		size_t len = 4096 + (size_t)(t_rand(&a->seed) % 4097);
		int n;

		make_data(&a->seed, src, len, HALF);
		n = halite_compress(codec, level, src, len, cmp, sizeof(cmp));
		if (n <= 0 || halite_decompress(codec, cmp, (size_t)n, out, len) ||
		    memcmp(src, out, len))
			a->failures++;
	}
	return NULL;
}

static void test_threads(void **state)
{
	pthread_t t[4];
	struct mt_arg a[4];
	int i;

	for (i = 0; i < 4; i++) {
		a[i].seed = sub_seed(100 + (uint64_t)i);
		a[i].failures = 0;
		assert_int_equal(pthread_create(&t[i], NULL, mt_worker, &a[i]), 0);
	}
	for (i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		assert_int_equal(a[i].failures, 0);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_zero_page),
		cmocka_unit_test(test_extreme_levels),
		cmocka_unit_test(test_none),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_wrong_size),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_garbage),
		cmocka_unit_test(test_bit_flips),
		cmocka_unit_test(test_parse_name),
		cmocka_unit_test(test_threads),
	};

	seed = t_seed("unit_codec");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
