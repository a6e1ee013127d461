/* SPDX-License-Identifier: MIT */
/* Guest memory as both engines see it. */
#ifndef HALITE_MEMORY_H
#define HALITE_MEMORY_H

#ifdef __cplusplus
extern "C" {
#endif

enum halite_mem_kind {
	HALITE_MEM_ANON = 0,   /* private anonymous memory of this process */
	HALITE_MEM_SHARED = 1, /* a shared mapping of a file (memfd, tmpfs, hugetlbfs) */
	/*
	 * A copy in this process of memory outside the guest's RAM, such as a
	 * device's video memory, which the caller moves itself: never
	 * registered with userfaultfd. A save reads it as it is at @host (the
	 * caller keeps it unchanged until the save is over); a restore writes
	 * it before halite_restore_start() returns. See save.h and restore.h.
	 */
	HALITE_MEM_COPY = 2,
};

#ifdef __cplusplus
}
#endif
#endif /* HALITE_MEMORY_H */
