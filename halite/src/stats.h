/* SPDX-License-Identifier: MIT */
/*
 * Internal, not the public API: used by the library and by tools
 * halite-cloned and halite-cycle, halite-synth and the benchmarks
 * (halite_common) for the monotonic clock. Time and latency histograms for
 * engine statistics (fault service p50/p99 and the like).
 *
 * The histogram is log-linear (HdrHistogram-style): values up to 2^HALITE_HIST_SUB_BITS
 * are exact, above that each power of two is split into 2^HALITE_HIST_SUB_BITS
 * linear buckets, so a quantile is within 1/2^HALITE_HIST_SUB_BITS (3%) of the true
 * value. Adding is lock-free (relaxed atomics), so many threads may record
 * into one histogram.
 */
#ifndef HALITE_STATS_H
#define HALITE_STATS_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define HALITE_HIST_SUB_BITS 5
#define HALITE_HIST_BUCKETS ((64 - HALITE_HIST_SUB_BITS + 1) << HALITE_HIST_SUB_BITS)

struct halite_hist {
	uint64_t count;
	uint64_t sum;
	uint64_t min; /* UINT64_MAX when empty */
	uint64_t max;
	uint64_t bucket[HALITE_HIST_BUCKETS];
};

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t halite_now_ns(void);

/*
 * Waits with a timeout, immune to the wall clock being set: condition
 * variables made by halite_cond_init_mono() and deadlines from
 * halite_deadline() (CLOCK_MONOTONIC now + @ns) for pthread_cond_timedwait().
 */
int halite_cond_init_mono(pthread_cond_t *cv);
void halite_deadline(struct timespec *ts, uint64_t ns);

void halite_hist_init(struct halite_hist *h);

/* Record one value. Thread-safe. */
void halite_hist_add(struct halite_hist *h, uint64_t v);

/*
 * The value at quantile @q (0.0 .. 1.0) within the bucket precision, 0 when
 * empty; q=1.0 gives max exactly, q=0.0 min exactly. Not to be called while
 * other threads add.
 */
uint64_t halite_hist_quantile(const struct halite_hist *h, double q);

/* dst += src. */
void halite_hist_merge(struct halite_hist *dst, const struct halite_hist *src);

#endif
