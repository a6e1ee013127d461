/* SPDX-License-Identifier: MIT */
/*
 * What the QEMU library's unit tests share: a captured sample's text
 * (tests/qemu/hmp-samples/ and the like) and a command line from words.
 */
#ifndef HALITE_QEMU_TEST_H
#define HALITE_QEMU_TEST_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "vmconfig.h"

/* The text of sample @name of @dir (free() it); a missing one fails the test. */
static inline char *q_sample(const char *dir, const char *name)
{
	char path[512], *buf;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	buf = t_slurp(path, NULL);
	if (!buf) {
		printf("FAIL: %s: %s\n", path, strerror(errno));
		exit(1);
	}
	return buf;
}

/* A command line from one string, words split at spaces (none of these need quoting). */
static inline struct hq_argv q_words(const char *s)
{
	struct hq_argv a = { 0 };
	char *dup = strdup(s), *save = NULL;

	for (char *w = strtok_r(dup, " ", &save); w; w = strtok_r(NULL, " ", &save))
		hq_argv_push(&a, w);
	free(dup);
	return a;
}

#endif
