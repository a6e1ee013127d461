/* SPDX-License-Identifier: MIT */
/* Private: what the command-line tools share (halite-inspect, halite-qemu). */
#ifndef HALITE_CLI_H
#define HALITE_CLI_H

#include <stdint.h>
#include <stdio.h>

/*
 * A size: a number (decimal, 0x hex) with an optional K, M or G suffix
 * (powers of 1024; "KiB", "KB" accepted too). 0, -EINVAL when it is not
 * one, -ERANGE when it does not fit 64 bits.
 */
int halite_parse_size(const char *s, uint64_t *out);

/* @s as a JSON string, quotes included, to @f; NULL prints "". */
void halite_json_str(FILE *f, const char *s);

/* @s as one word for a POSIX shell: as it is when safe, else in single quotes. */
void halite_shell_quote(FILE *f, const char *s);

#endif
