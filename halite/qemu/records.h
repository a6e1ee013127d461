/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu's QEMU library, private: the records it keeps in HQ_ASIDE_DIR
 * and the clean-up of what killed runs left (records.c).
 */
#ifndef HALITE_QEMU_RECORDS_H
#define HALITE_QEMU_RECORDS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Where the records of saves (qemu-PID.save) and restores (qemu-PID.restore) are. */
#define HQ_ASIDE_DIR "/run/halite-qemu"
/* Its path for QEMU @pid in @buf; whether it exists. */
bool hq_aside_record_path(pid_t pid, char *buf, size_t len);
/* Remove the records (.save, .restore) of QEMUs that are gone. */
void hq_records_prune(void);
/*
 * Remove the work directories (/tmp/halite-qemu.XXXXXX) a halite-qemu left
 * behind when it was killed: those untouched for HQ_TMPDIR_STALE_S whose
 * QEMU no longer listens on their qmp.sock (or that never had one).
 */
#define HQ_TMPDIR_STALE_S 300
void hq_tmpdirs_prune(void);

#endif
