// SPDX-License-Identifier: MIT
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <halite/errors.h>

#include "export.h"
#include "log_internal.h"

/*
 * Long enough for a path plus a few numbers; longer messages are cut and
 * marked rather than allocated for, as logging runs on fault-service paths.
 */
#define HALITE_LOG_MAX 1024

static const char *level_name(int level)
{
	switch (level) {
	case HALITE_LOG_ERROR:
		return "error";
	case HALITE_LOG_WARN:
		return "warning";
	case HALITE_LOG_INFO:
		return "info";
	case HALITE_LOG_DEBUG:
		return "debug";
	}
	return level < HALITE_LOG_ERROR ? "error" : "debug";
}

HALITE_EXPORT void halite_log_stderr(void *ctx, int level, const char *msg)
{
	/* One stdio call: the stream lock keeps concurrent lines whole. */
	fprintf(stderr, "halite: %s: %s\n", level_name(level), msg ? msg : "");
}

void halite_logf(const struct halite_logger *lg, int level, const char *fmt, ...)
{
	static const char cut[] = "...";
	char buf[HALITE_LOG_MAX];
	va_list ap;
	size_t len;
	int n;

	if (!lg || !lg->fn || level > lg->level)
		return;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(buf)) {
		memcpy(buf + sizeof(buf) - sizeof(cut), cut, sizeof(cut));
		len = sizeof(buf) - 1;
	} else {
		len = (size_t)n;
	}
	/* The callback promises whole lines without the newline. */
	while (len && buf[len - 1] == '\n')
		buf[--len] = '\0';
	lg->fn(lg->ctx, level, buf);
}

void halite_vformat_error(char *dst, size_t len, int err, const char *fmt, va_list ap)
{
	const char *why = halite_strerror(err);
	size_t wl = strlen(why);
	int n;

	if (!len)
		return;
	n = vsnprintf(dst, len, fmt, ap);
	/*
	 * Room for the reason, or the message as it fits. Not twice: a message
	 * that quotes an inner layer's ("...: No space left on device") has it.
	 */
	if (n >= 0 && (size_t)n < len - 8 &&
	    !((size_t)n >= wl + 2 && !strcmp(dst + n - wl, why) && dst[n - wl - 2] == ':'))
		snprintf(dst + n, len - (size_t)n, ": %s", why);
}
