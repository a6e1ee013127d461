/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu's QEMU library, private: a running QEMU as halite-qemu sees it
 * (vm.c): its process, vCPUs and guest RAM, found through QMP and /proc.
 */
#ifndef HALITE_QEMU_VM_H
#define HALITE_QEMU_VM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "base.h"
#include "qmp.h"

/* One piece of guest RAM as a halite region: a contiguous run of a RAM block. */
struct hq_region {
	char name[96];	     /* "mem0", or "mem0@0x80000000" for a later piece */
	char block[64];	     /* the RAM block (QEMU's idstr: the memory backend's id) */
	uint64_t gpa;	     /* guest-physical base of the piece */
	uint64_t offset;     /* offset in the RAM block */
	uint64_t length;
	uint64_t host;	     /* address in QEMU */
	uint64_t page_size;  /* the block's page size (4 KiB, or huge) */
	int fd;		     /* the backing file, opened through /proc/PID/map_files */
	uint64_t fd_offset;
	bool hugetlb;
	bool anon;	     /* private anonymous memory of QEMU (-m alone, memory-backend-ram):
			      no file, fd -1 */
};

/*
 * Device RAM: a RAM block of QEMU's outside the memory backends that the
 * guest writes, video memory in practice (vga.vram). Saved as a copy taken
 * in the pause, restored by writing it into the new QEMU before it runs.
 */
struct hq_devram {
	char name[64];	 /* the RAM block, and its region in the file: "0000:00:01.0/vga.vram" */
	uint64_t gpa;	 /* where the guest sees it (the VGA's BAR) */
	uint64_t length;
	uint64_t host;	 /* its address in QEMU */
};

struct hq_vm {
	struct hq_qmp *qmp;
	pid_t pid;
	int major, minor, micro;
	char machine[64]; /* "pc-q35-7.2" */
	uint32_t nvcpus;
	pid_t vcpu_tids[HQ_MAX_VCPUS];
	uint32_t nregions;
	struct hq_region regions[HQ_MAX_REGIONS];
	uint32_t ndevram;
	struct hq_devram devram[HQ_MAX_DEVRAM];
	char devram_skipped[512]; /* device RAM that cannot be saved: "NAME: why; ..." */
	/*
	 * The run state QEMU's last answer to stop, cont or query-status gave:
	 * 1 running, -1 paused, 0 unknown (no answer, or another state).
	 */
	int run_seen;
	/* A save of private RAM: its record (hq_aside_record_*), or -1. */
	int aside_fd;
	/* hq_vm_ram() finds the RAM and opens nothing (a take-over has it open). */
	bool ram_find_only;
	char err[1024];
	/* QEMU's own words for a failure it reported outside a QMP error reply (a failed load). */
	char qemu_err[512];
};

/* --- vm.c --- */

/*
 * Connect to QEMU's QMP socket and learn the process, version, machine type
 * and vCPU threads. @need lists QMP commands that must exist (NULL-ended).
 * Returns 0, -HALITE_E_UNSUPPORTED when QEMU is too old or lacks a command,
 * or -errno; vm->err says what.
 */
int hq_vm_attach(struct hq_vm *vm, const char *qmp_path, int timeout_ms,
		 const char *const *need);
/* Refresh vm->vcpu_tids (query-cpus-fast). */
int hq_vm_vcpus(struct hq_vm *vm);
/*
 * Find the guest's RAM: every memory backend's RAM block, split by where
 * the guest sees it (info mtree -f), each piece checked to be a shared
 * mapping in QEMU and its file opened. -EINVAL when RAM is private (not a
 * shared backend), with the fix in vm->err.
 */
int hq_vm_ram(struct hq_vm *vm);
/*
 * Find the device RAM (hq_devram) where the guest sees it now: QEMU's RAM
 * blocks outside the memory backends that are writable RAM in its
 * guest-physical map (info mtree -f), each with its host address (gpa2hva).
 * A block found but not usable is named in vm->devram_skipped; memory the
 * guest cannot reach now (a BAR it switched off, or not yet programmed
 * before the device state is loaded) is not found.
 */
int hq_vm_device_ram(struct hq_vm *vm);
/* The used length of QEMU's RAM block @name (info ramblock); -ENOENT if none. */
int hq_vm_ramblock(struct hq_vm *vm, const char *name, uint64_t *length);
/*
 * QEMU's [@host, @host + @len) into @dst (ours, fresh: reads as zeros),
 * page-aligned: only the pages QEMU has (present or swapped: its pagemap),
 * so the pages it never touched stay holes in @dst. *copied: bytes read.
 */
int hq_vm_read_pages(struct hq_vm *vm, uint64_t host, uint64_t len, uint8_t *dst,
		     uint64_t *copied);
/*
 * Before hq_vm_read_pages() into @dst: populate the pages of @dst that QEMU
 * has now, so that the read, in the pause, only copies (faulting fresh
 * pages of ours in would double its time). Best effort: 0 or -errno.
 */
int hq_vm_prefault_pages(struct hq_vm *vm, uint64_t host, uint64_t len, uint8_t *dst);
/*
 * @src over QEMU's [@host, @host + @len): the pages @src has (mincore) and
 * those QEMU has (pagemap), so that QEMU's range then reads exactly as
 * @src, pages neither has left alone. *written: bytes written.
 */
int hq_vm_write_pages(struct hq_vm *vm, uint64_t host, uint64_t len, const uint8_t *src,
		      uint64_t *written);
/*
 * Before a save touches QEMU: -EBUSY when a userfaultfd already has some of
 * the guest's RAM (a save or restore of it running: /proc/PID/smaps), and
 * -HALITE_E_UNSUPPORTED when RAM on hugetlbfs meets a device that gives
 * memory back (virtio-balloon, virtio-mem): hugetlbfs can neither refuse
 * the holes they punch nor tell them. vm->err says which.
 */
int hq_vm_check_saveable(struct hq_vm *vm);
/*
 * A device of this QEMU that gives guest memory back by punching holes in
 * the RAM's file ("virtio-balloon", "virtio-mem"), or NULL.
 */
const char *hq_vm_discard_device(struct hq_vm *vm);
/* Close what hq_vm_ram() and hq_vm_attach() opened. */
void hq_vm_release(struct hq_vm *vm);
/*
 * The vCPUs' page-table roots now (info registers -a): those in 64-bit
 * long mode with paging. Returns how many were written to roots (at most
 * max), or < 0.
 */
int hq_vm_roots(struct hq_vm *vm, struct halite_root *roots, uint32_t max);
/*
 * The QMP unix sockets on QEMU's command line (-qmp unix:PATH, or -chardev
 * socket,path=PATH with -mon mode=control), last first (halite-qemu
 * restore adds its own last). Up to @max paths of @len bytes; how many.
 */
int hq_qmp_sockets(pid_t pid, char (*paths)[108], int max);
/*
 * Open RAM piece @g of QEMU (@vm->pid; g->name, block, host, length,
 * page_size, anon set): check its mapping and open its file
 * (/proc/PID/map_files) into g->fd, g->fd_offset; nothing to open for
 * private RAM. 0 or -errno with vm->err.
 */
int hq_region_open(struct hq_vm *vm, struct hq_region *g);
/* vm->err, printf-style. */
void hq_vmsetf(struct hq_vm *vm, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
