/* SPDX-License-Identifier: MIT */
/*
 * Private: a clone's control socket, the server side (clone_srv.c), shared
 * by halite-synth clone (testing/synth/cmd_clone.c) and halite-qemu clone
 * (tools/halite-qemu/clone.c); the client is clone_ctl.h.
 */
#ifndef HALITE_CLONE_SRV_H
#define HALITE_CLONE_SRV_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

/* The longest command line; a longer one is answered with an error. */
#define CLONE_SRV_LINE_MAX 4096

/*
 * One command: @line (NUL-terminated, its newline gone, no NUL inside) ->
 * its reply (NULL: out of memory, answered so), which the server sends and
 * deletes. *pass_fd (-1 on entry) set to a descriptor sends it with the
 * reply (SCM_RIGHTS; still the caller's); *quit set ends the server after
 * the reply.
 */
typedef cJSON *clone_srv_fn(void *ctx, char *line, int *pass_fd, bool *quit);

/*
 * Listen on the unix socket @path (created 0600; a stale socket there is
 * replaced, anything else refused): the descriptor, or -errno with the
 * reason in @err.
 */
int clone_srv_listen(const char *path, char *err, size_t errlen);

/*
 * Serve @lfd, one connection at a time, each until EOF: @fn per command
 * line. Returns 0 once @fn set quit, 1 when @watch_fd (>= 0: e.g. a
 * pidfd) became readable, -errno when accept() failed.
 */
int clone_srv_run(int lfd, int watch_fd, clone_srv_fn *fn, void *ctx);

/* {"error": "..."} and {"ok": true} (NULL when out of memory). */
cJSON *clone_srv_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
cJSON *clone_srv_ok(void);

#endif
