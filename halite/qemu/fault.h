/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu's QEMU library, private: test fault points (fault.c), off
 * unless HALITE_QEMU_TEST_FAULT names one.
 */
#ifndef HALITE_QEMU_FAULT_H
#define HALITE_QEMU_FAULT_H

#include <stdbool.h>
#include <stddef.h>

#include "vm.h"

/* Read HALITE_QEMU_TEST_FAULT; -EINVAL with @err for a name that is none. */
int hq_fault_init(char *err, size_t len);
/* Whether the fault point @name is set and has not fired yet; it fires now. */
bool hq_fault(const char *name);
/* As hq_fault() for a point with a time (NAME:MS): its MS when it fires now, else 0. */
unsigned hq_fault_ms(const char *name);
/* stop or cont as a fault point has it: true when it took over (*ret, vm->err). */
bool hq_fault_runstate(struct hq_vm *vm, const char *cmd, int *ret);
/* Before exit: a QEMU stopped by a fault point has been let go. */
void hq_fault_end(void);

#endif
