// SPDX-License-Identifier: MIT
/*
 * The vCPUs' access logs: an entry appended by a vCPU's access and, for the
 * frames it reads, by the page walk (pagetable.c); read back and cleared for
 * the API (local.c). A log has one writer, its vCPU; readers load its length
 * with acquire, so every entry below that length is whole.
 */
#include <string.h>

#include "internal.h"

void synth_log_append(struct synth_vcpu *vc, uint64_t ent)
{
	struct synth_guest *g = vc->g;
	uint64_t len = vc->log_len;

	if (g->o.log_mode == SYNTH_LOG_FIRST) {
		uint64_t pfn = SYNTH_LOG_PFN(ent), bit = 1ull << (pfn & 63);

		if (pfn >= g->nframes)
			return;
		if (__atomic_fetch_or(&g->touched[pfn >> 6], bit, __ATOMIC_RELAXED) & bit)
			return;
	}
	if (len >= g->o.log_entries) {
		__atomic_store_n(&vc->log_dropped, vc->log_dropped + 1, __ATOMIC_RELAXED);
		return;
	}
	vc->log[len] = ent;
	/* Release: a reader that sees the new length sees the entry. */
	__atomic_store_n(&vc->log_len, len + 1, __ATOMIC_RELEASE);
}

int synth_local_log_read(struct synth_guest *g, unsigned vcpu, uint64_t off, uint64_t *out,
			 size_t max)
{
	struct synth_vcpu *vc = &g->vcpu[vcpu];
	uint64_t len = __atomic_load_n(&vc->log_len, __ATOMIC_ACQUIRE);

	max = synth_run_len(off, len, max);
	if (max)
		memcpy(out, vc->log + off, max * sizeof(uint64_t));
	return (int)max;
}

/* The vCPUs are parked: nothing appends while the lengths go back to 0. */
void synth_log_clear(struct synth_guest *g)
{
	for (unsigned v = 0; v < g->nvcpus; v++) {
		__atomic_store_n(&g->vcpu[v].log_len, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&g->vcpu[v].log_dropped, 0, __ATOMIC_RELAXED);
	}
	if (g->touched)
		memset(g->touched, 0, (g->nframes + 63) / 64 * sizeof(uint64_t));
}
