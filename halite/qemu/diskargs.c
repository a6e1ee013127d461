// SPDX-License-Identifier: MIT
/*
 * A restore's command line pointed at its disks' new overlays (disks.h).
 *
 * The user's command line names each disk's image as at save (-drive
 * file=disk.qcow2, -blockdev driver=file,filename=disk.raw, -hda disk.img),
 * or, for a snapshot of a restored VM, an image further down the chain (the
 * restored QEMU ran on an overlay its user never named). Each frozen disk's
 * topmost image the command line names is replaced with the disk's restore
 * overlay, whose backing file is the frozen image; the format becomes qcow2
 * where the command line gives one. Everything else in the option stays.
 *
 * With -blockdev a protocol node (driver=file) names the file and a format
 * node above it (file=NODE) names the format: the first gets the overlay,
 * the second driver=qcow2 and no "backing" (the overlay's header names its
 * backing image; a backing node given for the old image would be the wrong
 * one). Nested file.filename= and JSON ({"file": {...}}) forms too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disks.h"
#include "vmconfig.h"

void hq_disk_name(struct hq_disk *d)
{
	static const char periph[] = "/machine/peripheral/";
	const char *q = d->qdev;
	size_t n;

	if (d->device[0]) {
		snprintf(d->name, sizeof(d->name), "%s", d->device);
		return;
	}
	/* "/machine/peripheral/vd0/virtio-backend": the device's id, vd0 */
	if (!strncmp(q, periph, sizeof(periph) - 1)) {
		q += sizeof(periph) - 1;
		n = strcspn(q, "/");
		snprintf(d->name, sizeof(d->name), "%.*s", (int)n, q);
	} else if (d->node[0]) {
		snprintf(d->name, sizeof(d->name), "node %s", d->node);
	} else {
		snprintf(d->name, sizeof(d->name), "%s", q);
	}
}

int hq_disk_level(const struct hq_disk *d, const char *path)
{
	if (!strcmp(path, d->image))
		return 0;
	for (int i = 0; i < d->nchain; i++)
		if (!strcmp(path, d->chain[i]))
			return i + 1;
	return -1;
}

/* Where an option names an image. */
enum arg_kind {
	ARG_PLAIN,	/* -hda FILE, a bare FILE, -pflash FILE: the argument is the path */
	ARG_DRIVE,	/* -drive file=FILE or file.filename=FILE */
	ARG_PROTO,	/* -blockdev driver=file,filename=FILE (keyval) */
	ARG_INLINE,	/* -blockdev driver=qcow2,file.filename=FILE (keyval) */
	ARG_JSON_PROTO, /* -blockdev {"driver": "file", "filename": FILE} */
	ARG_JSON_INLINE /* -blockdev {"driver": ..., "file": {"filename": FILE}} */
};

struct named {
	int at;	   /* the argument's index in the argv */
	int disk;  /* in hq_disks */
	int level; /* 0 the frozen image, 1.. down its chain */
	enum arg_kind kind;
	const char *node; /* ARG_PROTO, ARG_JSON_PROTO: its node-name (in @kv or @json) */
	struct hq_kvs kv;
	cJSON *json;
};

/* @p (absolute) without ".", ".." and repeated slashes, in place: a path that does not resolve. */
static void normalize(char *p)
{
	char *out = p, *in = p;

	while (*in) {
		size_t n;

		while (*in == '/')
			in++;
		n = strcspn(in, "/");
		if (!n)
			break;
		if (n == 1 && in[0] == '.') {
			in += n;
			continue;
		}
		if (n == 2 && in[0] == '.' && in[1] == '.') {
			while (out > p && *--out != '/')
				;
			in += n;
			continue;
		}
		*out++ = '/';
		memmove(out, in, n);
		out += n;
		in += n;
	}
	if (out == p)
		*out++ = '/';
	*out = '\0';
}

/*
 * The frozen disk whose image (or an image below it) @name is, relative to
 * @cwd; its level in *level. -1 if none.
 */
static int which_disk(const struct hq_disks *ds, const char *cwd, const char *name, int *level)
{
	char abs[PATH_MAX + 1], real[PATH_MAX];
	int best = -1;

	if (!name || !name[0])
		return -1;
	if (name[0] == '/' || !cwd)
		snprintf(abs, sizeof(abs), "%s", name);
	else
		snprintf(abs, sizeof(abs), "%s/%s", cwd, name);
	if (realpath(abs, real))
		snprintf(abs, sizeof(abs), "%s", real);
	else if (abs[0] == '/')
		normalize(abs);
	for (int i = 0; i < ds->n; i++) {
		int l = ds->d[i].frozen ? hq_disk_level(&ds->d[i], abs) : -1;

		if (l >= 0 && (best < 0 || l < *level)) {
			best = i;
			*level = l;
		}
	}
	return best;
}

/*
 * The frozen disk brought from a store (d->local) whose drive is @id: its
 * image was the saving host's, which this command line need not name.
 */
static int drive_of_copy(const struct hq_disks *ds, const char *id, int *level)
{
	for (int i = 0; id && id[0] && i < ds->n; i++)
		if (ds->d[i].frozen && ds->d[i].local[0] && !strcmp(ds->d[i].device, id)) {
			*level = 0;
			return i;
		}
	return -1;
}

static bool plain_image_opt(const char *name)
{
	static const char *const o[] = { "", "hda", "hdb", "hdc", "hdd", "pflash", "sd",
					  "mtdblock" };

	for (size_t i = 0; i < sizeof(o) / sizeof(o[0]); i++)
		if (!strcmp(name, o[i]))
			return true;
	return false;
}

/* What option @o (at argv index @at) names, into @n; false if no frozen disk. */
static bool find_named(const struct hq_disks *ds, const char *cwd, const struct hq_opt *o,
		       int at, struct named *n)
{
	const char *file = NULL;

	*n = (struct named){ .at = at, .disk = -1 };
	if (!o->arg)
		return false;
	if (plain_image_opt(o->name)) {
		n->kind = ARG_PLAIN;
		file = o->arg;
	} else if (!strcmp(o->name, "drive") || !strcmp(o->name, "blockdev")) {
		bool bd = !strcmp(o->name, "blockdev");

		if (o->arg[0] == '{' && bd) {
			cJSON *f;

			n->json = cJSON_Parse(o->arg);
			f = cJSON_GetObjectItemCaseSensitive(n->json, "file");
			if (cJSON_IsObject(f)) {
				n->kind = ARG_JSON_INLINE;
				file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(f,
											"filename"));
			} else {
				n->kind = ARG_JSON_PROTO;
				file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(n->json,
											"filename"));
				n->node = cJSON_GetStringValue(
					cJSON_GetObjectItemCaseSensitive(n->json, "node-name"));
			}
		} else if (!hq_kvs_split(o->arg, NULL, &n->kv)) {
			if (!bd) {
				n->kind = ARG_DRIVE;
				file = hq_kvs_get(&n->kv, "file");
				if (!file)
					file = hq_kvs_get(&n->kv, "file.filename");
			} else if (hq_kvs_get(&n->kv, "filename")) {
				n->kind = ARG_PROTO;
				file = hq_kvs_get(&n->kv, "filename");
				n->node = hq_kvs_get(&n->kv, "node-name");
			} else {
				n->kind = ARG_INLINE;
				file = hq_kvs_get(&n->kv, "file.filename");
			}
		}
	}
	n->disk = which_disk(ds, cwd, file, &n->level);
	if (n->disk < 0 && n->kind == ARG_DRIVE)
		n->disk = drive_of_copy(ds, hq_kvs_get(&n->kv, "id"), &n->level);
	if (n->disk >= 0)
		return true;
	hq_kvs_free(&n->kv);
	cJSON_Delete(n->json);
	n->json = NULL;
	return false;
}

/* @key's value becomes @val where it stands (added at the end if absent). */
static int kvs_set(struct hq_kvs *kv, const char *key, const char *val)
{
	bool found = false;

	for (int i = 0; i < kv->n; i++) {
		char *v;

		if (strcmp(kv->v[i].key, key))
			continue;
		v = strdup(val);
		if (!v)
			return -ENOMEM;
		free(kv->v[i].val);
		kv->v[i].val = v;
		kv->v[i].raw = false;
		found = true;
	}
	return found ? 0 : hq_kvs_add(kv, key, val);
}

static int json_set(cJSON *o, const char *key, const char *val)
{
	cJSON *s = cJSON_CreateString(val);

	if (!s)
		return -ENOMEM;
	if (cJSON_GetObjectItemCaseSensitive(o, key))
		cJSON_ReplaceItemInObjectCaseSensitive(o, key, s);
	else
		cJSON_AddItemToObject(o, key, s);
	return 0;
}

/* @n's argument with the overlay of its disk in place of the image; malloc'd. */
/* @o's @key set to false (JSON: a boolean, not keyval's "off"). */
static int json_set_false(cJSON *o, const char *key)
{
	cJSON_DeleteItemFromObjectCaseSensitive(o, key);
	return cJSON_AddFalseToObject(o, key) ? 0 : -ENOMEM;
}

/*
 * The overlay is opened read-write at QEMU's start (auto-read-only=off):
 * with auto-read-only on, a QEMU waiting for its incoming state holds its
 * inactive images read-only and reopens them by path on `cont`, which a
 * QEMU that has dropped to an unprivileged user (a clone's -runas) may not.
 */
static char *pointed(struct named *n, const struct hq_disk *d)
{
	char *out = NULL;
	int ret = 0;

	switch (n->kind) {
	case ARG_PLAIN:
		/* QEMU probes the format: the overlay is qcow2, its backing format is in it. */
		return strdup(d->overlay);
	case ARG_DRIVE:
		ret = kvs_set(&n->kv, hq_kvs_has(&n->kv, "file") ? "file" : "file.filename",
			      d->overlay);
		if (!ret && hq_kvs_has(&n->kv, "format"))
			ret = kvs_set(&n->kv, "format", "qcow2");
		if (!ret && hq_kvs_has(&n->kv, "driver"))
			ret = kvs_set(&n->kv, "driver", "qcow2");
		if (!ret)
			ret = kvs_set(&n->kv, "auto-read-only", "off");
		break;
	case ARG_PROTO:
		ret = kvs_set(&n->kv, "filename", d->overlay);
		if (!ret)
			ret = kvs_set(&n->kv, "auto-read-only", "off");
		break;
	case ARG_INLINE:
		ret = kvs_set(&n->kv, "file.filename", d->overlay);
		if (!ret)
			ret = kvs_set(&n->kv, "driver", "qcow2");
		if (!ret)
			ret = kvs_set(&n->kv, "auto-read-only", "off");
		hq_kvs_del(&n->kv, "backing");
		break;
	case ARG_JSON_PROTO:
		ret = json_set(n->json, "filename", d->overlay);
		if (!ret)
			ret = json_set_false(n->json, "auto-read-only");
		break;
	case ARG_JSON_INLINE:
		ret = json_set(cJSON_GetObjectItemCaseSensitive(n->json, "file"), "filename",
			       d->overlay);
		if (!ret)
			ret = json_set(n->json, "driver", "qcow2");
		if (!ret)
			ret = json_set_false(n->json, "auto-read-only");
		cJSON_DeleteItemFromObjectCaseSensitive(n->json, "backing");
		break;
	}
	if (ret)
		return NULL;
	out = n->json ? cJSON_PrintUnformatted(n->json) : hq_kvs_join(&n->kv, NULL);
	return out;
}

/*
 * The format node of -blockdev @arg if it sits on protocol node @node:
 * driver=qcow2, no backing; malloc'd, or NULL (not on it) with *ret 0.
 */
static char *format_node(const char *arg, const char *node, int *ret)
{
	struct hq_kvs kv;
	char *out = NULL;
	cJSON *j;

	*ret = 0;
	if (arg[0] == '{') {
		j = cJSON_Parse(arg);
		const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "file"));

		if (file && !strcmp(file, node)) {
			*ret = json_set(j, "driver", "qcow2");
			cJSON_DeleteItemFromObjectCaseSensitive(j, "backing");
			out = *ret ? NULL : cJSON_PrintUnformatted(j);
			*ret = *ret ? *ret : out ? 0 : -ENOMEM;
		}
		cJSON_Delete(j);
		return out;
	}
	if (hq_kvs_split(arg, NULL, &kv))
		return NULL;
	if (hq_kvs_get(&kv, "file") && !strcmp(hq_kvs_get(&kv, "file"), node)) {
		*ret = kvs_set(&kv, "driver", "qcow2");
		hq_kvs_del(&kv, "backing");
		out = *ret ? NULL : hq_kvs_join(&kv, NULL);
		*ret = *ret ? *ret : out ? 0 : -ENOMEM;
	}
	hq_kvs_free(&kv);
	return out;
}

static void replace(struct hq_argv *a, int at, char *s)
{
	free(a->argv[at]);
	a->argv[at] = s;
}

int hq_disks_rewrite(const struct hq_disks *ds, struct hq_argv *a, const char *cwd, char *err,
		     size_t errlen)
{
	struct hq_opt *opts = NULL;
	struct named *named = NULL;
	int best[HQ_MAX_DISKS]; /* for each disk, the index in @named of its topmost image */
	int nopts = 0, nnamed = 0, ret;

	if (a->argc < 1)
		return 0;
	ret = hq_opts_parse(a->argv + 1, a->argc - 1, &opts, &nopts, err, errlen);
	if (ret)
		return ret;
	named = calloc((size_t)nopts + 1, sizeof(*named));
	if (!named) {
		free(opts);
		return -ENOMEM;
	}
	/* Every option naming a frozen disk's image, or one below it. */
	for (int i = 0; i < nopts; i++) {
		/* The argument's index in @a ([0] is the binary); a bare image is the word itself. */
		int at = opts[i].index + 1 + (opts[i].name[0] != '\0');

		if (find_named(ds, cwd, &opts[i], at, &named[nnamed]))
			nnamed++;
	}
	/* For each disk, the topmost image named: the one its device sits on. */
	for (int k = 0; k < ds->n; k++)
		best[k] = -1;
	for (int i = 0; i < nnamed; i++) {
		int *b = &best[named[i].disk];

		if (*b < 0 || named[i].level < named[*b].level)
			*b = i;
	}
	for (int k = 0; k < ds->n && !ret; k++) {
		const struct hq_disk *d = &ds->d[k];
		struct named *n = best[k] < 0 ? NULL : &named[best[k]];
		char *s;

		if (!d->frozen)
			continue;
		if (!n) {
			snprintf(err, errlen, "disk %s: this command line names neither its frozen "
				 "image %s nor an image below it (give it as at save, or --no-disks "
				 "to run on the disks as they are)", d->name, d->image);
			ret = -ENOENT;
			break;
		}
		s = pointed(n, d);
		if (!s) {
			ret = -ENOMEM;
			break;
		}
		replace(a, n->at, s);
		if (!n->node || (n->kind != ARG_PROTO && n->kind != ARG_JSON_PROTO))
			continue;
		/* The format node on that protocol node reads it as qcow2 now. */
		for (int i = 0; i < nopts && !ret; i++) {
			int at = opts[i].index + 2;

			if (strcmp(opts[i].name, "blockdev") || at == n->at)
				continue;
			s = format_node(a->argv[at], n->node, &ret);
			if (s)
				replace(a, at, s);
		}
	}
	for (int i = 0; i < nnamed; i++) {
		hq_kvs_free(&named[i].kv);
		cJSON_Delete(named[i].json);
	}
	free(named);
	free(opts);
	return ret;
}
