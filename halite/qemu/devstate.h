/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu's QEMU library, private: QEMU's device state as a device-only
 * migration stream (devstate.c).
 */
#ifndef HALITE_QEMU_DEVSTATE_H
#define HALITE_QEMU_DEVSTATE_H

#include <stddef.h>
#include <stdint.h>

#include "vm.h"

/*
 * The device state as a device-only incoming migration stream: header,
 * CONFIGURATION (machine type), every non-RAM device section, EOF and a
 * minimal VMDESCRIPTION. Taken with xen-save-devices-state, which works
 * without Xen; call with the guest paused. *buf is malloc'd.
 */
int hq_vm_device_state(struct hq_vm *vm, uint8_t **buf, uint64_t *len);
/*
 * Check a stored device stream before loading it: the header and the
 * machine type it names. Writes the machine type to @machine.
 */
int hq_device_stream_check(const uint8_t *buf, uint64_t len, char *machine, size_t mlen,
			   char *err, size_t errlen);

#endif
