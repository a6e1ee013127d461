/* SPDX-License-Identifier: MIT */
/*
 * halite-qemu's QEMU library, private: what all of it shares: its name in
 * messages, its limits, and the first-failure and time helpers.
 */
#ifndef HALITE_QEMU_BASE_H
#define HALITE_QEMU_BASE_H

#include <stddef.h>
#include <stdint.h>

#include <halite/halite.h>

#define PROG "halite-qemu"

/* Timeouts of QMP calls; device state and HMP are fast, migration can take a while. */
#define HQ_QMP_TIMEOUT_MS 10000
#define HQ_MAX_VCPUS 1024
#define HQ_MAX_REGIONS 64
#define HQ_MAX_DEVRAM 8

/* Record the first failure as "what: detail" in @err; returns @ret. */
int hq_fail(char *err, size_t len, int ret, const char *what, const char *detail);
/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t hq_now_ns(void);
/* @b for people, into @buf: "512 MiB", "1.4 GiB". */
char *hq_bytes(uint64_t b, char *buf, size_t len);

#endif
