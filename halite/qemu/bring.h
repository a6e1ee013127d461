/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu, private: the one pipeline that brings a snapshot file into a
 * new QEMU, which restore (restore.c) and clone (clone.c) both run: the file
 * read and checked, the frozen disks given overlays, QEMU spawned paused for
 * an incoming state and attached over QMP, the machine checked to be the
 * file's, its RAM found and emptied, the device state loaded and the device
 * RAM written. Each command adds its own policy between the steps: its
 * command line, who serves the RAM (restore: the single-restore engine;
 * clone: the service's template session), and what it leaves running.
 */
#ifndef HALITE_QEMU_BRING_H
#define HALITE_QEMU_BRING_H

#include "disks.h"
#include "incoming.h"

/* One snapshot on its way into one QEMU. */
struct hq_bring {
	const char *path;	/* the snapshot file */
	struct hq_snapfile f;	/* what the file says */
	struct hq_config cfg;	/* the command line QEMU runs, its forwards, the file's record */
	struct hq_disks *disks;	/* the file's; the frozen ones each run on a new overlay */
	int ndisks;		/* frozen disks given an overlay */
	struct hq_vm vm;
	pid_t qemu;		/* 0 once it has exited (hq_qemu_attach()) */
	char *err;		/* the command's message buffer: the first failure */
	size_t errlen;
	char *qemu_err;		/* if given: QEMU's own words when its QMP error is the cause */
	size_t qemu_errlen;
};

/*
 * The file at b->path read into b->f and b->cfg; with @devram, its device
 * RAM decoded into copies of ours too. With @rd the reader is handed over
 * for the command's own records (the caller frees it), else freed. 0, or
 * < 0 with b->err.
 */
int hq_bring_read(struct hq_bring *b, bool devram, struct halite_reader **rd);
/* How many of b->disks are frozen (0 without disks). */
int hq_bring_frozen(const struct hq_bring *b);
/*
 * The frozen disks each checked unchanged and given a new overlay in @dir
 * (tagged @tag), and the command line pointed at them. 0, or < 0 with b->err.
 */
int hq_bring_disks(struct hq_bring *b, const char *dir, const char *tag);
/* QEMU as @s says (s->cfg: &b->cfg), into b->qemu. */
int hq_bring_spawn(struct hq_bring *b, const struct hq_spawn *s);
/* hq_qemu_attach() of b->vm to b->qemu's QMP socket @sock. */
int hq_bring_attach(struct hq_bring *b, const char *sock, int timeout_ms, unsigned retry_us,
		    const char *see, int (*give_up)(void *), void *ctx);
/*
 * The new QEMU is ready for the file: its devices as the file records them,
 * the overlaid disks its drives, waiting for an incoming state. 0, or < 0
 * with b->err.
 */
int hq_bring_check_incoming(struct hq_bring *b);
/* QEMU is the file's machine: the same machine type and vCPU count. */
int hq_bring_check_machine(struct hq_bring *b);
/*
 * QEMU's guest RAM found (hq_vm_ram(): set vm.ram_find_only first to open
 * nothing) and matched with the file's: the same pieces of the same lengths,
 * each named as the file names it (a renamed backend matched by where the
 * guest sees it); its device RAM blocks of the file's sizes.
 */
int hq_bring_find_ram(struct hq_bring *b);
/*
 * Nothing QEMU wrote while starting survives: a page present now would never
 * fault. Private memory and memory of a file we did not open (a clone's
 * private mapping of the template) is dropped inside QEMU, a shared backend
 * punched. Call before the RAM is registered: registered, a drop would read
 * as the guest's discard.
 */
int hq_bring_empty_ram(struct hq_bring *b);
/* The device state fed to QEMU through @dir/in.sock; hq_qemu_load_devices(). */
int hq_bring_load_devices(struct hq_bring *b, const char *dir, int timeout_ms,
			  int (*give_up)(void *), void *ctx, const char *no_reason);
/* Once loaded: the file's device RAM written over its blocks; *written: bytes. */
int hq_bring_write_devram(struct hq_bring *b, uint64_t *written);
/* Free what @b holds besides b->vm (hq_vm_release()'s). */
void hq_bring_free(struct hq_bring *b);

#endif
