/* SPDX-License-Identifier: MIT */
/*
 * Private to the benchmark: the "plain copy-on-write" peer of the save
 * engine. Write-protect-only tracking (userfaultfd WP, reads never fault),
 * pages written to a raw image at their physical offset, background in
 * physical order. Anonymous or shared memory of this process.
 */
#ifndef HALITE_BENCH_COW_H
#define HALITE_BENCH_COW_H

#include <stdbool.h>
#include <stdint.h>

struct cow_save;

struct cow_stats {
	uint64_t arm_ns;	/* register + write-protect everything */
	uint64_t duration_ns;	/* arm start to every page saved and unregistered */
	uint64_t faults;	/* write faults served */
	uint64_t fault_p50_ns;	/* the message's turn in its batch to wake */
	uint64_t fault_p99_ns;
	uint64_t fault_max_ns;
	uint64_t pages_fault;	/* pages saved by the fault thread */
	uint64_t pages_bg;	/* pages saved by the background thread */
	bool done;
	int error;
};

/*
 * Check that the kernel can do it (WP on anonymous memory with
 * WP_UNPOPULATED): 0, or -errno / -HALITE_E_UNSUPPORTED with a message in
 * @msg.
 */
int cow_probe(char *msg, size_t len);

/* Create the image file (truncated to @len) and the context; not armed. */
int cow_create(struct cow_save **c, const char *path, void *mem, uint64_t len);

/* The snapshot instant, guest paused: register, write-protect, start threads. */
int cow_arm(struct cow_save *c);

/* Wait for the end: 0 or the first error (-errno). */
int cow_wait(struct cow_save *c);

/* After cow_wait. */
void cow_get_stats(struct cow_save *c, struct cow_stats *st);

/* Stop (if running), unregister, close. NULL is fine. */
void cow_free(struct cow_save *c);

#endif
