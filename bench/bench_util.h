/* SPDX-License-Identifier: MIT */
/*
 * What halite-bench's commands share: argument parsing, JSON on stdout, and
 * the "machine" object every result carries.
 */
#ifndef HALITE_BENCH_UTIL_H
#define HALITE_BENCH_UTIL_H

#include <stdbool.h>
#include <stdint.h>

/* A decimal in [min, max], nothing else (no sign, no suffix). */
bool bench_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* A JSON string; NULL prints "". */
void bench_json_str(const char *s);
/* A number with @prec decimals, or null when not finite. */
void bench_json_num(double v, int prec);

/*
 * The value of "machine": {"cpu", "cores", "memory_bytes", "kernel",
 * "storage": {"dir", "device", "model", "rotational"}} for files in @dir
 * (device etc. null when @dir is not on a block device).
 */
void bench_machine_json(const char *dir);

#endif
