/* SPDX-License-Identifier: MIT */
/*
 * Private: refusing discards of shared guest memory while an engine needs
 * what the file holds.
 *
 * A VMM gives shared guest memory back by punching a hole in its file
 * (QEMU's ram_block_discard_range(): virtio-balloon inflation, free page
 * reporting, virtio-mem unplug: fallocate(PUNCH_HOLE), then madvise). No
 * userfaultfd event reports a hole punched through the file, and the data
 * is gone by the time the madvise's REMOVE event is read. So while a save
 * still has blocks to copy out of the file, or a restore blocks to copy in,
 * the file is made append-only (FS_APPEND_FL): fallocate(PUNCH_HOLE),
 * MADV_REMOVE and truncation then fail with EPERM, the VMM keeps the pages
 * (a balloon page stays backed, a reported free page keeps its bytes,
 * virtio-mem refuses the unplug and the guest retries later), and writes
 * through existing mappings go on as before.
 *
 * The flag outlives a process that dies holding it, so whoever sets it
 * also records itself in the xattr "user.halite.nodiscard" (pid and start
 * time); a later engine that finds the flag with a dead owner takes it
 * over, and clears it when done. A flag set by anyone else (chattr +a) is
 * left alone.
 */
#ifndef HALITE_DISCARD_H
#define HALITE_DISCARD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * Make @fd's file refuse discards. 0 when it does now (*@ours: this process
 * must call halite_discard_allow() at the end), or -errno: -ENOTTY or
 * -EOPNOTSUPP for a file system without the flag (hugetlbfs), -EPERM
 * without CAP_LINUX_IMMUTABLE.
 */
int halite_discard_refuse(int fd, bool *ours);

/* Undo halite_discard_refuse() (when it said ours). 0 or -errno. */
int halite_discard_allow(int fd);

struct halite_logger;
/*
 * An engine's end for one region: when *@refused, undo the refusal, clear
 * *@refused, and log a warning naming region @name if the flag stays.
 */
void halite_discard_release(int fd, bool *refused, const struct halite_logger *log,
			    const char *name);

/*
 * Before a file is opened for writing (an append-only file refuses O_RDWR
 * without O_APPEND): clear a refusal whose engine died. 0 when the file is
 * not append-only (now), -EBUSY with *@owner set when a live engine holds
 * it, -EPERM when someone else made it append-only, or another -errno. @fd
 * may be read-only.
 */
int halite_discard_reclaim(int fd, pid_t *owner);

/*
 * Which pages of [@off, @off + @len) of @fd's file hold data (page cache or
 * swap; SEEK_DATA/SEEK_HOLE): bit i of @bits for the page at @off + i *
 * @page, set (never cleared). Where discards cannot be refused, what a save
 * checks a copied block against, and what a restore taking over finds in.
 * 0 or -errno.
 */
int halite_file_data_pages(int fd, uint64_t off, uint64_t len, uint64_t page, uint64_t *bits);

#endif
