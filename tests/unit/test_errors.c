// SPDX-License-Identifier: MIT
#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <string.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <halite/errors.h>

static void test_halite_codes_distinct(void **state)
{
	int a, b;

	for (a = HALITE_E_BASE; a < HALITE_E_MAX; a++) {
		const char *s = halite_strerror(-a);

		assert_non_null(s);
		assert_true(strlen(s) > 0);
		/* Same static string whichever sign the caller passes. */
		assert_ptr_equal(s, halite_strerror(a));
		/* Every code has its own entry, not the fallback. */
		assert_string_not_equal(s, "unknown Halite error");
		assert_string_not_equal(s, "unknown error");
		for (b = HALITE_E_BASE; b < a; b++)
			assert_string_not_equal(s, halite_strerror(-b));
		/* Not mistaken for an errno description. */
		assert_string_not_equal(s, strerror(a));
	}
}

static void test_specific_messages(void **state)
{
	assert_non_null(strstr(halite_strerror(-HALITE_E_INCOMPLETE), "footer"));
	assert_non_null(strstr(halite_strerror(-HALITE_E_BAD_MAGIC), "magic"));
	assert_non_null(strstr(halite_strerror(HALITE_E_LB_CHECKSUM), "locality block"));
}

static void test_errno_matches_strerror(void **state)
{
	int e;

	/* strerror() is localized; the C locale is what strerrordesc_np gives. */
	setlocale(LC_ALL, "C");
	for (e = 1; e < 134; e++) {
		const char *want = strerror(e);

		if (!strncmp(want, "Unknown error", 13))
			continue;
		assert_string_equal(halite_strerror(-e), want);
		assert_string_equal(halite_strerror(e), want);
	}
	assert_string_equal(halite_strerror(-ENOSPC), "No space left on device");
}

static void test_unknown_never_null(void **state)
{
	static const int odd[] = { 0, 3999, -3999, HALITE_E_MAX, -HALITE_E_MAX, 5000, -100000,
				   INT_MAX, INT_MIN, INT_MIN + 1 };
	size_t i;

	for (i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
		const char *s = halite_strerror(odd[i]);

		assert_non_null(s);
		assert_true(strlen(s) > 0);
	}
	assert_string_equal(halite_strerror(HALITE_E_MAX), "unknown error");
	assert_string_equal(halite_strerror(INT_MIN), "unknown error");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_halite_codes_distinct),
		cmocka_unit_test(test_specific_messages),
		cmocka_unit_test(test_errno_matches_strerror),
		cmocka_unit_test(test_unknown_never_null),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
