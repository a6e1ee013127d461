/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu, private: what /proc says of a process (QEMU, a socket's
 * holder, a daemon).
 */
#ifndef HALITE_QEMU_PROC_H
#define HALITE_QEMU_PROC_H

#include <stddef.h>
#include <sys/types.h>

/* /proc/PID/WHAT, whole (its size is unknown beforehand), malloc'd; *len its length. */
char *hq_read_proc(pid_t pid, const char *what, size_t *len);

/* What /proc/PID/status says of a process's rights. */
struct hq_proc_status {
	uid_t euid;
	gid_t egid;
	unsigned long long cap_eff; /* its effective capabilities, 1 << CAP_* */
	int seccomp;		    /* 2: under a seccomp filter */
};
int hq_proc_status(pid_t pid, struct hq_proc_status *st);

/*
 * Its state letter (/proc/PID/stat: 'R', 'S', 'Z' a zombie, 'X' dead), 0 if
 * there is no such process, '?' if it cannot be read.
 */
char hq_proc_state(pid_t pid);

/*
 * The descriptors of @pid whose /proc/PID/fd link reads @target (a path, or
 * "anon_inode:[userfaultfd]"): at most @max into @fds. How many it holds
 * (more than @max possibly), or -errno when its fd directory cannot be read.
 */
int hq_proc_fds_to(pid_t pid, const char *target, int *fds, int max);

#endif
