/* SPDX-License-Identifier: MIT */
/*
 * Private to restore/: what the fault paths of both engines share about the
 * guest side of a fault (the single restore's fault.c and learn.c, and a
 * clone session's session.c): which vCPU a fault came from, and a served
 * fault's time into the histogram. Inline: both run on the fault path.
 */
#ifndef HALITE_RESTORE_GUEST_FAULT_H
#define HALITE_RESTORE_GUEST_FAULT_H

#include <stdint.h>
#include <sys/types.h>

#include "stats.h"

/*
 * The faulting thread @tid (UFFD_FEATURE_THREAD_ID) among the caller's
 * @nvcpus vCPU thread ids: its index + 1, or 0 for another thread.
 */
static inline uint32_t guest_vcpu_of(const pid_t *vcpus, uint32_t nvcpus, uint32_t tid)
{
	for (uint32_t i = 0; i < nvcpus; i++)
		if ((uint32_t)vcpus[i] == tid)
			return i + 1;
	return 0;
}

/*
 * A fault served: its service time, from the message read (@t0,
 * halite_now_ns()) to its wake, into @hist (lock-free: halite_hist_add()).
 */
static inline void guest_fault_timed(struct halite_hist *hist, uint64_t t0)
{
	halite_hist_add(hist, halite_now_ns() - t0);
}

#endif
