/* SPDX-License-Identifier: MIT */
/* Private: how library code emits through a handle's log callback. */
#ifndef HALITE_LOG_INTERNAL_H
#define HALITE_LOG_INTERNAL_H

#include <halite/log.h>

struct halite_logger {
	halite_log_fn fn; /* NULL: silent */
	void *ctx;
	int level;	  /* messages above this level are dropped */
};

/* printf-style; formats into a bounded stack buffer, never allocates. */
void halite_logf(const struct halite_logger *lg, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif
