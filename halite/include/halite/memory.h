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
};

#ifdef __cplusplus
}
#endif
#endif /* HALITE_MEMORY_H */
