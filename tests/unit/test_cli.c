// SPDX-License-Identifier: MIT
/* The CLI helpers every tool shares (halite/src/cli.c): numbers and sizes as people write them. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "cli.h"

static void test_u64(void **state)
{
	static const struct {
		const char *s;
		int ret;
		uint64_t v;
	} cases[] = {
		{ "0", 0, 0 },
		{ "42", 0, 42 },
		{ "010", 0, 10 }, /* no octal */
		{ "0x10", 0, 16 },
		{ "0XfF", 0, 255 },
		{ "18446744073709551615", 0, UINT64_MAX },
		{ "18446744073709551616", -EINVAL, 0 },
		{ "0x", -EINVAL, 0 },
		{ "0x-1", -EINVAL, 0 },
		{ "-1", -EINVAL, 0 },
		{ "+1", -EINVAL, 0 },
		{ " 1", -EINVAL, 0 },
		{ "1 ", -EINVAL, 0 },
		{ "12k", -EINVAL, 0 },
		{ "", -EINVAL, 0 },
	};
	(void)state;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t v = 7;

		assert_int_equal(halite_parse_u64(cases[i].s, &v), cases[i].ret);
		/* Out-parameters are written only on success. */
		assert_int_equal(v, cases[i].ret ? 7 : cases[i].v);
	}
	assert_int_equal(halite_parse_u64(NULL, &(uint64_t){ 0 }), -EINVAL);
}

static void test_u64_range(void **state)
{
	uint64_t v = 0;
	(void)state;

	assert_int_equal(halite_parse_u64_range("5", 1, 10, &v), 0);
	assert_int_equal(v, 5);
	assert_int_equal(halite_parse_u64_range("0", 1, 10, &v), -ERANGE);
	assert_int_equal(halite_parse_u64_range("11", 1, 10, &v), -ERANGE);
	assert_int_equal(halite_parse_u64_range("x", 1, 10, &v), -EINVAL);
	assert_int_equal(v, 5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_u64),
		cmocka_unit_test(test_u64_range),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
