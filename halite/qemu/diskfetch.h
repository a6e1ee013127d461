/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu, private: the frozen disks of a snapshot read from an object
 * store, brought whole into this host's cache before the guest starts
 * (docs/object-store.md, "Disks in the store").
 *
 * The store holds each frozen disk as one self-contained qcow2 beside the
 * snapshot, listed in a manifest (halite/s3/s3_disks.h). Each is kept at
 * CACHE/disks/<snapshot uuid>/N.qcow2 (directories 0700, files 0600), N
 * the disk's index in the snapshot's record: fetched to a temporary name
 * and renamed once checked against the manifest (ETag, size, SHA-256), so
 * a name that exists holds a whole image. A later restore on the host
 * checks the copy again (size, SHA-256) and uses it without a GET; a
 * damaged copy is removed and fetched again. CACHE is --cache-dir
 * (HALITE_CACHE_DIR), else a private directory removed by
 * hq_diskfetch_done(). Guests never write the copy: each runs on its own
 * overlay of it (hq_disk.local).
 */
#ifndef HALITE_QEMU_DISKFETCH_H
#define HALITE_QEMU_DISKFETCH_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "disks.h"

enum hq_disk_from { HQ_DISK_LOCAL = 0, HQ_DISK_STORE, HQ_DISK_CACHE };

struct hq_diskfetch {
	char root[PATH_MAX];	/* CACHE */
	bool temp;		/* CACHE is ours, removed at the end */
	bool used;		/* the store had the disks: ds->d[].local set */
	struct {
		enum hq_disk_from from;
		uint64_t bytes;	/* fetched from the store */
		double seconds;	/* fetching and checking (or checking the cached copy) */
		bool damaged;	/* the cached copy failed its check: fetched again */
	} d[HQ_MAX_DISKS];
	uint64_t requests;	/* to the store, for the disks and their manifest */
};

/*
 * For the snapshot at @url (s3://) of uuid @uuid: when the store holds its
 * disks' manifest, each frozen disk of @ds brought into the cache and its
 * d->local set to the copy. Without a manifest, nothing (@f->used false):
 * the disks are this host's, as recorded. 0, or < 0 with @err naming the
 * disk and the problem.
 */
int hq_diskfetch_bring(struct hq_diskfetch *f, const char *url, const uint8_t uuid[16],
		       struct hq_disks *ds, char *err, size_t errlen);
/* The private CACHE removed (QEMU keeps the images it opened). */
void hq_diskfetch_done(struct hq_diskfetch *f);

#endif
