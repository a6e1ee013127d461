/* SPDX-License-Identifier: MIT */
/*
 * Private: another process's descriptors as /proc shows them, for the tools
 * that take over a guest's userfaultfd (halite-cloned re-attaching a clone,
 * halite-qemu finding a restore's QEMU).
 */
#ifndef HALITE_PROC_H
#define HALITE_PROC_H

#include <sys/types.h>

/*
 * The userfaultfds in @pid's descriptor table (a /proc/PID/fd link that
 * reads "anon_inode:[userfaultfd]"): how many, with the first one's number
 * in @fdnum when there is one. -errno when the table cannot be read (the
 * process is gone, or is not ours to look at).
 */
int halite_proc_find_uffd(pid_t pid, int *fdnum);

#endif
