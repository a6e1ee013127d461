/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu, private: the guest's disks, frozen with its memory.
 *
 * A memory snapshot restores only with the disk as it was at the same
 * instant. In the save's pause every writable disk is frozen with QEMU's own
 * external snapshot: a qcow2 overlay, made beforehand with qemu-img, takes
 * the guest's writes from then on (one QMP transaction of
 * blockdev-snapshot-sync, all disks or none), and the image below it, the
 * frozen image, is never written again. The file records each frozen image
 * (metadata qemu.disks, JSON). Each restore runs the guest on a fresh
 * overlay of its frozen image, made here too, so that a snapshot restores
 * any number of times while its source runs on.
 */
#ifndef HALITE_QEMU_DISKS_H
#define HALITE_QEMU_DISKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

struct hq_vm;

#define HQ_MAX_DISKS 32
#define HQ_MAX_CHAIN 16	  /* images below a disk's top one */
#define HQ_PATH_MAX 1024

struct hq_disk {
	char device[64];	/* BlockBackend name (-drive id), "" with -blockdev */
	char qdev[256];		/* the guest device: its id or QOM path */
	char name[256];		/* for people: the drive's id, the device's, or its node */
	char node[64];		/* the node QEMU writes (the top of the image chain) */
	char image[HQ_PATH_MAX]; /* its file, absolute */
	char format[32];	/* "qcow2", "raw", ... */
	uint64_t vsize;		/* virtual size, bytes */
	bool ro;		/* read-only (-drive readonly=on, a CD-ROM): never frozen */
	/* The images below it (its backing chain), absolute, top down. */
	int nchain;
	char chain[HQ_MAX_CHAIN][HQ_PATH_MAX];
	/* Frozen: the overlay the guest writes to from the snapshot on. */
	char overlay[HQ_PATH_MAX];
	char overlay_node[64];
	char target[32];	/* libvirt's name for it (vda), under libvirt */
	bool overlay_made, frozen;
	/*
	 * The frozen image's copy on this host when it is not at @image: one
	 * self-contained qcow2 brought from an object store (diskfetch.h),
	 * checked there. Overlays are made on it; @image and @chain stay the
	 * saving host's, for the command line's disk to be found by them.
	 */
	char local[HQ_PATH_MAX];
	/* The frozen image as it was once frozen: a restore checks it is unchanged. */
	uint64_t st_dev, st_ino, st_size;
	int64_t mtime_ns;
};

struct hq_disks {
	int n;
	struct hq_disk d[HQ_MAX_DISKS];
	/*
	 * Under libvirt: the domain's uuid and the connection. libvirt keeps
	 * its own view of the disks, so they are frozen (and thawed) through
	 * it, never behind its back.
	 */
	char libvirt[40];
	char libvirt_uri[128];
};

/*
 * QEMU's disks (query-block): every device with an image inserted, its
 * chain resolved against QEMU's working directory. 0 or -errno with the
 * reason in @err.
 */
int hq_disks_query(struct hq_vm *vm, struct hq_disks *ds, char *err, size_t errlen);
/* How many of @ds a save freezes (writable ones). */
int hq_disks_writable(const struct hq_disks *ds);
/*
 * Before the guest is touched: every writable disk can be frozen (a regular
 * file, not shared with another VM or device, not encrypted) and its
 * overlay made (qemu-img create, in @dir or beside the image, named after
 * @tag). 0 or -errno with the disk and the reason in @err; overlays made
 * so far are removed on failure.
 */
int hq_disks_prepare(struct hq_vm *vm, struct hq_disks *ds, const char *dir, const char *tag,
		     char *err, size_t errlen);
/*
 * In the pause: the guest's writes go to the overlays from now on, all
 * disks or none (one QMP transaction); each frozen image's identity is
 * taken for restores to check. 0 or -errno with @err.
 */
int hq_disks_freeze(struct hq_vm *vm, struct hq_disks *ds, char *err, size_t errlen);
/*
 * Undo a freeze (the save failed): each overlay's writes go back into the
 * image below (an active block-commit, then a pivot), and the overlays are
 * removed; then overlays made but unused are removed. 0, or -errno with
 * @err naming the overlays the guest still writes to.
 */
int hq_disks_thaw(struct hq_vm *vm, struct hq_disks *ds, char *err, size_t errlen);
/* Remove the overlays made (none in use). */
void hq_disks_discard(struct hq_disks *ds);
/* The file's record of frozen disks (metadata qemu.disks): a JSON array, malloc'd. */
char *hq_disks_record(const struct hq_disks *ds);

/* --- restore --- */

/* The record back (hq_disks_record()). 0 or -errno with @err. */
int hq_disks_parse(const char *json, struct hq_disks *ds, char *err, size_t errlen);
/*
 * Every frozen image is as it was frozen (size, modification time). -ESTALE
 * if not. A disk with a local copy (d->local) is not looked at: its copy was
 * checked when brought.
 */
int hq_disks_check_frozen(const struct hq_disks *ds, char *err, size_t errlen);
/*
 * A fresh overlay of each frozen image, or of its local copy (in @dir or
 * beside the image, named after @tag), for a restore to run on. On failure
 * those made are removed.
 */
int hq_disks_make_overlays(struct hq_disks *ds, const char *dir, const char *tag, char *err,
			   size_t errlen);
void hq_disks_remove_overlays(struct hq_disks *ds);
/* @d->name from its drive id, device or node (diskargs.c). */
void hq_disk_name(struct hq_disk *d);
/* 0 if @path (absolute) is @d's frozen image, 1.. for the images below it, -1 for neither. */
int hq_disk_level(const struct hq_disk *d, const char *path);
struct hq_argv;
/*
 * The restore's command line @a (binary first; relative paths from @cwd,
 * NULL: here) pointed at each frozen disk's overlay: the topmost image of
 * the disk it names (-drive, -blockdev, -hda, ...) becomes the overlay,
 * its format qcow2 (diskargs.c). A disk with a local copy (d->local) is
 * also found by its -drive id when no image it names is the saving host's.
 * -ENOENT with @err for a frozen disk it does not name.
 */
int hq_disks_rewrite(const struct hq_disks *ds, struct hq_argv *a, const char *cwd, char *err,
		     size_t errlen);
/*
 * QEMU started: each frozen disk's device runs on its overlay, right above
 * the frozen image. 0, or -errno naming the disk that does not.
 */
int hq_disks_verify(struct hq_vm *vm, const struct hq_disks *ds, char *err, size_t errlen);

#endif
