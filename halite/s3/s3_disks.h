/* SPDX-License-Identifier: MIT */
/*
 * Internal: a snapshot's frozen disks in the store, beside it
 * (docs/object-store.md, "Disks in the store").
 *
 * For a snapshot at KEY, each frozen disk N (its index in the snapshot's
 * qemu.disks record) is one self-contained qcow2 image at KEY.disks/N.qcow2,
 * and KEY.disks/manifest.json lists them:
 *
 *   {"halite_disks": 1, "snapshot_uuid": "<32 hex>",
 *    "disks": [{"index": N, "name": "...", "format": "qcow2",
 *               "virtual_size": "<bytes>", "size": "<bytes>",
 *               "etag": "<the store's ETag>", "sha256": "<64 hex>"}]}
 *
 * Sizes are strings (exact 64-bit). Nothing in it names a path: a reader
 * builds each object's key from KEY and the index, and the place it keeps
 * a copy from its own configuration. A push writes the images, then the
 * manifest, then the snapshot: a reader that finds the snapshot finds its
 * disks, and one that finds a manifest of another snapshot (a push of a
 * new snapshot to KEY under way) refuses it by the uuid.
 *
 * Calls return 0 or a negative code (-errno, -HALITE_S3_E_*), with the
 * reason in halite_s3_errmsg() of the handle (or @err where there is none).
 */
#ifndef HALITE_S3_S3_DISKS_H
#define HALITE_S3_S3_DISKS_H

#include <stdint.h>

#include "s3.h"

#define HALITE_S3_DISKS_MAX 32		    /* as HQ_MAX_DISKS */
#define HALITE_S3_MANIFEST_MAX (64u << 10) /* bytes of manifest a reader accepts */

struct halite_s3_disk {
	uint32_t index;		/* in the snapshot's qemu.disks */
	char name[256];		/* for people: the drive's id or device's */
	uint64_t vsize;		/* the guest's disk size */
	uint64_t size;		/* the object's (the qcow2 file's) */
	char etag[HALITE_S3_ETAG_MAX];
	char sha256[65];	/* of the whole object, lowercase hex */
};

struct halite_s3_disks {
	uint8_t uuid[16];	/* the snapshot's */
	uint32_t n;
	struct halite_s3_disk d[HALITE_S3_DISKS_MAX];
};

/* "KEY.disks/N.qcow2", or with @index < 0 "KEY.disks/manifest.json"; malloc'd or NULL. */
char *halite_s3_disk_key(const char *key, int index);

/* The manifest as JSON (malloc'd), or NULL: out of memory. */
char *halite_s3_disks_json(const struct halite_s3_disks *m);
/*
 * @len bytes of JSON into @m, every field checked (indices below
 * HALITE_S3_DISKS_MAX and distinct, sizes, hex digests). 0 or -EPROTO with
 * @err naming the problem.
 */
int halite_s3_disks_parse(const char *json, size_t len, struct halite_s3_disks *m, char *err,
			  size_t errlen);
/*
 * KEY.disks/manifest.json of @key into @m, checked to be of the snapshot
 * @uuid. 0; 1 when the store has none (a snapshot pushed without disks);
 * else < 0 (-ESTALE: another snapshot's).
 */
int halite_s3_disks_get(struct halite_s3 *s, const char *key, const uint8_t uuid[16],
			struct halite_s3_disks *m);

/* SHA-256 of @fd's content from offset 0 (lowercase hex) and its length. 0 or -errno. */
int halite_s3_sha256_fd(int fd, char hex[65], uint64_t *size);
/*
 * The file at @path is disk @e: its size and SHA-256. 0, -errno (ENOENT:
 * none), or -EBADMSG with @err saying what differs.
 */
int halite_s3_disk_check(const char *path, const struct halite_s3_disk *e, char *err,
			 size_t errlen);
/*
 * Disk @e of the snapshot at @key into @path: downloaded to a temporary
 * file beside it (0600), checked (the store's ETag, then size and SHA-256),
 * and renamed to @path only then, so @path is always whole. 0 or < 0.
 */
int halite_s3_disk_fetch(struct halite_s3 *s, const char *key, const struct halite_s3_disk *e,
			 const char *path);

#endif
