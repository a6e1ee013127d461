/* SPDX-License-Identifier: MIT */
/* Private: a synthetic clone's control socket, the client side (clone_ctl.c). */
#ifndef HALITE_CLONE_CTL_H
#define HALITE_CLONE_CTL_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Connect to the clone's socket at @path: the descriptor, or -errno. */
int ctl_connect(const char *path, int timeout_ms);

/*
 * Send @cmd, read one JSON object back within @timeout_ms: 0 and *reply
 * (NULL: dropped; cJSON_Delete() it) and, with @fd, the descriptor that came
 * with it. A reply {"error": ...} is -EPROTO with its message in @err, as
 * are a reply that is not JSON, no descriptor when one was wanted, or a
 * reply over 8 KiB; -ETIMEDOUT, -ECONNRESET or the socket's -errno
 * otherwise, each explained in @err.
 */
int ctl_command(const char *sock, const char *cmd, cJSON **reply, int *fd, int timeout_ms,
		char *err, size_t errlen);

#endif
