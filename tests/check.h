/* SPDX-License-Identifier: MIT */
/*
 * The plain test programs (tests/qemu, tests/reliability): CHECK(cond, fmt,
 * ...) prints a failure with its place and goes on; main() ends with
 * check_result().
 */
#ifndef HALITE_TESTS_CHECK_H
#define HALITE_TESTS_CHECK_H

#include <stdio.h>

static int check_failures;

#define CHECK(cond, ...)                                                               \
	do {                                                                           \
		if (!(cond)) {                                                         \
			printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);        \
			printf(__VA_ARGS__);                                           \
			printf("\n");                                                  \
			check_failures++;                                              \
		}                                                                      \
	} while (0)

/* PASS or FAIL on stdout; the exit status. */
static inline int check_result(void)
{
	printf("%s\n", check_failures ? "FAIL" : "PASS");
	return check_failures ? 1 : 0;
}

#endif
