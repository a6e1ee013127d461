/* SPDX-License-Identifier: MIT */
/*
 * Shared by the synthetic guest's tests: checks that name the failing line,
 * a log capture, and an x86-64 page-table walker written from the SDM
 * (vol. 3, 4.5), independently of the library's software MMU.
 */
#ifndef HALITE_GTEST_H
#define HALITE_GTEST_H

#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "synth.h"
#include "test_util.h"

#define CHECK(c)                                                                        \
	do {                                                                            \
		if (!(c)) {                                                             \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
			exit(1);                                                        \
		}                                                                       \
	} while (0)

#define CHECK_EQ(a, b)                                                                  \
	do {                                                                            \
		uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                        \
		if (a_ != b_) {                                                         \
			fprintf(stderr, "%s:%d: check failed: %s == %s (0x%" PRIx64     \
				" != 0x%" PRIx64 ")\n", __FILE__, __LINE__, #a, #b, a_, b_);   \
			exit(1);                                                        \
		}                                                                       \
	} while (0)

#define CHECK_OK(call)                                                                  \
	do {                                                                            \
		long r_ = (long)(call);                                                 \
		if (r_ < 0) {                                                           \
			fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
				strerror((int)-r_));                                    \
			exit(1);                                                        \
		}                                                                       \
	} while (0)

static inline void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p) {
		perror("malloc");
		exit(1);
	}
	return p;
}

/* The last error message the library logged (a test reads it after a call). */
static char g_logbuf[2048];
static pthread_mutex_t g_logmu = PTHREAD_MUTEX_INITIALIZER;

static inline void capture_log(void *ctx, int level, const char *msg)
{
	(void)ctx;
	(void)level;
	pthread_mutex_lock(&g_logmu);
	snprintf(g_logbuf, sizeof(g_logbuf), "%s", msg);
	pthread_mutex_unlock(&g_logmu);
	fprintf(stderr, "  (logged: %s)\n", msg);
}

/* --- the walker --- */

#define X86_P	(1ull << 0)
#define X86_RW	(1ull << 1)
#define X86_US	(1ull << 2)
#define X86_A	(1ull << 5)
#define X86_D	(1ull << 6)
#define X86_PS	(1ull << 7)
#define X86_NX	(1ull << 63)
/* M = 52, the architectural maximum: address bits 51:12 of an entry. */
#define X86_ADDR_MASK 0x000ffffffffff000ull

struct tw_leaf {
	uint64_t va;		/* canonical */
	uint64_t pa;		/* the page's base */
	uint64_t size;		/* 4 KiB, 2 MiB or 1 GiB */
	int level;		/* 1 PTE, 2 PDE, 3 PDPTE */
	uint64_t entry;
	uint64_t entry_pa;	/* where the leaf entry is */
	uint64_t path[5];	/* table GPAs, root first */
	int npath;
};

struct tw_stats {
	uint64_t tables, present, nonpresent, nonpresent_junk, errors;
};

typedef void (*tw_fn)(void *ctx, const struct tw_leaf *l);

static inline uint64_t tw_canonical(uint64_t va, int levels)
{
	int top = levels == 5 ? 56 : 47;

	return (va >> top) & 1 ? va | ~((1ull << (top + 1)) - 1) : va;
}

static inline uint64_t tw_read(const uint8_t *mem, uint64_t pa)
{
	uint64_t e;

	memcpy(&e, mem + pa, 8);
	return e;
}

static void tw_table(const uint8_t *mem, uint64_t memsz, uint64_t table, int level, int levels,
		     uint64_t prefix, uint64_t *path, tw_fn fn, void *ctx, struct tw_stats *st)
{
	int shift = 12 + 9 * (level - 1);

	path[levels - level] = table;
	st->tables++;
	for (uint64_t i = 0; i < 512; i++) {
		uint64_t e = tw_read(mem, table + i * 8), va = prefix | (i << shift);

		if (!(e & X86_P)) {
			st->nonpresent++;
			st->nonpresent_junk += e != 0;
			continue;
		}
		st->present++;
		if (level == 1 || ((level == 2 || level == 3) && (e & X86_PS))) {
			uint64_t size = 1ull << shift;
			struct tw_leaf l = {
				.va = tw_canonical(va, levels),
				/* PS pages: bit 12 is PAT, the base is size-aligned. */
				.pa = e & X86_ADDR_MASK & ~(size - 1),
				.size = size,
				.level = level,
				.entry = e,
				.entry_pa = table + i * 8,
				.npath = levels - level + 1,
			};

			memcpy(l.path, path, sizeof(l.path));
			if (l.pa + size > memsz) {
				st->errors++;
				continue;
			}
			fn(ctx, &l);
			continue;
		}
		if ((e & X86_PS) || (e & X86_ADDR_MASK) + 4096 > memsz) {
			st->errors++; /* PS is reserved above the PDPT */
			continue;
		}
		tw_table(mem, memsz, e & X86_ADDR_MASK, level - 1, levels, va, path, fn, ctx, st);
	}
}

/* Every present leaf under @cr3, in virtual-address order. */
static inline void tw_walk(const uint8_t *mem, uint64_t memsz, uint64_t cr3, int levels,
			   tw_fn fn, void *ctx, struct tw_stats *st)
{
	uint64_t path[5] = { 0 };

	memset(st, 0, sizeof(*st));
	tw_table(mem, memsz, cr3 & X86_ADDR_MASK, levels, levels, 0, path, fn, ctx, st);
}

/* Translate one address: 0 and *pa (and the leaf entry's GPA), or -1. */
static inline int tw_translate(const uint8_t *mem, uint64_t memsz, uint64_t cr3, int levels,
			       uint64_t va, uint64_t *pa, uint64_t *entry_pa)
{
	uint64_t table = cr3 & X86_ADDR_MASK;

	for (int level = levels; level >= 1; level--) {
		int shift = 12 + 9 * (level - 1);
		uint64_t ea = table + ((va >> shift) & 511) * 8, e;

		if (ea + 8 > memsz)
			return -1;
		e = tw_read(mem, ea);
		if (!(e & X86_P))
			return -1;
		if (level == 1 || ((level == 2 || level == 3) && (e & X86_PS))) {
			uint64_t size = 1ull << shift;

			*pa = (e & X86_ADDR_MASK & ~(size - 1)) | (va & (size - 1));
			if (entry_pa)
				*entry_pa = ea;
			return 0;
		}
		if (e & X86_PS)
			return -1;
		table = e & X86_ADDR_MASK;
	}
	return -1;
}

/* The documented small-frame allocator: allocation k's frame. */
static inline uint64_t expected_small_frame(uint64_t base, uint64_t frames, uint64_t stride,
					    uint64_t k)
{
	for (uint64_t r = 0; r < stride && r < frames; r++) {
		uint64_t in_pass = (frames - r + stride - 1) / stride;

		if (k < in_pass)
			return base + r + k * stride;
		k -= in_pass;
	}
	return UINT64_MAX;
}

static inline uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts))
		;
}

/*
 * Wait (10 s at most) until each of the first @n vCPUs did more than base[v]
 * accesses (0 if base is NULL): progress checks that do not depend on how
 * fast a loaded machine schedules 16 threads.
 */
static inline void wait_progress(struct synth_guest *g, unsigned n, const uint64_t *base)
{
	for (unsigned v = 0; v < n; v++) {
		struct synth_vcpu_stats st;

		for (uint64_t dl = now_ms() + 10000;; sleep_ms(1)) {
			CHECK_OK(synth_vcpu_stats(g, v, &st));
			if (st.accesses > (base ? base[v] : 0))
				break;
			if (now_ms() > dl) {
				fprintf(stderr, "vCPU %u made no progress in 10 s\n", v);
				exit(1);
			}
		}
	}
}

#endif
