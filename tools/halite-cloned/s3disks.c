// SPDX-License-Identifier: MIT
/*
 * halite-cloned: the frozen disks of a QEMU template read from an object
 * store (docs/clones.md, "Templates in an object store").
 *
 * A snapshot records its frozen disks (qemu.disks) by the saving host's
 * paths, which mean nothing here. When its store holds the disks beside it
 * (halite-inspect push: a manifest and one self-contained qcow2 per disk),
 * each template open brings them into the host's cache with
 * hq_diskfetch_bring(): CACHE/disks/<uuid>/N.qcow2 under --cache-dir,
 * fetched once per host and checked (size, SHA-256) at every open, a
 * restarted daemon's included. Each clone is then given that directory
 * (halite-qemu clone --disk-copies) and runs on its own overlay of copy N
 * for frozen disk N: the directory is the daemon's own and only indices
 * name what is in it, so nothing read from the snapshot or the store
 * names a path the daemon or a clone touches. A snapshot that records
 * disks without them in the store stays refused: its clones would have no
 * disk to run on.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <halite/errors.h>
#include <halite/format.h>

#include "cloned.h"
#include "diskfetch.h"

/* The snapshot's qemu.disks, NUL-terminated and malloc'd; NULL without one. */
static char *disks_record(struct halite_reader *r)
{
	const void *val;
	uint32_t len;

	return halite_reader_meta_find(r, "qemu.disks", &val, &len) ? NULL : strndup(val, len);
}

void s3disks_free(struct tmpl *tp)
{
	free(tp->disk_copies);
	free(tp->disks);
	tp->disk_copies = NULL;
	tp->disks = NULL;
}

int s3disks_bring(struct tmpl *tp, struct halite_reader *r, char *err, size_t errlen)
{
	const struct halite_file_info *fi = halite_reader_info(r);
	struct hq_disks *ds = calloc(1, sizeof(*ds));
	struct hq_diskfetch *f = calloc(1, sizeof(*f));
	char *rec = disks_record(r), why[900] = "";
	int ret = 0;

	s3disks_free(tp);
	if (!ds || !f) {
		ret = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	if (!rec)
		goto out; /* no disks */
	ret = hq_disks_parse(rec, ds, why, sizeof(why));
	if (ret) {
		snprintf(err, errlen, "snapshot %s: %s", tp->snapshot, why);
		goto out;
	}
	if (!ds->n)
		goto out;
	/* HALITE_CACHE_DIR is --cache-dir (main.c): the host's cache, never a private one. */
	ret = hq_diskfetch_bring(f, tp->snapshot, fi->uuid, ds, why, sizeof(why));
	if (ret) {
		snprintf(err, errlen, "snapshot %s: its disks from the store: %s", tp->snapshot, why);
		goto out;
	}
	if (!f->used) {
		snprintf(err, errlen, "snapshot %s is a QEMU guest's with disks (qemu.disks): its "
			 "disk images do not travel with the object (the store holds no disks beside "
			 "it): push it with its disks (halite-inspect push, without --no-disks), or "
			 "take its template from a --snapshot-dir (halite-inspect pull it there, "
			 "beside its images)", tp->snapshot);
		ret = -HALITE_E_UNSUPPORTED;
		goto out;
	}
	if (asprintf(&tp->disk_copies, "%s/disks/%s", f->root, tp->uuid) < 0) {
		tp->disk_copies = NULL;
		ret = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	tp->disks = f;
	f = NULL;
out:
	free(rec);
	free(ds);
	free(f);
	return ret;
}

/* "disks": where the frozen disks came from at the last open (null: none brought). */
void s3disks_json(cJSON *j, const struct tmpl *tp)
{
	const struct hq_diskfetch *f = tp->disks;
	cJSON *o, *a;

	if (!f) {
		cJSON_AddNullToObject(j, "disks");
		return;
	}
	o = cJSON_AddObjectToObject(j, "disks");
	cJSON_AddNumberToObject(o, "requests", (double)f->requests);
	a = cJSON_AddArrayToObject(o, "images");
	for (int i = 0; i < HQ_MAX_DISKS; i++) {
		cJSON *e;

		if (f->d[i].from == HQ_DISK_LOCAL)
			continue; /* not a frozen disk */
		e = cJSON_CreateObject();
		cJSON_AddNumberToObject(e, "index", i);
		cJSON_AddStringToObject(e, "from", f->d[i].from == HQ_DISK_STORE ? "store" : "cache");
		cJSON_AddNumberToObject(e, "bytes", (double)f->d[i].bytes);
		cJSON_AddNumberToObject(e, "seconds", f->d[i].seconds);
		cJSON_AddBoolToObject(e, "damaged", f->d[i].damaged);
		cJSON_AddItemToArray(a, e);
	}
}
