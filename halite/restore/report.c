/* SPDX-License-Identifier: MIT */
/* The restore's numbers: halite_restore_stats() and the trace file (docs/restore-trace.md). */
#define _GNU_SOURCE
#include <stdio.h>

#include "restore_int.h"

void rs_fill_stats(struct halite_restore *r, struct halite_restore_stats *st)
{
	uint64_t staged, acc, done_ns, ready_at, ready_ns;
	int state, err;

	pthread_mutex_lock(&r->gs.mu);
	state = r->gs.state;
	err = r->gs.error;
	done_ns = r->gs.done_ns;
	ready_at = r->gs.running_ns;
	ready_ns = r->ready_ns;
	pthread_mutex_unlock(&r->gs.mu);
	*st = (struct halite_restore_stats){
		.ready_ns = ready_ns,
		.done = state == GS_DONE,
		.error = state == GS_FAILED ? err : 0,
	};
	if (ready_at)
		st->duration_ns = (done_ns ? done_ns : halite_now_ns()) - ready_at;
	st->mb_total = r->mb_total;
	st->mb_fault = atomic_load(&r->n_mb[BY_FAULT]);
	st->mb_pool = atomic_load(&r->n_mb[BY_POOL]);
	st->mb_prefetch = atomic_load(&r->n_mb[BY_PREFETCH]);
	st->mb_zero = r->mb_zero;
	st->mb_present = r->n_mb_present;
	if (r->gs.gm) {
		struct halite_gmem_stats gs;

		halite_gmem_stats(r->gs.gm, &gs);
		st->pages_discarded = gs.pages_discarded;
		st->pages_unmapped = gs.pages_unmapped;
	}
	st->faults = atomic_load(&r->gs.faults);
	st->faults_cached = atomic_load(&r->gs.faults_cached);
	st->faults_zero = atomic_load(&r->gs.faults_zero);
	st->faults_vcpu = atomic_load(&r->gs.faults_vcpu);
	st->lb_total = r->lb_total;
	st->lb_demand = atomic_load(&r->src.n_demand);
	st->lb_prefetch = atomic_load(&r->src.n_prefetch);
	st->lb_hot = atomic_load(&r->src.n_first);
	st->lb_retries = atomic_load(&r->src.n_retries);
	st->bytes_read = atomic_load(&r->src.n_bytes);
	staged = atomic_load(&r->n_staged);
	acc = atomic_load(&r->n_staged_accessed);
	if (r->track) {
		st->mb_staged = staged;
		st->mb_staged_accessed = acc;
	}
	st->vm_access_pct = r->track && staged ? 100.0 * (double)acc / (double)staged : -1.0;
	/* Approximate while faults are still being added; exact once done. */
	st->fault_p50_ns = halite_hist_quantile(&r->gs.hist, 0.5);
	st->fault_p99_ns = halite_hist_quantile(&r->gs.hist, 0.99);
}

/* docs/restore-trace.md. Written to a temporary file, then renamed over @trace_path. */
int rs_write_trace(struct halite_restore *r, const struct halite_restore_stats *st)
{
	struct trace_out o;
	FILE *f;
	/* Version 2 only when learning: version 1 readers keep reading the rest. */
	int ret = trace_out_begin(&o, r->o.trace_path, r->learn ? 2 : 1, r->fi->uuid);

	if (ret)
		return ret;
	f = o.f;
#define STAT(name) fprintf(f, "stat " #name " %llu\n", ULL(st->name))
	STAT(ready_ns);
	STAT(duration_ns);
	STAT(mb_total);
	STAT(mb_fault);
	STAT(mb_pool);
	STAT(mb_prefetch);
	STAT(mb_zero);
	STAT(faults);
	STAT(faults_cached);
	STAT(faults_zero);
	STAT(faults_vcpu);
	STAT(lb_total);
	STAT(lb_demand);
	STAT(lb_prefetch);
	STAT(lb_retries);
	STAT(bytes_read);
	STAT(mb_staged);
	STAT(mb_staged_accessed);
	fprintf(f, "stat vm_access_pct %.2f\n", st->vm_access_pct);
	STAT(fault_p50_ns);
	STAT(fault_p99_ns);
	fprintf(f, "stat done %d\nstat error %d\n", st->done ? 1 : 0, st->error);
	/* Added later: after the others, which version 1 readers know (they skip this). */
	STAT(lb_hot);
#undef STAT
	pthread_mutex_lock(&r->src.lk);
	for (uint64_t lb = 0; lb < r->lb_total; lb++) {
		const struct rlb *b = &r->lbs[lb];
		char fmb[24] = "-";

		if (b->how == HOW_NONE)
			continue;
		if (b->how == HOW_DEMAND)
			snprintf(fmb, sizeof(fmb), "%llu", ULL(b->fault_mb));
		fprintf(f, "lb %llu %s %llu %s %u %u\n", ULL(lb),
			b->how == HOW_DEMAND ? "demand" : "prefetch", ULL(b->t_ns), fmb,
			r->track ? b->staged : 0, r->track ? atomic_load(&b->accessed) : 0);
	}
	pthread_mutex_unlock(&r->src.lk);
	if (r->obs)
		r->obs->write(r, f);
	return trace_out_end(&o, 0);
}
