// SPDX-License-Identifier: MIT
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "stats.h"
#include "test_util.h"

static uint64_t seed;

/* A per-case stream derived from the printed seed (xorshift must not start at 0). */
static uint64_t sub_seed(uint64_t k)
{
	uint64_t s = seed ^ (k * 0x9e3779b97f4a7c15ull);

	return s ? s : 1;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* The nearest-rank quantile of a sorted array: what the histogram approximates. */
static uint64_t exact_quantile(const uint64_t *v, size_t n, double q)
{
	size_t rank = (size_t)ceil(q * (double)n);

	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return v[rank - 1];
}

static void check_quantiles(const struct halite_hist *h, const uint64_t *sorted, size_t n)
{
	static const double qs[] = { 0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9,
				     0.99, 0.999, 0.9999, 1.0 };
	size_t i;

	for (i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
		uint64_t want = exact_quantile(sorted, n, qs[i]);
		uint64_t got = halite_hist_quantile(h, qs[i]);
		uint64_t err = got > want ? got - want : want - got;

		/* Documented precision: 1/2^SUB_BITS of the value. */
		if (err > want >> HALITE_HIST_SUB_BITS)
			fail_msg("q=%g: got %llu, want %llu", qs[i], (unsigned long long)got,
				 (unsigned long long)want);
	}
	assert_int_equal(halite_hist_quantile(h, 0.0), sorted[0]);
	assert_int_equal(halite_hist_quantile(h, 1.0), sorted[n - 1]);
}

static void test_quantiles_random(void **state)
{
	size_t n = 200000, i;
	uint64_t *v = malloc(n * sizeof(*v));
	uint64_t s = sub_seed(0), sum = 0;
	struct halite_hist *h = malloc(sizeof(*h));

	assert_non_null(v);
	assert_non_null(h);
	halite_hist_init(h);
	for (i = 0; i < n; i++) {
		/* Log-uniform over 0 .. 2^50: every bucket group gets traffic. */
		unsigned bits = (unsigned)(t_rand(&s) % 51);

		v[i] = bits ? t_rand(&s) >> (64 - bits) : 0;
		sum += v[i];
		halite_hist_add(h, v[i]);
	}
	qsort(v, n, sizeof(*v), cmp_u64);
	assert_int_equal(h->count, n);
	assert_int_equal(h->sum, sum);
	assert_int_equal(h->min, v[0]);
	assert_int_equal(h->max, v[n - 1]);
	check_quantiles(h, v, n);
	free(v);
	free(h);
}

static void test_small_values_exact(void **state)
{
	struct halite_hist h;
	uint64_t v[64];
	unsigned i;

	halite_hist_init(&h);
	for (i = 0; i < 64; i++) {
		v[i] = i;
		halite_hist_add(&h, i);
	}
	/* Below 2^SUB_BITS every value has a bucket of its own. */
	for (i = 1; i <= 32; i++)
		assert_int_equal(halite_hist_quantile(&h, i / 64.0), exact_quantile(v, 64, i / 64.0));
}

static void test_extremes(void **state)
{
	struct halite_hist h;

	halite_hist_init(&h);
	assert_int_equal(h.min, UINT64_MAX);
	assert_int_equal(halite_hist_quantile(&h, 0.5), 0);
	assert_int_equal(halite_hist_quantile(&h, 1.0), 0);

	halite_hist_add(&h, UINT64_MAX);
	halite_hist_add(&h, 0);
	halite_hist_add(&h, (uint64_t)1 << 63);
	assert_int_equal(halite_hist_quantile(&h, 0.0), 0);
	assert_int_equal(halite_hist_quantile(&h, 1.0), UINT64_MAX);
	/* Out-of-range q clamps. */
	assert_int_equal(halite_hist_quantile(&h, -1.0), 0);
	assert_int_equal(halite_hist_quantile(&h, 7.0), UINT64_MAX);
	assert_int_equal(halite_hist_quantile(&h, NAN), 0);
	/* The median is 2^63, within a bucket. */
	{
		uint64_t m = halite_hist_quantile(&h, 0.5), want = (uint64_t)1 << 63;

		assert_true(m >= want && m - want <= want >> HALITE_HIST_SUB_BITS);
	}
}

struct adder {
	struct halite_hist *h;
	uint64_t seed;
	uint64_t sum;
	uint64_t min, max;
};

#define PER_THREAD 200000

static void *adder_main(void *p)
{
	struct adder *a = p;
	int i;

	a->sum = 0;
	a->min = UINT64_MAX;
	a->max = 0;
	for (i = 0; i < PER_THREAD; i++) {
		uint64_t v = t_rand(&a->seed) >> (t_rand(&a->seed) % 64);

		a->sum += v;
		if (v < a->min)
			a->min = v;
		if (v > a->max)
			a->max = v;
		halite_hist_add(a->h, v);
	}
	return NULL;
}

static void test_concurrent_adds(void **state)
{
	struct halite_hist *h = malloc(sizeof(*h));
	struct adder a[4];
	pthread_t t[4];
	uint64_t sum = 0, min = UINT64_MAX, max = 0, buckets = 0;
	unsigned i;

	assert_non_null(h);
	halite_hist_init(h);
	for (i = 0; i < 4; i++) {
		a[i].h = h;
		a[i].seed = sub_seed(10 + i);
		assert_int_equal(pthread_create(&t[i], NULL, adder_main, &a[i]), 0);
	}
	for (i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		sum += a[i].sum;
		min = a[i].min < min ? a[i].min : min;
		max = a[i].max > max ? a[i].max : max;
	}
	/* Nothing lost to races: every counter is exact. */
	assert_int_equal(h->count, 4 * PER_THREAD);
	assert_int_equal(h->sum, sum);
	assert_int_equal(h->min, min);
	assert_int_equal(h->max, max);
	for (i = 0; i < HALITE_HIST_BUCKETS; i++)
		buckets += h->bucket[i];
	assert_int_equal(buckets, 4 * PER_THREAD);
	free(h);
}

static void test_merge(void **state)
{
	size_t n = 50000, i;
	uint64_t *v = malloc(2 * n * sizeof(*v));
	struct halite_hist *a = malloc(sizeof(*a)), *b = malloc(sizeof(*b));
	struct halite_hist *empty = malloc(sizeof(*empty));
	uint64_t s = sub_seed(20);

	halite_hist_init(a);
	halite_hist_init(b);
	halite_hist_init(empty);
	for (i = 0; i < 2 * n; i++) {
		/* Two different ranges, so the merged quantiles differ from either. */
		v[i] = i < n ? 1000 + t_rand(&s) % 1000 : 1000000 + t_rand(&s) % 10000000;
		halite_hist_add(i < n ? a : b, v[i]);
	}
	halite_hist_merge(a, b);
	halite_hist_merge(a, empty);
	qsort(v, 2 * n, sizeof(*v), cmp_u64);
	assert_int_equal(a->count, 2 * n);
	check_quantiles(a, v, 2 * n);

	/* Into an empty one: a copy. */
	halite_hist_merge(empty, b);
	assert_int_equal(empty->count, n);
	assert_int_equal(empty->min, b->min);
	assert_int_equal(empty->max, b->max);
	free(v);
	free(a);
	free(b);
	free(empty);
}

static void test_now(void **state)
{
	uint64_t a = halite_now_ns(), b;
	struct timespec ts = { 0, 2000000 };

	nanosleep(&ts, NULL);
	b = halite_now_ns();
	assert_true(b >= a + 2000000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_quantiles_random),
		cmocka_unit_test(test_small_values_exact),
		cmocka_unit_test(test_extremes),
		cmocka_unit_test(test_concurrent_adds),
		cmocka_unit_test(test_merge),
		cmocka_unit_test(test_now),
	};

	seed = t_seed("unit_stats");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
