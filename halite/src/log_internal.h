/* SPDX-License-Identifier: MIT */
/* Private: how library code emits through a handle's log callback. */
#ifndef HALITE_LOG_INTERNAL_H
#define HALITE_LOG_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>

#include <halite/errors.h>
#include <halite/log.h>

struct halite_logger {
	halite_log_fn fn; /* NULL: silent */
	void *ctx;
	int level;	  /* messages above this level are dropped */
};

/* printf-style; formats into a bounded stack buffer, never allocates. */
void halite_logf(const struct halite_logger *lg, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * The handles' error messages: "<fmt...>: <halite_strerror(err)>" into
 * @dst, cut to @len. Never allocates.
 */
void halite_vformat_error(char *dst, size_t len, int err, const char *fmt, va_list ap);

#endif
