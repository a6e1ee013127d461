/* SPDX-License-Identifier: MIT */
/*
 * Private to restore/: what the fault paths of both engines share about the
 * guest side of a fault (the single restore's fault.c and learn.c, and a
 * clone session's session.c): where a fault is, which vCPU it came from,
 * and a served fault's time into the histogram. Inline: both run on the
 * fault path.
 */
#ifndef HALITE_RESTORE_GUEST_FAULT_H
#define HALITE_RESTORE_GUEST_FAULT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "gmem.h"
#include "stats.h"

/*
 * Where fault @m (at @addr) is: true with its region and page offset
 * (gmem.h, moves followed). False when it is outside guest memory now (left
 * behind by a move, or read before it): then it has been served with what
 * the mapping holds, and *@stray_err is 0 or that serving's -errno.
 */
static inline bool guest_fault_place(struct halite_gmem *gm, const struct uffd_msg *m,
				     uint64_t addr, uint32_t *ri, uint64_t *off, int *stray_err)
{
	if (halite_gmem_lookup(gm, addr, ri, off))
		return true;
	*stray_err = halite_gmem_serve_stray(gm, m);
	return false;
}

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
