// SPDX-License-Identifier: MIT
/*
 * Test helper for `halite-inspect restore`: a small snapshot and real restore
 * traces of it, written by the restore engine (trace_path), whose numbers
 * restore.sh checks exactly (the fault counts against the trace itself: see
 * check_stats()).
 *
 *   inspect_mkrestore DIR
 *
 * writes DIR/r.hlt and three traces of restores into private anonymous
 * memory, this thread being the one vCPU:
 *   demand.trace  NO_PREFETCH; one page of LBs 0, 3, 4 and 7, one zero and
 *                 one never-touched block; then the restore is freed
 *                 (cancelled: done 0, error -ECANCELED), six LBs never read;
 *   full.trace    prefetch on, nothing touched: every LB prefetched, done;
 *   track.trace   NO_PREFETCH | TRACK_ACCESS; one page of every LB, in file
 *                 order, and the other block of LBs 0 and 1 right after
 *                 their LB came in: all demand, staged 10, accessed 2, done.
 * Exit 0, 1 on failure (also when the engine's statistics are not the ones
 * expected, so that a change in the engine shows here and not as a puzzle in
 * restore.sh), 77 without userfaultfd.
 *
 * Layout (codec none, 2-page 8 KiB memory blocks, 16 KiB LBs: two blocks
 * each), region "ram", 32 blocks; puts interleave the streams, so their LBs
 * interleave in the file:
 *   LB 0 vcpu0 {0,1}     LB 1 physical {8,9}   LB 2 physical {10,11}
 *   LB 3 vcpu0 {2,3}     LB 4 vcpu0 {4,5}      LB 5 physical {12,13}
 *   LB 6 physical {14,15} LB 7 physical {16,17} LB 8 vcpu0 {6,7}
 *   LB 9 physical {18,19}
 *   zero: 20, 21 (all-zero data), 22, 23 (put_zero); never touched: 24..31.
 *
 * Writing, restoring and settling are shared with the fuzz corpus's seed
 * traces (tests/fuzz/trace_seed_gen.c): tests/restore_gen.h.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "restore_gen.h"

#define PAGE 4096u
#define MB_SIZE (2 * PAGE)
#define NMB 32u
#define NLB 10u
#define LEN (NMB * MB_SIZE)
#define VCPU0 HALITE_STREAM(HALITE_STREAM_VCPU, 0)
#define PHYS HALITE_STREAM(HALITE_STREAM_PHYSICAL, 0)

static const struct {
	uint32_t stream;
	uint32_t seq;
	uint64_t mb[2];
} layout[NLB] = {
	{ VCPU0, 0, { 0, 1 } },	  { PHYS, 0, { 8, 9 } },   { PHYS, 1, { 10, 11 } },
	{ VCPU0, 1, { 2, 3 } },	  { VCPU0, 2, { 4, 5 } },  { PHYS, 2, { 12, 13 } },
	{ PHYS, 3, { 14, 15 } },  { PHYS, 4, { 16, 17 } }, { VCPU0, 3, { 6, 7 } },
	{ PHYS, 5, { 18, 19 } },
};

static uint8_t image[LEN];

/* Incompressible bytes: with codec none every block is stored raw anyway. */
static const struct rg_snap snap = {
	.image = image,
	.len = LEN,
	.mb_size = MB_SIZE,
	.nrandom = MB_SIZE,
	.codec = HALITE_CODEC_NONE,
	.lb_size = 16384,
	.lb_count = NLB,
	.mb_stored = 20,
	.mb_zero = 4,
	.mb_untouched = 8,
};

static void make_file(const char *path)
{
	struct halite_writer *w = rg_writer_create(&snap, path);
	struct rg_lb lbs[NLB];

	rg_put(w, &snap, VCPU0, 0, 4);
	rg_put(w, &snap, PHYS, 8, 6);
	rg_put(w, &snap, VCPU0, 4, 4);
	rg_put(w, &snap, PHYS, 14, 6);
	rg_check(halite_writer_flush_stream(w, VCPU0), "flush vcpu0");
	rg_check(halite_writer_flush_stream(w, PHYS), "flush physical");
	rg_check(halite_writer_put(w, PHYS, 20, image + 20 * MB_SIZE), "put zero data");
	rg_check(halite_writer_put(w, VCPU0, 21, image + 21 * MB_SIZE), "put zero data");
	rg_check(halite_writer_put_zero(w, 22), "put_zero");
	rg_check(halite_writer_put_zero(w, 23), "put_zero");
	rg_writer_finish(w);

	/* The numbers restore.sh checks rest on this layout: make sure it is the one. */
	rg_read_layout(&snap, path, lbs);
	for (uint32_t i = 0; i < NLB; i++) {
		if (lbs[i].stream != layout[i].stream || lbs[i].seq != layout[i].seq ||
		    lbs[i].n != 2 || lbs[i].mb[0] != layout[i].mb[0] ||
		    lbs[i].mb[1] != layout[i].mb[1])
			rg_die("layout: LB %u is stream 0x%x seq %u with %u blocks from %" PRIu64, i,
			       lbs[i].stream, lbs[i].seq, lbs[i].n, lbs[i].mb[0]);
	}
}

static void expect(const char *run, const char *what, uint64_t got, uint64_t want)
{
	if (got != want)
		rg_die("%s: %s %" PRIu64 ", expected %" PRIu64, run, what, got, want);
}

/* What every run must agree on, then the run's own numbers. */
static void check_stats(const char *name, const struct halite_restore_stats *st,
			const uint64_t *want)
{
	static const char *const names[] = { "faults",	    "faults_cached", "faults_zero",
					     "faults_vcpu", "lb_demand",     "lb_prefetch",
					     "mb_fault",    "mb_pool",	     "mb_prefetch",
					     "mb_staged",   "mb_staged_accessed" };
	const uint64_t got[] = { st->faults,	  st->faults_cached, st->faults_zero,
				 st->faults_vcpu, st->lb_demand,     st->lb_prefetch,
				 st->mb_fault,	  st->mb_pool,	     st->mb_prefetch,
				 st->mb_staged,	  st->mb_staged_accessed };

	fprintf(stderr,
		"%s: faults %" PRIu64 " (cached %" PRIu64 ", zero %" PRIu64 "), LBs %" PRIu64
		" demand + %" PRIu64 " prefetch, MBs %" PRIu64 " fault + %" PRIu64 " pool + %" PRIu64
		" prefetch + %" PRIu64 " zero, staged %" PRIu64 " accessed %" PRIu64 "\n",
		name, st->faults, st->faults_cached, st->faults_zero, st->lb_demand,
		st->lb_prefetch, st->mb_fault, st->mb_pool, st->mb_prefetch, st->mb_zero,
		st->mb_staged, st->mb_staged_accessed);
	expect(name, "mb_total", st->mb_total, NMB);
	expect(name, "mb_zero", st->mb_zero, 12);
	expect(name, "lb_total", st->lb_total, NLB);
	expect(name, "lb_retries", st->lb_retries, 0);
	expect(name, "bytes_read", st->bytes_read, (st->lb_demand + st->lb_prefetch) * 16384);
	/*
	 * A fault may reach the engine twice, rarely (seen about once in 50
	 * runs, on a restore's first fault): the second is counted as a fault
	 * of its own. So the fault counts are at least the first accesses, and
	 * restore.sh checks them against the trace, not against constants.
	 */
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (i < 4 && got[i] >= want[i])
			continue;
		expect(name, names[i], got[i], want[i]);
	}
	expect(name, "faults_vcpu", st->faults_vcpu, st->faults);
}

/* NO_PREFETCH, four LBs and two holes touched, then freed while running. */
static void run_demand(const char *file, const char *trace)
{
	static const uint64_t want[] = { 6, 0, 2, 6, 4, 0, 4, 4, 0, 0, 0 };
	struct halite_restore_stats st;
	struct rg_run run;

	rg_run_open(&run, &snap, file, trace,
		    HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD, HALITE_LOG_WARN);
	rg_touch(&run, 1, 0);	/* LB 0 */
	rg_settle(run.r, 1, 1, false);
	rg_touch(&run, 2, 1);	/* LB 3 */
	rg_settle(run.r, 2, 2, false);
	rg_touch(&run, 5, 0);	/* LB 4 */
	rg_settle(run.r, 3, 3, false);
	rg_touch(&run, 21, 0);	/* zero */
	rg_touch(&run, 30, 1);	/* never touched */
	rg_touch(&run, 16, 1);	/* LB 7 */
	rg_settle(run.r, 4, 4, false);
	if (halite_restore_wait(run.r, 0) != -ETIMEDOUT)
		rg_die("demand: the restore ended by itself");
	halite_restore_stats(run.r, &st);
	check_stats("demand", &st, want);
	rg_run_close(&run, trace);
}

/* Prefetch on, nothing touched: the prefetcher reads everything. */
static void run_full(const char *file, const char *trace)
{
	static const uint64_t want[] = { 0, 0, 0, 0, 0, NLB, 0, 0, 20, 0, 0 };
	struct halite_restore_stats st;
	struct rg_run run;

	rg_run_open(&run, &snap, file, trace, 0, HALITE_LOG_WARN);
	rg_check(halite_restore_wait(run.r, 60000), "full: wait");
	halite_restore_stats(run.r, &st);
	check_stats("full", &st, want);
	if (memcmp(run.mem, image, LEN))
		rg_die("full: restored memory differs from the image");
	rg_run_close(&run, trace);
}

/* TRACK_ACCESS: every LB demanded in file order; LBs 0 and 1 have their other block used. */
static void run_track(const char *file, const char *trace)
{
	/* 12 faults: 10 reads and 2 answered from the stage. */
	static const uint64_t want[] = { 12, 2, 0, 12, NLB, 0, 12, 8, 0, 10, 2 };
	struct halite_restore_stats st;
	struct rg_run run;

	rg_run_open(&run, &snap, file, trace,
		    HALITE_RESTORE_NO_PREFETCH | HALITE_RESTORE_NO_READAHEAD |
			    HALITE_RESTORE_TRACK_ACCESS,
		    HALITE_LOG_WARN);
	for (uint32_t i = 0; i < NLB; i++) {
		rg_touch(&run, layout[i].mb[0], 0);
		if (i + 1 == NLB)
			break; /* the last LB completes the restore */
		rg_settle(run.r, i + 1, i + 1, true);
		if (i < 2)
			rg_touch(&run, layout[i].mb[1], 1);
	}
	rg_check(halite_restore_wait(run.r, 60000), "track: wait");
	halite_restore_stats(run.r, &st);
	check_stats("track", &st, want);
	if (st.vm_access_pct != 20.0)
		rg_die("track: vm_access_pct %.2f, expected 20.00", st.vm_access_pct);
	if (memcmp(run.mem, image, LEN))
		rg_die("track: restored memory differs from the image");
	rg_run_close(&run, trace);
}

int main(int argc, char **argv)
{
	char file[4096], trace[4200];

	if (argc != 2) {
		fprintf(stderr, "usage: inspect_mkrestore DIR\n");
		return 2;
	}
	rg_begin();
	snprintf(file, sizeof(file), "%s/r.hlt", argv[1]);
	make_file(file);
	snprintf(trace, sizeof(trace), "%s/demand.trace", argv[1]);
	run_demand(file, trace);
	snprintf(trace, sizeof(trace), "%s/full.trace", argv[1]);
	run_full(file, trace);
	snprintf(trace, sizeof(trace), "%s/track.trace", argv[1]);
	run_track(file, trace);
	return 0;
}
