// SPDX-License-Identifier: MIT
/*
 * The guest's disks, frozen with its memory (disks.h).
 *
 * Why overlays are made with qemu-img rather than by QEMU
 * (blockdev-snapshot-sync mode absolute-paths): QEMU writes into the new
 * overlay the backing file name as it opened it, which for `-drive
 * file=disk.qcow2` is relative to QEMU's working directory, while a qcow2
 * backing name is read relative to the overlay's directory. An overlay made
 * by `qemu-img create -b ABSOLUTE -u` names its image wherever it lies, and
 * QEMU takes it as it is (mode existing). -u: the image is not opened (QEMU
 * holds it), so its format and size are given.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "disks.h"
#include "proc.h"
#include "vm.h"

#define JOB_TIMEOUT_MS 60000

static int seterr(char *err, size_t len, int ret, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int seterr(char *err, size_t len, int ret, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	return ret;
}

static const char *jstr(const cJSON *o, const char *key)
{
	const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));

	return s ? s : "";
}

static bool jbool(const cJSON *o, const char *key)
{
	return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* @name as QEMU @pid opened it, absolute: relative names are QEMU's working directory's. */
static int resolve(pid_t pid, const char *name, char *out, size_t len)
{
	char in[HQ_PATH_MAX + 64], real[PATH_MAX];

	if (!name[0] || !strncmp(name, "json:", 5) || strstr(name, "://"))
		return -EINVAL;
	if (name[0] == '/')
		snprintf(in, sizeof(in), "%s", name);
	else
		snprintf(in, sizeof(in), "/proc/%d/cwd/%s", (int)pid, name);
	if (!realpath(in, real))
		return -errno;
	if (strlen(real) >= len)
		return -ENAMETOOLONG;
	memcpy(out, real, strlen(real) + 1);
	return 0;
}

int hq_disks_query(struct hq_vm *vm, struct hq_disks *ds, char *err, size_t errlen)
{
	cJSON *list = NULL, *b;
	int ret;

	memset(ds, 0, sizeof(*ds));
	ret = hq_qmp_call(vm->qmp, "query-block", NULL, &list, HQ_QMP_TIMEOUT_MS);
	if (ret)
		return seterr(err, errlen, ret, "query-block: %s", hq_qmp_errmsg(vm->qmp));
	cJSON_ArrayForEach(b, list) {
		const cJSON *in = cJSON_GetObjectItemCaseSensitive(b, "inserted");
		const cJSON *img = cJSON_GetObjectItemCaseSensitive(in, "image");
		struct hq_disk *d;

		if (!in)
			continue; /* an empty drive: no medium */
		if (ds->n == HQ_MAX_DISKS) {
			ret = seterr(err, errlen, -E2BIG, "more than %d disks", HQ_MAX_DISKS);
			break;
		}
		d = &ds->d[ds->n++];
		snprintf(d->device, sizeof(d->device), "%s", jstr(b, "device"));
		snprintf(d->qdev, sizeof(d->qdev), "%s", jstr(b, "qdev"));
		snprintf(d->node, sizeof(d->node), "%s", jstr(in, "node-name"));
		snprintf(d->format, sizeof(d->format), "%s", jstr(in, "drv"));
		hq_disk_name(d);
		d->ro = jbool(in, "ro");
		d->vsize = img ? (uint64_t)cJSON_GetNumberValue(
					 cJSON_GetObjectItemCaseSensitive(img, "virtual-size")) : 0;
		if (jbool(in, "encrypted")) {
			ret = seterr(err, errlen, -ENOTSUP, "disk %s: an encrypted image is not "
				     "supported", d->name);
			break;
		}
		if (resolve(vm->pid, jstr(in, "file"), d->image, sizeof(d->image))) {
			/* Not a file (nbd://, json:{...}, gone): a read-only one is left alone. */
			if (d->ro) {
				snprintf(d->image, sizeof(d->image), "%s", jstr(in, "file"));
				continue;
			}
			ret = seterr(err, errlen, -ENOTSUP, "disk %s: its image '%s' is not a file "
				     "on this host (network or JSON images cannot be frozen); use "
				     "--no-disks to save memory only", d->name, jstr(in, "file"));
			break;
		}
		if (d->ro)
			continue; /* never frozen: its chain does not matter */
		if (!d->vsize) {
			ret = seterr(err, errlen, -EPROTO, "disk %s: QEMU gives no virtual size",
				     d->name);
			break;
		}
		for (img = cJSON_GetObjectItemCaseSensitive(img, "backing-image"); img;
		     img = cJSON_GetObjectItemCaseSensitive(img, "backing-image")) {
			if (d->nchain == HQ_MAX_CHAIN) {
				ret = seterr(err, errlen, -E2BIG, "disk %s: more than %d images "
					     "in its chain", d->name, HQ_MAX_CHAIN);
				break;
			}
			if (resolve(vm->pid, jstr(img, "filename"), d->chain[d->nchain],
				    HQ_PATH_MAX)) {
				ret = seterr(err, errlen, -ENOTSUP, "disk %s: its backing image '%s' "
					     "is not a file on this host", d->name,
					     jstr(img, "filename"));
				break;
			}
			d->nchain++;
		}
		if (ret)
			break;
	}
	cJSON_Delete(list);
	return ret;
}

int hq_disks_writable(const struct hq_disks *ds)
{
	int n = 0;

	for (int i = 0; i < ds->n; i++)
		n += !ds->d[i].ro;
	return n;
}

/* qom-get @path @prop as a boolean: 1, 0, or 0 when there is no such property. */
static int qom_bool(struct hq_vm *vm, const char *path, const char *prop)
{
	cJSON *args = cJSON_CreateObject(), *ret = NULL;
	int r;

	cJSON_AddStringToObject(args, "path", path);
	cJSON_AddStringToObject(args, "property", prop);
	r = hq_qmp_call(vm->qmp, "qom-get", args, &ret, HQ_QMP_TIMEOUT_MS);
	r = !r && cJSON_IsTrue(ret);
	cJSON_Delete(ret);
	return r;
}

/* --- libvirt --- */

/*
 * Whether libvirt runs QEMU @pid: its command line has libvirt's marks
 * (-name guest=..., a -uuid) and libvirt knows a running domain of that
 * uuid. Then ds->libvirt is the uuid, ds->libvirt_uri the connection
 * ($HALITE_LIBVIRT_URI, else qemu:///system) and each disk's target
 * (vda, ...) is libvirt's name for it.
 */
static int libvirt_domain(pid_t pid, struct hq_disks *ds, char *err, size_t errlen)
{
	char out[8192], *line, *save = NULL, *buf;
	const char *uri = getenv("HALITE_LIBVIRT_URI");
	bool guest = false;
	size_t n;

	ds->libvirt[0] = '\0';
	buf = hq_read_proc(pid, "cmdline", &n);
	if (!buf)
		return 0;
	for (char *a = buf; a < buf + n; a += strlen(a) + 1) {
		char *next = a + strlen(a) + 1;

		if (next >= buf + n)
			break;
		if (!strcmp(a, "-name") && !strncmp(next, "guest=", 6))
			guest = true;
		if (!strcmp(a, "-uuid"))
			snprintf(ds->libvirt, sizeof(ds->libvirt), "%.36s", next);
	}
	free(buf);
	if (!guest || !ds->libvirt[0]) {
		ds->libvirt[0] = '\0';
		return 0;
	}
	snprintf(ds->libvirt_uri, sizeof(ds->libvirt_uri), "%s", uri && *uri ? uri :
		 "qemu:///system");
	if (halite_run((char *const[]){ "virsh", "-q", "-c", ds->libvirt_uri, "domblklist",
				     ds->libvirt, "--details", NULL }, out, sizeof(out), err,
		    errlen)) {
		char why[512];

		snprintf(why, sizeof(why), "%s", err);
		return seterr(err, errlen, -ENOTSUP, "QEMU (pid %d) looks run by libvirt (domain "
			      "%s), whose disks must be frozen through it, but 'virsh -c %s "
			      "domblklist' failed: %s (HALITE_LIBVIRT_URI names another "
			      "connection; --no-disks saves memory only)", (int)pid, ds->libvirt,
			      ds->libvirt_uri, why);
	}
	/* "file  disk  vda  /var/lib/libvirt/images/vm.qcow2" */
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char type[32], dev[32], target[32], source[HQ_PATH_MAX], real[PATH_MAX];

		if (sscanf(line, "%31s %31s %31s %1023[^\n]", type, dev, target, source) != 4)
			continue;
		if (!realpath(source, real))
			snprintf(real, sizeof(real), "%s", source);
		for (int i = 0; i < ds->n; i++)
			if (!strcmp(ds->d[i].image, real))
				snprintf(ds->d[i].target, sizeof(ds->d[i].target), "%s", target);
	}
	return 0;
}

/*
 * Make the qcow2 overlay of @d: in @dir (or beside its image), named
 * IMAGE-STEM.TAG.qcow2 with -N added until the name is new. The name is
 * taken with O_EXCL first: an existing file, another disk's overlay above
 * all, is never written over.
 */
static int make_overlay(struct hq_disk *d, const char *dir, const char *tag, uid_t uid,
			gid_t gid, char *err, size_t errlen)
{
	char base[HQ_PATH_MAX], stem[256], size[32];
	/* A copy brought from a store is a self-contained qcow2, wherever it is. */
	const char *below = d->local[0] ? d->local : d->image;
	const char *fmt = d->local[0] ? "qcow2" : d->format;
	const char *slash = strrchr(d->image, '/'), *bslash = strrchr(below, '/'), *dot;
	int fd = -1, ret;

	if (dir)
		snprintf(base, sizeof(base), "%s", dir);
	else
		snprintf(base, sizeof(base), "%.*s", (int)(bslash - below), below);
	snprintf(stem, sizeof(stem), "%s", slash + 1);
	dot = strrchr(stem, '.');
	if (dot && dot != stem)
		stem[dot - stem] = '\0';
	for (int i = 0; i < 100 && fd < 0; i++) {
		if (i)
			ret = snprintf(d->overlay, sizeof(d->overlay), "%s/%s.%s-%d.qcow2", base,
				       stem, tag, i);
		else
			ret = snprintf(d->overlay, sizeof(d->overlay), "%s/%s.%s.qcow2", base, stem,
				       tag);
		if (ret >= (int)sizeof(d->overlay))
			return seterr(err, errlen, -ENAMETOOLONG, "disk %s: overlay name too long",
				      d->name);
		fd = open(d->overlay, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0 && errno != EEXIST)
			return seterr(err, errlen, -errno, "disk %s: cannot create its overlay %s: "
				      "%s%s", d->name, d->overlay, strerror(errno),
				      dir ? "" : " (--disk-dir DIR puts overlays elsewhere)");
	}
	if (fd < 0)
		return seterr(err, errlen, -EEXIST, "disk %s: no free overlay name like %s",
			      d->name, d->overlay);
	d->overlay_made = true;
	/* QEMU opens it: a QEMU that runs as another user (libvirt's) must be able to. */
	if (uid != (uid_t)-1 && fchown(fd, uid, gid)) {
		ret = -errno;
		close(fd);
		return seterr(err, errlen, ret, "disk %s: giving its overlay %s to QEMU's user "
			      "%d: %s", d->name, d->overlay, (int)uid, strerror(-ret));
	}
	close(fd);
	snprintf(size, sizeof(size), "%" PRIu64, d->vsize);
	ret = halite_run((char *const[]){ "qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b",
				   (char *)below, "-F", (char *)fmt, d->overlay, size, NULL },
			 NULL, 0, err, errlen);
	if (ret) {
		char why[512];

		snprintf(why, sizeof(why), "%s", err);
		return seterr(err, errlen, ret, "disk %s: making its overlay %s: %s", d->name,
			      d->overlay, why);
	}
	return 0;
}

int hq_disks_prepare(struct hq_vm *vm, struct hq_disks *ds, const char *dir, const char *tag,
		     char *err, size_t errlen)
{
	struct hq_proc_status qs;
	uid_t uid = (uid_t)-1;
	gid_t gid = (gid_t)-1;
	int ret = 0;

	/* QEMU opens the overlays: they go to its user (libvirt's), not root. */
	if (!hq_proc_status(vm->pid, &qs) && qs.euid != geteuid())
		uid = qs.euid, gid = qs.egid;
	ret = hq_disks_writable(ds) ? libvirt_domain(vm->pid, ds, err, errlen) : 0;
	for (int i = 0; i < ds->n && !ret && ds->libvirt[0]; i++)
		if (!ds->d[i].ro && !ds->d[i].target[0])
			ret = seterr(err, errlen, -ENOTSUP, "disk %s (%s) is not one of libvirt "
				     "domain %s's disks, which are frozen through libvirt: add it in "
				     "the domain's XML, or --no-disks to save memory only",
				     ds->d[i].name, ds->d[i].image, ds->libvirt);

	for (int i = 0; i < ds->n && !ret; i++) {
		struct hq_disk *d = &ds->d[i];
		struct stat st;

		if (d->ro)
			continue;
		if (stat(d->image, &st) || !S_ISREG(st.st_mode))
			ret = seterr(err, errlen, -ENOTSUP, "disk %s: its image %s is %s: only "
				     "image files can be frozen; use --no-disks to save memory only",
				     d->name, d->image, S_ISBLK(st.st_mode) ? "a block device" :
				     "not a regular file");
		else if (qom_bool(vm, d->qdev, "share-rw"))
			ret = seterr(err, errlen, -ENOTSUP, "disk %s is shared (share-rw=on): "
				     "another VM may write it, so it cannot be frozen; use "
				     "--no-disks to save memory only", d->name);
		for (int j = 0; j < i && !ret; j++)
			if (!ds->d[j].ro && !strcmp(ds->d[j].image, d->image))
				ret = seterr(err, errlen, -ENOTSUP, "disks %s and %s write the same "
					     "image %s", ds->d[j].name, d->name, d->image);
	}
	for (int i = 0; i < ds->n && !ret; i++) {
		struct hq_disk *d = &ds->d[i];

		if (d->ro)
			continue;
		/* A node name: a letter first, then letters, digits, '-', '.', '_'; 31 at most. */
		snprintf(d->overlay_node, sizeof(d->overlay_node), "halite-%lld-%d",
			 (long long)time(NULL), i);
		ret = make_overlay(d, dir, tag, uid, gid, err, errlen);
	}
	if (ret)
		hq_disks_discard(ds);
	return ret;
}

/*
 * libvirt's disks, frozen through libvirt (an external disk-only snapshot
 * onto our overlays, no snapshot metadata): libvirt then knows the guest's
 * disk is the overlay, in its live and its persistent definition, so a
 * later start of the domain does not write the frozen image. About 30 ms.
 */
static int libvirt_freeze(struct hq_vm *vm, struct hq_disks *ds, char *err, size_t errlen)
{
	char *argv[16 + 2 * HQ_MAX_DISKS], spec[HQ_MAX_DISKS][HQ_PATH_MAX + 64], why[512];
	struct hq_disks *now;
	int n = 0, ret;

	argv[n++] = "virsh";
	argv[n++] = "-q";
	argv[n++] = "-c";
	argv[n++] = ds->libvirt_uri;
	argv[n++] = "snapshot-create-as";
	argv[n++] = "--domain";
	argv[n++] = ds->libvirt;
	argv[n++] = "--disk-only";
	argv[n++] = "--reuse-external";
	argv[n++] = "--no-metadata";
	argv[n++] = "--atomic";
	for (int i = 0; i < ds->n; i++) {
		const struct hq_disk *d = &ds->d[i];

		if (!d->target[0])
			continue;
		if (d->ro)
			snprintf(spec[i], sizeof(spec[i]), "%s,snapshot=no", d->target);
		else
			snprintf(spec[i], sizeof(spec[i]), "%s,snapshot=external,file=%s", d->target,
				 d->overlay);
		argv[n++] = "--diskspec";
		argv[n++] = spec[i];
	}
	argv[n] = NULL;
	ret = halite_run(argv, NULL, 0, why, sizeof(why));
	if (ret)
		return seterr(err, errlen, ret, "freezing the disks through libvirt (virsh "
			      "snapshot-create-as --disk-only --reuse-external): %s", why);
	/* What QEMU says now: each frozen disk on its overlay. */
	now = calloc(1, sizeof(*now));
	if (!now)
		return seterr(err, errlen, -ENOMEM, "out of memory");
	ret = hq_disks_query(vm, now, err, errlen);
	for (int i = 0; i < ds->n && !ret; i++) {
		const struct hq_disk *d = &ds->d[i];

		for (int j = 0; j < now->n && !d->ro; j++)
			if (!strcmp(now->d[j].qdev, d->qdev) && strcmp(now->d[j].image, d->overlay))
				ret = seterr(err, errlen, -EPROTO, "libvirt froze disk %s, but QEMU "
					     "writes %s, not the overlay %s", d->name,
					     now->d[j].image, d->overlay);
	}
	free(now);
	return ret;
}

int hq_disks_freeze(struct hq_vm *vm, struct hq_disks *ds, char *err, size_t errlen)
{
	cJSON *args, *actions;
	int ret;

	if (ds->libvirt[0]) {
		ret = libvirt_freeze(vm, ds, err, errlen);
		if (ret)
			return ret;
		goto frozen;
	}
	args = cJSON_CreateObject();
	actions = cJSON_AddArrayToObject(args, "actions");

	for (int i = 0; i < ds->n; i++) {
		const struct hq_disk *d = &ds->d[i];
		cJSON *a, *data;

		if (d->ro)
			continue;
		a = cJSON_CreateObject();
		cJSON_AddStringToObject(a, "type", "blockdev-snapshot-sync");
		data = cJSON_AddObjectToObject(a, "data");
		cJSON_AddStringToObject(data, "node-name", d->node);
		cJSON_AddStringToObject(data, "snapshot-file", d->overlay);
		cJSON_AddStringToObject(data, "snapshot-node-name", d->overlay_node);
		cJSON_AddStringToObject(data, "format", "qcow2");
		cJSON_AddStringToObject(data, "mode", "existing");
		cJSON_AddItemToArray(actions, a);
	}
	ret = hq_qmp_call(vm->qmp, "transaction", args, NULL, HQ_QMP_TIMEOUT_MS);
	if (ret)
		return seterr(err, errlen, ret, "freezing the disks (transaction of "
			      "blockdev-snapshot-sync): %s", hq_qmp_errmsg(vm->qmp));
frozen:
	for (int i = 0; i < ds->n; i++) {
		struct hq_disk *d = &ds->d[i];
		struct stat st;

		if (d->ro)
			continue;
		d->frozen = true;
		if (stat(d->image, &st))
			return seterr(err, errlen, -errno, "frozen image %s: %s", d->image,
				      strerror(errno));
		d->st_dev = st.st_dev;
		d->st_ino = st.st_ino;
		d->st_size = (uint64_t)st.st_size;
		d->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	}
	return 0;
}

/* The status of job @id (query-jobs), "" once it is gone, into @buf; 0 or -errno. */
static int job_status(struct hq_vm *vm, const char *id, char *buf, size_t len, char *jerr,
		      size_t jerrlen)
{
	cJSON *jobs = NULL, *j;
	int ret = hq_qmp_call(vm->qmp, "query-jobs", NULL, &jobs, HQ_QMP_TIMEOUT_MS);

	buf[0] = '\0';
	if (ret)
		return ret;
	cJSON_ArrayForEach(j, jobs)
		if (!strcmp(jstr(j, "id"), id)) {
			snprintf(buf, len, "%s", jstr(j, "status"));
			snprintf(jerr, jerrlen, "%s", jstr(j, "error"));
		}
	cJSON_Delete(jobs);
	return 0;
}

/* Wait until job @id is in @want ("" gone); 0, -ETIMEDOUT, or -EIO with its error. */
static int job_wait(struct hq_vm *vm, const char *id, const char *want, char *jerr, size_t len)
{
	char st[32];

	for (uint64_t end = hq_now_ns() + JOB_TIMEOUT_MS * 1000000ull; hq_now_ns() < end;) {
		int ret = job_status(vm, id, st, sizeof(st), jerr, len);

		if (ret)
			return ret;
		if (!strcmp(st, want))
			return 0;
		if (jerr[0] || (want[0] && !st[0]))
			return -EIO;
		usleep(10000);
	}
	return -ETIMEDOUT;
}

/*
 * An active commit of @d's overlay into its image (the node below it, not
 * further down: that would write the image an earlier snapshot froze), then
 * the pivot back to it.
 */
static int commit_back(struct hq_vm *vm, const struct hq_disk *d, int i, char *jerr, size_t len)
{
	cJSON *args = cJSON_CreateObject();
	char id[64];
	int ret;

	snprintf(id, sizeof(id), "halite-thaw-%d", i);
	cJSON_AddStringToObject(args, "job-id", id);
	cJSON_AddStringToObject(args, "device", d->overlay_node);
	/* Into the image right below, the frozen one: by default QEMU goes to the bottom. */
	cJSON_AddStringToObject(args, "base-node", d->node);
	ret = hq_qmp_call(vm->qmp, "block-commit", args, NULL, HQ_QMP_TIMEOUT_MS);
	if (ret) {
		snprintf(jerr, len, "block-commit: %s", hq_qmp_errmsg(vm->qmp));
		return ret;
	}
	ret = job_wait(vm, id, "ready", jerr, len);
	if (!ret) {
		args = cJSON_CreateObject();
		cJSON_AddStringToObject(args, "id", id);
		ret = hq_qmp_call(vm->qmp, "job-complete", args, NULL, HQ_QMP_TIMEOUT_MS);
		if (ret)
			snprintf(jerr, len, "job-complete: %s", hq_qmp_errmsg(vm->qmp));
	}
	if (!ret)
		ret = job_wait(vm, id, "", jerr, len);
	return ret;
}

int hq_disks_thaw(struct hq_vm *vm, struct hq_disks *ds, char *err, size_t errlen)
{
	int ret = 0;

	err[0] = '\0';
	for (int i = 0; i < ds->n; i++) {
		struct hq_disk *d = &ds->d[i];
		char jerr[512] = "";
		size_t l = strlen(err);
		int r;

		if (!d->frozen)
			continue;
		if (ds->libvirt[0])
			r = halite_run((char *const[]){ "virsh", "-q", "-c", ds->libvirt_uri, "blockcommit",
						 ds->libvirt, d->target, "--active", "--shallow",
						 "--pivot", "--wait", "--timeout", "60", NULL },
				       NULL, 0, jerr, sizeof(jerr));
		else
			r = commit_back(vm, d, i, jerr, sizeof(jerr));
		if (r) {
			/* The guest writes there still: the overlay stays, and the message says where. */
			snprintf(err + l, errlen - l, "%sdisk %s still writes to %s (%s)",
				 l ? "; " : "", d->name, d->overlay, jerr[0] ? jerr : strerror(-r));
			d->overlay_made = false;
			ret = ret ? ret : r;
			continue;
		}
		d->frozen = false;
	}
	hq_disks_discard(ds);
	return ret;
}

void hq_disks_discard(struct hq_disks *ds)
{
	for (int i = 0; i < ds->n; i++) {
		struct hq_disk *d = &ds->d[i];

		if (d->overlay_made && !d->frozen)
			unlink(d->overlay);
		d->overlay_made = false;
	}
}

char *hq_disks_record(const struct hq_disks *ds)
{
	cJSON *a = cJSON_CreateArray();
	char *s;

	for (int i = 0; i < ds->n; i++) {
		const struct hq_disk *d = &ds->d[i];
		cJSON *o = cJSON_CreateObject(), *chain;

		cJSON_AddStringToObject(o, "device", d->device);
		cJSON_AddStringToObject(o, "qdev", d->qdev);
		cJSON_AddStringToObject(o, "node", d->node);
		cJSON_AddStringToObject(o, "image", d->image);
		cJSON_AddStringToObject(o, "format", d->format);
		cJSON_AddNumberToObject(o, "virtual_size", (double)d->vsize);
		cJSON_AddBoolToObject(o, "read_only", d->ro);
		cJSON_AddBoolToObject(o, "frozen", d->frozen);
		chain = cJSON_AddArrayToObject(o, "chain");
		for (int j = 0; j < d->nchain; j++)
			cJSON_AddItemToArray(chain, cJSON_CreateString(d->chain[j]));
		if (d->frozen) {
			char v[48];

			/* Exact: 64-bit numbers as strings (a JSON number is a double). */
			snprintf(v, sizeof(v), "%" PRIu64, d->st_size);
			cJSON_AddStringToObject(o, "size", v);
			snprintf(v, sizeof(v), "%" PRId64, d->mtime_ns);
			cJSON_AddStringToObject(o, "mtime_ns", v);
			snprintf(v, sizeof(v), "%" PRIu64, d->st_ino);
			cJSON_AddStringToObject(o, "ino", v);
			cJSON_AddStringToObject(o, "source_overlay", d->overlay);
		}
		cJSON_AddItemToArray(a, o);
	}
	s = cJSON_PrintUnformatted(a);
	cJSON_Delete(a);
	return s;
}

int hq_disks_parse(const char *json, struct hq_disks *ds, char *err, size_t errlen)
{
	cJSON *a = cJSON_Parse(json), *o;
	int ret = 0;

	memset(ds, 0, sizeof(*ds));
	if (!cJSON_IsArray(a)) {
		cJSON_Delete(a);
		return seterr(err, errlen, -EPROTO, "the file's qemu.disks is not a JSON array");
	}
	cJSON_ArrayForEach(o, a) {
		struct hq_disk *d;
		const cJSON *c;

		if (ds->n == HQ_MAX_DISKS) {
			ret = seterr(err, errlen, -E2BIG, "the file records more than %d disks",
				     HQ_MAX_DISKS);
			break;
		}
		d = &ds->d[ds->n++];
		snprintf(d->device, sizeof(d->device), "%s", jstr(o, "device"));
		snprintf(d->qdev, sizeof(d->qdev), "%s", jstr(o, "qdev"));
		snprintf(d->node, sizeof(d->node), "%s", jstr(o, "node"));
		snprintf(d->image, sizeof(d->image), "%s", jstr(o, "image"));
		snprintf(d->format, sizeof(d->format), "%s", jstr(o, "format"));
		hq_disk_name(d);
		d->vsize = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o,
											  "virtual_size"));
		d->ro = jbool(o, "read_only");
		d->frozen = jbool(o, "frozen");
		d->st_size = strtoull(jstr(o, "size"), NULL, 10);
		d->mtime_ns = strtoll(jstr(o, "mtime_ns"), NULL, 10);
		d->st_ino = strtoull(jstr(o, "ino"), NULL, 10);
		cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(o, "chain"))
			if (d->nchain < HQ_MAX_CHAIN && cJSON_GetStringValue(c))
				snprintf(d->chain[d->nchain++], HQ_PATH_MAX, "%s",
					 cJSON_GetStringValue(c));
		if (d->frozen && (d->image[0] != '/' || !d->vsize || !d->format[0])) {
			ret = seterr(err, errlen, -EPROTO, "the file's record of disk %s is "
				     "incomplete", d->name);
			break;
		}
	}
	cJSON_Delete(a);
	return ret;
}

int hq_disks_check_frozen(const struct hq_disks *ds, char *err, size_t errlen)
{
	for (int i = 0; i < ds->n; i++) {
		const struct hq_disk *d = &ds->d[i];
		struct stat st;

		if (!d->frozen || d->local[0])
			continue;
		if (stat(d->image, &st))
			return seterr(err, errlen, -errno, "disk %s: its frozen image %s: %s",
				      d->name, d->image, strerror(errno));
		/* The inode may change (a copy, a restore from backup): the content may not. */
		if ((uint64_t)st.st_size != d->st_size ||
		    (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec != d->mtime_ns)
			return seterr(err, errlen, -ESTALE, "disk %s: its frozen image %s was "
				      "written after the snapshot (size or modification time "
				      "differ): the guest's memory would not match its disk",
				      d->name, d->image);
	}
	return 0;
}

int hq_disks_make_overlays(struct hq_disks *ds, const char *dir, const char *tag, char *err,
			   size_t errlen)
{
	int ret = 0;

	for (int i = 0; i < ds->n && !ret; i++)
		if (ds->d[i].frozen)
			ret = make_overlay(&ds->d[i], dir, tag, (uid_t)-1, (gid_t)-1, err, errlen);
	if (ret)
		hq_disks_remove_overlays(ds);
	return ret;
}

void hq_disks_remove_overlays(struct hq_disks *ds)
{
	for (int i = 0; i < ds->n; i++)
		if (ds->d[i].overlay_made) {
			unlink(ds->d[i].overlay);
			ds->d[i].overlay_made = false;
		}
}

int hq_disks_verify(struct hq_vm *vm, const struct hq_disks *ds, char *err, size_t errlen)
{
	struct hq_disks *now = calloc(1, sizeof(*now));
	int ret;

	if (!now)
		return seterr(err, errlen, -ENOMEM, "out of memory");
	ret = hq_disks_query(vm, now, err, errlen);
	for (int i = 0; i < ds->n && !ret; i++) {
		const struct hq_disk *d = &ds->d[i], *n = NULL;

		if (!d->frozen)
			continue;
		for (int j = 0; j < now->n && !n; j++)
			if (!strcmp(now->d[j].qdev, d->qdev))
				n = &now->d[j];
		if (!n)
			ret = seterr(err, errlen, -ENODEV, "disk %s of the snapshot is not in this "
				     "QEMU: give the same disks as at save", d->name);
		else if (n->ro || strcmp(n->image, d->overlay) || !n->nchain ||
			 strcmp(n->chain[0], d->local[0] ? d->local : d->image))
			ret = seterr(err, errlen, -EPROTO, "disk %s runs on %s, not on a new "
				     "overlay of the frozen image %s", d->name, n->image,
				     d->local[0] ? d->local : d->image);
	}
	free(now);
	return ret;
}
