/* SPDX-License-Identifier: MIT */
/*
 * Logging. Halite never prints on its own: every handle's options may carry a
 * log callback, and errors are reported through it with full detail (which
 * locality block, which offset) as well as by return code.
 */
#ifndef HALITE_LOG_H
#define HALITE_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

enum halite_log_level {
	HALITE_LOG_ERROR = 0,
	HALITE_LOG_WARN = 1,
	HALITE_LOG_INFO = 2,
	HALITE_LOG_DEBUG = 3,
};

/*
 * Called with one complete message (no trailing newline). May be called from
 * any of the handle's threads at once: the callback must be thread-safe.
 */
typedef void (*halite_log_fn)(void *ctx, int level, const char *msg);

/* A ready callback that prints "halite: LEVEL: msg" to stderr; ctx unused. */
void halite_log_stderr(void *ctx, int level, const char *msg);

#ifdef __cplusplus
}
#endif
#endif /* HALITE_LOG_H */
