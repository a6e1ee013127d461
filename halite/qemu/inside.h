/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu's QEMU library, private: what is done inside a running QEMU
 * through ptrace (inside.c).
 */
#ifndef HALITE_QEMU_INSIDE_H
#define HALITE_QEMU_INSIDE_H

#include <stdbool.h>
#include <stdint.h>

#include "vm.h"

/*
 * A userfaultfd created inside QEMU (ptrace), brought here; returns it (or
 * < 0). With @remote, QEMU keeps its copy and *remote gets its number;
 * without, QEMU's copy is closed at once.
 */
int hq_vm_uffd(struct hq_vm *vm, int *remote);
/*
 * The userfaultfd QEMU holds (a restore's, whose handler died), brought
 * here; returns it (or < 0) and its number in QEMU in *remote. -ENOENT when
 * QEMU holds none, -EEXIST when it holds more than one (vm->err says).
 */
int hq_vm_find_uffd(struct hq_vm *vm, int *remote);
/* Close QEMU's copy of a descriptor injected earlier. */
int hq_vm_close_remote(struct hq_vm *vm, int remote);
/* halite_drop_ptes_fn for QEMU: madvise(MADV_DONTNEED) injected into it. */
int hq_drop_ptes(void *vm, uint64_t addr, uint64_t len);
/*
 * halite_remap_fn and halite_unmap_fn for QEMU: mremap and munmap injected
 * into it. A move aside is written to the save's record first thing (see
 * below).
 */
int hq_remap(void *vm, uint64_t addr, uint64_t len, uint64_t to, uint64_t *res);
int hq_unmap(void *vm, uint64_t addr, uint64_t len);

/*
 * The record of a save of private RAM, HQ_ASIDE_DIR/qemu-PID.save: the run
 * state the guest had, and where each range's pages went inside QEMU, so
 * that 'save --recover' can give them back should the save die halfway
 * (QEMU's threads block meanwhile: it keeps the userfaultfd). Created before
 * the pause, removed once the save has let go of QEMU.
 */
int hq_aside_record_create(struct hq_vm *vm, bool running);
void hq_aside_record_remove(struct hq_vm *vm);

#endif
