/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu's QEMU library, private: the record a restore leaves for a
 * take-over (handoff.c).
 */
#ifndef HALITE_QEMU_HANDOFF_H
#define HALITE_QEMU_HANDOFF_H

#include <stddef.h>
#include <sys/types.h>

#include "vm.h"

/*
 * The record of a running restore, HQ_ASIDE_DIR/qemu-PID.restore
 * (handoff.c): the file, QEMU's vCPU threads and its RAM pieces as the
 * engine serves them. 'restore --attach' starts serving faults from it
 * before it asks QEMU anything: a thread of QEMU's waiting for memory may
 * hold the lock QMP needs. Written once the engine runs, removed when the
 * restore ends.
 */
int hq_handoff_write(const struct hq_vm *vm, const char *file, char *err, size_t errlen);
/*
 * QEMU @pid's record into @vm (pid, vCPU threads, regions, each opened):
 * 0; -ENOENT without one; -ESTALE if it is another file's than @file;
 * other -errno with @err.
 */
int hq_handoff_read(pid_t pid, const char *file, struct hq_vm *vm, char *err, size_t errlen);
void hq_handoff_remove(pid_t pid);

#endif
