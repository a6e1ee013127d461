/* SPDX-License-Identifier: MIT */
/*
 * Access traces (docs/trace-format.md) as a benchmark's workload: one pass
 * over a trace file that checks it and sizes the synthetic guest that can
 * replay it (halite-bench micro --trace, halite-cycle --trace).
 */
#ifndef HALITE_BENCH_TRACE_FILE_H
#define HALITE_BENCH_TRACE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "synth.h"

/* Where vCPU v's addresses must be: [TRACE_VBASE + v GiB, TRACE_VBASE + (v + 1) GiB). */
#define TRACE_VBASE ((uint64_t)0x7f0000000000)
#define TRACE_VSPAN ((uint64_t)1 << 30)

struct trace_info {
	unsigned nvcpus;			/* the header's */
	uint64_t records;
	uint64_t nrec[SYNTH_MAX_VCPUS];		/* per vCPU */
	uint64_t writes[SYNTH_MAX_VCPUS];
	uint64_t map_units[SYNTH_MAX_VCPUS];	/* highest page offset + 1 */
	uint64_t map_bytes;			/* the largest, the guest's per-vCPU mapping */
};

/*
 * Check @path as a trace a guest can replay and fill *ti. 0; -EINVAL with
 * one sentence in @err when the file is not a version 1 trace, a record is
 * malformed, or it does not fit (an address outside its vCPU's 1 GiB
 * window, a vCPU with fewer than 2 records); -errno when it cannot be read.
 */
int trace_file_scan(const char *path, struct trace_info *ti, char *err, size_t errlen);

/*
 * Call @fn(ctx, vcpu, rec, unit, word, write) for every record of @path in
 * file order: rec is the record's index among its vCPU's (its step), unit
 * the page's offset in the vCPU's window in pages, word the 8-byte word in
 * the page. The file must have passed trace_file_scan. 0 or -errno.
 */
/*
 * The guest that replays @ti: as the paper's microbenchmark, a quarter of
 * memory mapped: memory is 4 x what the vCPUs map (ti->map_bytes each), at
 * least 16 MiB, in 2 MiB; or @mem_mib if not 0. 0 and *mem_bytes; -EINVAL
 * with one sentence in @err when it does not fit: more than 8 GiB, or the
 * mapping over half of @mem_mib (room for page tables and the stride).
 */
int trace_guest_mem(const struct trace_info *ti, const char *path, uint64_t mem_mib,
		    uint64_t *mem_bytes, char *err, size_t errlen);

/*
 * Copy the trace @src to @dst with every write flag cleared: the same
 * accesses, reads only (a restored guest that must end up equal to the
 * snapshot). 0 or -errno.
 */
int trace_file_readonly(const char *src, const char *dst);

typedef void (*trace_fn)(void *ctx, unsigned vcpu, uint64_t rec, uint64_t unit, unsigned word,
			 int write);
int trace_file_each(const char *path, trace_fn fn, void *ctx);

#endif
