// SPDX-License-Identifier: MIT
/*
 * Log-linear histogram. With S = HALITE_HIST_SUB_BITS, values below 2^(S+1)
 * have a bucket each; a larger value whose top bit is bit m lands in group
 * m - S + 1, split into 2^S buckets of width 2^(m - S). A bucket's width is
 * thus at most 1/2^S of its lower bound: 60 groups of 32 cover all of uint64.
 *
 * Adds use relaxed atomics: the counters are independent statistics, no
 * reader infers anything about other memory from them, and quantiles are
 * read after the adding threads are joined (which orders everything).
 */
#include <time.h>
#include <string.h>

#include "stats.h"

#define SUB (1u << HALITE_HIST_SUB_BITS)

uint64_t halite_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static unsigned hist_index(uint64_t v)
{
	unsigned shift;

	if (v < SUB)
		return (unsigned)v;
	shift = 63u - (unsigned)__builtin_clzll(v) - HALITE_HIST_SUB_BITS;
	return ((shift + 1) << HALITE_HIST_SUB_BITS) + (unsigned)(v >> shift) - SUB;
}

static uint64_t hist_lower(unsigned idx)
{
	unsigned shift;

	if (idx < SUB)
		return idx;
	shift = (idx >> HALITE_HIST_SUB_BITS) - 1;
	return (uint64_t)(SUB + (idx & (SUB - 1))) << shift;
}

static uint64_t hist_width(unsigned idx)
{
	return idx < SUB ? 1 : (uint64_t)1 << ((idx >> HALITE_HIST_SUB_BITS) - 1);
}

void halite_hist_init(struct halite_hist *h)
{
	memset(h, 0, sizeof(*h));
	h->min = UINT64_MAX;
}

static void atomic_min(uint64_t *p, uint64_t v)
{
	uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);

	while (v < cur && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED,
						       __ATOMIC_RELAXED))
		;
}

static void atomic_max(uint64_t *p, uint64_t v)
{
	uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);

	while (v > cur && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELAXED,
						       __ATOMIC_RELAXED))
		;
}

void halite_hist_add(struct halite_hist *h, uint64_t v)
{
	__atomic_fetch_add(&h->bucket[hist_index(v)], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&h->count, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&h->sum, v, __ATOMIC_RELAXED);
	atomic_min(&h->min, v);
	atomic_max(&h->max, v);
}

uint64_t halite_hist_quantile(const struct halite_hist *h, double q)
{
	uint64_t count = __atomic_load_n(&h->count, __ATOMIC_RELAXED);
	uint64_t min = __atomic_load_n(&h->min, __ATOMIC_RELAXED);
	uint64_t max = __atomic_load_n(&h->max, __ATOMIC_RELAXED);
	uint64_t rank, seen = 0, v;
	double r;
	unsigned i;

	if (!count)
		return 0;
	if (!(q > 0.0)) /* also NaN */
		return min;
	if (q >= 1.0)
		return max;

	/* Nearest rank: the smallest value with at least q * count at or below it. */
	r = q * (double)count;
	rank = (uint64_t)r;
	if ((double)rank < r)
		rank++;
	if (rank < 1)
		rank = 1;
	if (rank > count)
		rank = count;

	for (i = 0; i < HALITE_HIST_BUCKETS; i++) {
		seen += __atomic_load_n(&h->bucket[i], __ATOMIC_RELAXED);
		if (seen >= rank)
			break;
	}
	if (i == HALITE_HIST_BUCKETS)
		return max;
	/*
	 * The bucket's middle halves the worst case error; min and max are
	 * known exactly and tighten the first and last bucket.
	 */
	v = hist_lower(i) + (hist_width(i) - 1) / 2;
	if (v < min)
		v = min;
	if (v > max)
		v = max;
	return v;
}

void halite_hist_merge(struct halite_hist *dst, const struct halite_hist *src)
{
	unsigned i;

	for (i = 0; i < HALITE_HIST_BUCKETS; i++) {
		uint64_t n = __atomic_load_n(&src->bucket[i], __ATOMIC_RELAXED);

		if (n)
			__atomic_fetch_add(&dst->bucket[i], n, __ATOMIC_RELAXED);
	}
	__atomic_fetch_add(&dst->count, __atomic_load_n(&src->count, __ATOMIC_RELAXED),
			   __ATOMIC_RELAXED);
	__atomic_fetch_add(&dst->sum, __atomic_load_n(&src->sum, __ATOMIC_RELAXED),
			   __ATOMIC_RELAXED);
	atomic_min(&dst->min, __atomic_load_n(&src->min, __ATOMIC_RELAXED));
	atomic_max(&dst->max, __atomic_load_n(&src->max, __ATOMIC_RELAXED));
}

int halite_cond_init_mono(pthread_cond_t *cv)
{
	pthread_condattr_t a;
	int ret;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	ret = pthread_cond_init(cv, &a);
	pthread_condattr_destroy(&a);
	return -ret;
}

void halite_deadline(struct timespec *ts, uint64_t ns)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ns += (uint64_t)ts->tv_nsec;
	ts->tv_sec += (time_t)(ns / 1000000000);
	ts->tv_nsec = (long)(ns % 1000000000);
}
