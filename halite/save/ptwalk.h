/* SPDX-License-Identifier: MIT */
/*
 * Private: the x86-64 guest page-table walker. The save engine's background
 * thread walks the page-table roots collected while the VM ran, so it can
 * save memory in guest-virtual order (paper section 5.2).
 *
 * A walker is not thread-safe: one thread at a time per walker. Different
 * walkers are independent.
 */
#ifndef HALITE_PTWALK_H
#define HALITE_PTWALK_H

#include <stdint.h>

/*
 * Read the 4 KiB page-table page at guest-physical @gpa into @page, as it
 * was at the snapshot instant. Returns 0, or -ERANGE when @gpa is outside
 * guest memory (the entry is then skipped), or another -errno that aborts
 * the walk.
 */
typedef int (*halite_ptw_read_fn)(void *ctx, uint64_t gpa, void *page);

/*
 * A present leaf: virtual [va, va+len) maps guest-physical [gpa, gpa+len);
 * @len is 4 KiB, 2 MiB or 1 GiB, @va is canonical and @gpa aligned to @len.
 * @gpa is whatever the guest wrote: it may lie outside guest memory. Called
 * in strictly ascending @va order (as unsigned) within one root. Return 0 to
 * continue, > 0 to stop the walk early (returned as is), < 0 to abort with
 * that error.
 */
typedef int (*halite_ptw_visit_fn)(void *ctx, uint64_t va, uint64_t gpa, uint64_t len);

/* Walker state shared across roots: the set of table pages already walked. */
struct halite_ptw;

/*
 * Create a walker. @guest_mem_bytes_hint (0 if unknown) sizes the set of
 * walked tables; it grows as needed. Returns 0 or -ENOMEM; *@w is written
 * only on success.
 */
int halite_ptw_create(struct halite_ptw **w, uint64_t guest_mem_bytes_hint);

/* NULL is fine. */
void halite_ptw_free(struct halite_ptw *w);

/*
 * Work accounting. A walker counts its work in units: 1 per walk (the
 * root), HALITE_PTW_TABLE_UNITS per table page it reads or tries to read
 * (its entries are all scanned), 1 per leaf it visits; a visit callback
 * adds its own (for instance one per memory block it looks at) with
 * halite_ptw_charge(). Work only grows, summed over all walks.
 */
#define HALITE_PTW_TABLE_UNITS 512u

/*
 * Cap the work of all walks of @w at @units (the default: no cap). A walk
 * whose next step would pass it returns -EDQUOT without doing that step, and
 * from then on every walk and charge does the same: the work never exceeds
 * the budget.
 */
void halite_ptw_set_budget(struct halite_ptw *w, uint64_t units);

/*
 * From a visit callback (or between walks): count @units of the caller's
 * own work. 0, or -EDQUOT when that would pass the budget (nothing is
 * counted then, and the callback should return the error).
 */
int halite_ptw_charge(struct halite_ptw *w, uint64_t units);

/*
 * Walk the tree under @cr3 with @levels 4 or 5 (the CR3 flag bits, PCID,
 * PWT, PCD, LAM, and bits above MAXPHYADDR 52 are ignored), calling @visit
 * for each present leaf. @rd and @visit get @ctx.
 *
 * Each table page is walked at most once per walker, across all roots: a
 * table reached again (a shared kernel half, a loop, a second walk of the
 * same root) is skipped, and so are its leaves. Only tables whose walk
 * finished count: after an early stop or a failure, walking the same root
 * again goes on from there, re-visiting the leaves of the tables that were
 * cut short and skipping the subtrees that were finished.
 *
 * Returns 0 when done, the > 0 value @visit stopped with, or -errno: the
 * error from @rd or @visit, -ENOMEM, -EDQUOT when the budget is spent (see
 * halite_ptw_set_budget()), or -EINVAL for bad arguments. A root
 * outside guest memory (@rd says -ERANGE) is an empty tree: 0, counted in
 * out_of_range.
 */
int halite_ptw_walk(struct halite_ptw *w, uint64_t cr3, unsigned levels,
		    halite_ptw_read_fn rd, halite_ptw_visit_fn visit, void *ctx);

/* Counters since halite_ptw_create(), summed over all walks. */
struct halite_ptw_stats {
	uint64_t tables_read;		/* table pages read and walked */
	uint64_t tables_skipped_seen;	/* references to a table already walked */
	uint64_t entries_present;	/* present entries in walked tables */
	uint64_t leaves_4k;
	uint64_t leaves_2m;
	uint64_t leaves_1g;
	/*
	 * Of the leaves, those whose accessed bit (A, bit 5) the guest's CPU
	 * set: a page touched since the guest last cleared it. Linux clears it
	 * only when it scans for reclaim, so without memory pressure nearly
	 * every mapped page has it (docs/benchmarks.md: why the walk does not
	 * order by it).
	 */
	uint64_t leaves_accessed;
	uint64_t out_of_range;		/* table pointers @rd said -ERANGE for */
	uint64_t reserved_skipped;	/* present entries with reserved bits set */
	uint64_t work;			/* units of work counted, callers' included */
	uint64_t over_budget;		/* 1 once a step was refused for the budget */
};

void halite_ptw_stats(const struct halite_ptw *w, struct halite_ptw_stats *st);

#endif
