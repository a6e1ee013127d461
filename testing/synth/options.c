// SPDX-License-Identifier: MIT
/*
 * What the synthetic guest is: its options checked and given their
 * defaults, the virtual span each vCPU's layout takes, and the description
 * a caller reads back (synth_info, synth_vcpu_info), which holds in both
 * modes (child mode copies it from the child when it starts).
 */
#include <errno.h>

#include "internal.h"
#include "opts.h"

#define DEFAULT_LOG_ENTRIES 65536ull
#define MAX_TLB (1u << 20)

const char *synth_pattern_name(unsigned pattern)
{
	switch (pattern) {
	case SYNTH_PAT_SEQ:
		return "seq";
	case SYNTH_PAT_RANDOM:
		return "random";
	case SYNTH_PAT_TRACE:
		return "trace";
	}
	return "?";
}

#define ALL_FLAGS (SYNTH_F_CHILD | SYNTH_F_SHARED_AS | SYNTH_F_NP_JUNK | SYNTH_F_AD_BITS | \
		   SYNTH_F_TRACE_LOOP | SYNTH_F_LOG_WALK | SYNTH_F_ATTACH)

#define BAD(...)                                                                  \
	do {                                                                      \
		halite_logf(lg, HALITE_LOG_ERROR, "synth: invalid options: " __VA_ARGS__); \
		return -EINVAL;                                                   \
	} while (0)

/* The VA extent reserved per vCPU: its layout (synth.h) rounded up to 1 GiB. */
uint64_t synth_vspan(const struct synth_opts *o)
{
	uint64_t huge = o->huge_2m * (2ull << 20) + o->huge_1g * (1ull << 30);
	uint64_t n4k = (o->map_bytes - huge) / PG_SIZE;
	uint64_t vpages = n4k && o->hole_every ? n4k + (n4k - 1) / (o->hole_every - 1) : n4k;
	uint64_t ext = ((vpages * PG_SIZE + (2ull << 20) - 1) & ~((2ull << 20) - 1)) +
		       o->huge_2m * (2ull << 20);
	uint64_t span;

	if (o->huge_1g)
		ext = ((ext + (1ull << 30) - 1) & ~((1ull << 30) - 1)) + o->huge_1g * (1ull << 30);
	span = (ext + (1ull << 30) - 1) & ~((1ull << 30) - 1);
	return span ? span : 1ull << 30;
}

int synth_normalize_opts(struct synth_opts *o, const struct synth_opts *in)
{
	struct halite_logger l = { 0 }, *lg = &l;
	uint64_t huge, span, limit;

	if (halite_opts_copy(o, sizeof(*o), in))
		return -EINVAL;
	l.fn = o->log_fn;
	l.ctx = o->log_ctx;
	l.level = HALITE_LOG_DEBUG;

	if (!o->mem_bytes)
		o->mem_bytes = 1ull << 30;
	if (!o->nvcpus)
		o->nvcpus = 4;
	if (!o->paging_levels)
		o->paging_levels = 4;
	if (!o->stride)
		o->stride = 16;
	if (!o->compress_pct)
		o->compress_pct = 50;
	if (!o->seed)
		o->seed = 1;
	if (o->log_mode && !o->log_entries)
		o->log_entries = DEFAULT_LOG_ENTRIES;

	if (o->mem_bytes % (2ull << 20) || o->mem_bytes < (4ull << 20) || o->mem_bytes > (1ull << 40))
		BAD("mem_bytes %llu: a multiple of 2 MiB from 4 MiB to 1 TiB",
		    (unsigned long long)o->mem_bytes);
	if (o->nvcpus > SYNTH_MAX_VCPUS)
		BAD("nvcpus %u: 1 to %u", o->nvcpus, SYNTH_MAX_VCPUS);
	if (o->flags & ~ALL_FLAGS)
		BAD("unknown flags 0x%x", o->flags & ~ALL_FLAGS);
	if (o->backing > SYNTH_MEM_SHARED)
		BAD("backing %u", o->backing);
	if (o->paging_levels != 4 && o->paging_levels != 5)
		BAD("paging_levels %u: 4 or 5", o->paging_levels);
	if (o->stride > (1u << 20))
		BAD("stride %u: at most 2^20", o->stride);
	if (o->hole_every == 1)
		BAD("hole_every 1 would map nothing");
	if (o->compress_pct > 100 || o->zero_pct > 100 || o->untouched_pct > 100 ||
	    o->write_pct > 100)
		BAD("percentages are 0 to 100");
	if (o->pattern > SYNTH_PAT_TRACE)
		BAD("pattern %u", o->pattern);
	if ((o->pattern == SYNTH_PAT_TRACE) != !!o->trace_in)
		BAD("trace_in is for, and needed by, pattern trace");
	if (o->log_mode > SYNTH_LOG_FIRST)
		BAD("log_mode %u", o->log_mode);
	if (o->log_entries > (1ull << 32))
		BAD("log_entries %llu: at most 2^32", (unsigned long long)o->log_entries);
	if (o->tlb_entries > MAX_TLB)
		BAD("tlb_entries %u: at most %u", o->tlb_entries, MAX_TLB);
	if (o->mem_host && ((o->flags & (SYNTH_F_ATTACH | SYNTH_F_CHILD)) != SYNTH_F_ATTACH ||
			    o->backing != SYNTH_MEM_ANON || (uintptr_t)o->mem_host % PG_SIZE))
		BAD("mem_host: page aligned, only with SYNTH_F_ATTACH, in this process, backing anon");

	huge = o->huge_2m * (2ull << 20) + o->huge_1g * (1ull << 30);
	if (!o->ws_bytes)
		o->ws_bytes = o->map_bytes ? o->map_bytes :
					     o->mem_bytes / 4 / o->nvcpus / PG_SIZE * PG_SIZE;
	if (!o->map_bytes)
		o->map_bytes = o->ws_bytes > huge ? o->ws_bytes : huge;
	if (o->ws_bytes % PG_SIZE || o->map_bytes % PG_SIZE)
		BAD("ws_bytes and map_bytes are multiples of 4 KiB");
	if (o->ws_bytes > o->map_bytes)
		BAD("ws_bytes %llu is more than map_bytes %llu", (unsigned long long)o->ws_bytes,
		    (unsigned long long)o->map_bytes);
	if (o->map_bytes < huge)
		BAD("map_bytes %llu is less than the huge pages in it (%llu)",
		    (unsigned long long)o->map_bytes, (unsigned long long)huge);
	if (!o->ws_bytes && o->pattern != SYNTH_PAT_TRACE)
		BAD("an empty working set");
	if (o->map_bytes > o->mem_bytes / o->nvcpus)
		BAD("working set larger than memory: %u vCPUs x %llu KiB mapped > %llu KiB",
		    o->nvcpus, (unsigned long long)(o->map_bytes >> 10),
		    (unsigned long long)(o->mem_bytes >> 10));

	span = synth_vspan(o);
	limit = o->paging_levels == 5 ? 1ull << 56 : 1ull << 47;
	if (!o->vbase)
		o->vbase = o->paging_levels == 5 ? 0x7f000000000000ull : 0x7f0000000000ull;
	if (o->vbase % (1ull << 30) || o->vbase >= limit ||
	    (limit - o->vbase) / o->nvcpus < span)
		BAD("vbase 0x%llx: 1 GiB aligned, and %u x %llu GiB above it must stay below 0x%llx",
		    (unsigned long long)o->vbase, o->nvcpus, (unsigned long long)(span >> 30),
		    (unsigned long long)limit);
	return 0;
}

int synth_info(const struct synth_guest *g, struct synth_info *info)
{
	if (!g || !info)
		return -EINVAL;
	*info = g->info;
	return 0;
}

int synth_vcpu_info(const struct synth_guest *g, unsigned vcpu, struct synth_vcpu_info *info)
{
	const struct synth_vcpu *vc;

	if (!g || !info || vcpu >= g->nvcpus)
		return -EINVAL;
	vc = &g->vcpu[vcpu];
	*info = (struct synth_vcpu_info){
		.tid = vc->tid,
		.cr3 = vc->cr3,
		.paging_levels = g->o.paging_levels,
		.vbase = vc->vbase,
		.vspan = vc->vspan,
		.map_units = vc->map_units,
		.ws_units = vc->ws_units,
	};
	return 0;
}
