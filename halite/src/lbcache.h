/* SPDX-License-Identifier: MIT */
/*
 * Internal, not the public API: the host's cache of locality blocks read
 * from an object store (issue 26). A bounded directory of LBs keyed by the
 * snapshot's uuid and the LB's offset, shared by every process on the host
 * that opens the same directory (restores, clone daemons, a restarted
 * daemon), evicting the least recently used. The layout, the bound and how
 * LRU is kept across processes are at the top of lbcache.c and in
 * docs/object-store.md, "The host's LB cache".
 *
 * Every call returns >= 0 on success, -errno or -HALITE_E_* on failure.
 * One handle may be used by many threads of one process at once; a child
 * process opens its own handle (a handle's lock is its open file, which a
 * forked child would share).
 */
#ifndef HALITE_LBCACHE_H
#define HALITE_LBCACHE_H

#include <stddef.h>
#include <stdint.h>

struct halite_lbcache;

/* The largest entry the cache holds (a 4 MiB LB, stored, with room to spare). */
#define HALITE_LBCACHE_MAX_ENTRY (64u << 20)

/* One handle's counters, since open; bytes_stored is the whole cache's. */
struct halite_lbcache_stats {
	uint64_t hits;
	uint64_t misses;
	uint64_t bytes_hit;	/* bytes copied out by hits */
	uint64_t puts;		/* entries stored */
	uint64_t evictions;	/* entries this handle evicted to stay in the bound */
	uint64_t bytes_stored;	/* the cache's size on disk now, every process's entries */
};

/*
 * Opens (creating it 0700 if missing; its parent must exist) the cache in
 * @dir, bounded to @max_bytes (> 0) of entry files. An existing @dir that is
 * a symbolic link, is not owned by this user or is group- or
 * world-writable is refused (-ELOOP, -EPERM) with @err naming it; every
 * failure writes one sentence naming the problem into @err. *@c is written
 * only on success. Several handles, in one process or many, may hold the
 * same directory; each may pass a different @max_bytes, and a put keeps the
 * whole directory within its handle's bound.
 */
int halite_lbcache_open(struct halite_lbcache **c, const char *dir, uint64_t max_bytes,
			char *err, size_t errlen);

/*
 * The entry for (@uuid, @off) of exactly @len bytes into @buf: 1 (a hit:
 * @len bytes copied, the entry becomes the most recently used), 0 (a miss:
 * no such entry, or one of another length, or one that fails its own
 * checksum, which is removed; @buf's contents are then unspecified), or
 * -errno when the file system fails. -EINVAL for @len 0 or above
 * HALITE_LBCACHE_MAX_ENTRY. Never blocks on another process's lock unless
 * it removes a bad entry.
 */
int halite_lbcache_get(struct halite_lbcache *c, const uint8_t uuid[16], uint64_t off,
		       void *buf, size_t len);

/*
 * Stores @len bytes of @buf as the entry for (@uuid, @off), replacing one
 * there, and evicts the least recently used entries until the cache is
 * within the bound: 0 once the entry is visible to every process, complete.
 * -EINVAL for @len 0 or above HALITE_LBCACHE_MAX_ENTRY; -HALITE_E_LIMIT when
 * the entry alone is larger than the bound; -errno (-ENOSPC, ...) from the
 * file system, with nothing stored.
 */
int halite_lbcache_put(struct halite_lbcache *c, const uint8_t uuid[16], uint64_t off,
		       const void *buf, size_t len);

/*
 * Removes the entry for (@uuid, @off) if there is one: for an entry whose
 * bytes the caller found bad (its LB checksum failed).
 */
void halite_lbcache_drop(struct halite_lbcache *c, const uint8_t uuid[16], uint64_t off);

/* This handle's counters and the cache's size now. Thread-safe. */
void halite_lbcache_stats(const struct halite_lbcache *c, struct halite_lbcache_stats *st);

/*
 * For tests: write entries through named temporary files and rename(), as
 * on a file system without O_TMPFILE.
 */
void halite_lbcache_no_tmpfile(struct halite_lbcache *c);

/* Closes the handle; the entries stay. NULL is fine. */
void halite_lbcache_close(struct halite_lbcache *c);

#endif
