/* SPDX-License-Identifier: MIT */
/*
 * delayfs: one file served read-only through FUSE, each read request
 * answered no earlier than a given latency after it arrived, so that the
 * kernel's own reads (page faults on a file mapping, readahead) pay a
 * storage latency the way the restore engine's reads do (bench/peers.c,
 * mmap-private).
 *
 * The file system runs in a child process (a FUSE server inside the process
 * whose memory faults on it risks deadlocking on that process's mmap lock),
 * multi-threaded so that concurrent requests overlap as they would on a
 * device with a queue. FUSE adds its own cost to every request (a round trip
 * through /dev/fuse and two context switches, some microseconds), on top of
 * the latency. The child dies with its parent (PR_SET_PDEATHSIG), unmounting.
 */
#ifndef HALITE_BENCH_DELAYFS_H
#define HALITE_BENCH_DELAYFS_H

#include <stdbool.h>
#include <stdint.h>

struct delayfs;

/*
 * Mount at @dir (an existing empty directory; needs root or fusermount3) a
 * file system holding one file, delayfs_file(), with @path's bytes. @direct:
 * the server reads @path with O_DIRECT (cold storage). Returns 0 once the
 * mount is up, or -errno with a message on stderr.
 */
int delayfs_mount(struct delayfs **d, const char *dir, const char *path, uint32_t latency_us,
		  bool direct);

/* "@dir/image": the served file. Valid until delayfs_unmount(). */
const char *delayfs_file(const struct delayfs *d);

/*
 * Read requests answered from the file so far (each paid the latency), and
 * the bytes they returned. A request wholly inside a hole of the file is
 * answered with zeros at once and not counted, as the file's own file system
 * would answer it without I/O. Thread-safe.
 */
void delayfs_counts(const struct delayfs *d, uint64_t *requests, uint64_t *bytes);

/*
 * Unmount (lazily if something still holds the file) and reap the child.
 * NULL is fine.
 */
void delayfs_unmount(struct delayfs *d);

#endif
