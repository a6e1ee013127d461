// SPDX-License-Identifier: MIT
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "log_internal.h"

struct capture {
	int calls;
	int level;
	char msg[4096];
};

static void capture_fn(void *ctx, int level, const char *msg)
{
	struct capture *c = ctx;

	c->calls++;
	c->level = level;
	snprintf(c->msg, sizeof(c->msg), "%s", msg);
}

static void test_format_and_levels(void **state)
{
	struct capture c = { 0 };
	struct halite_logger lg = { .fn = capture_fn, .ctx = &c, .level = HALITE_LOG_WARN };

	halite_logf(&lg, HALITE_LOG_ERROR, "lb %u at offset %#llx: %s", 7u, 0x1000ull, "bad");
	assert_int_equal(c.calls, 1);
	assert_int_equal(c.level, HALITE_LOG_ERROR);
	assert_string_equal(c.msg, "lb 7 at offset 0x1000: bad");

	halite_logf(&lg, HALITE_LOG_WARN, "warn");
	assert_int_equal(c.calls, 2);
	assert_string_equal(c.msg, "warn");

	/* Above the logger's level: dropped. */
	halite_logf(&lg, HALITE_LOG_INFO, "info");
	halite_logf(&lg, HALITE_LOG_DEBUG, "debug");
	assert_int_equal(c.calls, 2);

	/* A trailing newline is not part of the message. */
	halite_logf(&lg, HALITE_LOG_ERROR, "line\n");
	assert_string_equal(c.msg, "line");
}

static void test_silent(void **state)
{
	struct capture c = { 0 };
	struct halite_logger lg = { .fn = NULL, .ctx = &c, .level = HALITE_LOG_DEBUG };

	halite_logf(NULL, HALITE_LOG_ERROR, "nobody %d", 1);
	halite_logf(&lg, HALITE_LOG_ERROR, "nobody %d", 2);
	assert_int_equal(c.calls, 0);
}

static void test_truncated_long_message(void **state)
{
	struct capture c = { 0 };
	struct halite_logger lg = { .fn = capture_fn, .ctx = &c, .level = HALITE_LOG_DEBUG };
	char big[3000];
	size_t len;

	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	halite_logf(&lg, HALITE_LOG_INFO, "%s", big);
	assert_int_equal(c.calls, 1);
	len = strlen(c.msg);
	assert_true(len > 100 && len < sizeof(big) - 1);
	assert_string_equal(c.msg + len - 3, "...");
}

static void test_stderr_callback(void **state)
{
	char path[] = "/tmp/halite-log-XXXXXX";
	char buf[256] = { 0 };
	int fd, saved;
	ssize_t n;

	fd = mkstemp(path);
	assert_true(fd >= 0);
	unlink(path);
	fflush(stderr);
	saved = dup(STDERR_FILENO);
	assert_true(saved >= 0);
	assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);

	halite_log_stderr(NULL, HALITE_LOG_ERROR, "disk on fire");
	halite_log_stderr(NULL, HALITE_LOG_DEBUG, "detail");
	fflush(stderr);

	dup2(saved, STDERR_FILENO);
	close(saved);
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	assert_true(n > 0);
	assert_string_equal(buf, "halite: error: disk on fire\nhalite: debug: detail\n");
}

static void format_error(char *dst, size_t len, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	halite_vformat_error(dst, len, err, fmt, ap);
	va_end(ap);
}

/* The reason is appended once: not again after a message that quotes it. */
static void test_error_reason_once(void **state)
{
	char inner[128], buf[256];

	(void)state;
	format_error(inner, sizeof(inner), -ENOSPC, "writing block %d", 7);
	assert_string_equal(inner, "writing block 7: No space left on device");
	format_error(buf, sizeof(buf), -ENOSPC, "saving: %s", inner);
	assert_string_equal(buf, "saving: writing block 7: No space left on device");
	/* Another reason at the end is not this one. */
	format_error(buf, sizeof(buf), -EIO, "saving: %s", "disk: No space left on device");
	assert_string_equal(buf, "saving: disk: No space left on device: Input/output error");
	/* Only a whole ": reason" counts. */
	format_error(buf, sizeof(buf), -EIO, "xInput/output error");
	assert_string_equal(buf, "xInput/output error: Input/output error");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_format_and_levels),
		cmocka_unit_test(test_silent),
		cmocka_unit_test(test_truncated_long_message),
		cmocka_unit_test(test_stderr_callback),
		cmocka_unit_test(test_error_reason_once),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
