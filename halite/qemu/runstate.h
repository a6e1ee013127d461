/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu's QEMU library, private: the guest's run state through QMP
 * (runstate.c).
 */
#ifndef HALITE_QEMU_RUNSTATE_H
#define HALITE_QEMU_RUNSTATE_H

#include <stdbool.h>
#include <stdint.h>

#include "vm.h"

/* "running", "paused", "inmigrate", ... into buf. */
int hq_vm_status(struct hq_vm *vm, char *buf, size_t len);
/* QMP stop, once (the pause of a save). 0, or < 0 with vm->err. */
int hq_vm_stop(struct hq_vm *vm, int timeout_ms);
/*
 * Bring the guest to @running ("running") or not ("paused") and confirm it
 * with query-status, within @timeout_ms, whatever became of earlier stop
 * and cont commands: query-status, then cont or stop if needed, then
 * query-status again, until it says so; a connection QEMU closed is opened
 * again. *t_changed (if given) gets when a cont or stop sent here was
 * answered. 0, or < 0 with vm->err saying what was seen last (the QMP
 * client's abort function's value ends it at once).
 */
int hq_vm_settle(struct hq_vm *vm, bool running, int timeout_ms, uint64_t *t_changed);

#endif
