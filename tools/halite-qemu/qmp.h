/* SPDX-License-Identifier: MIT */
/*
 * A small QMP client (QEMU Machine Protocol: newline-delimited JSON over a
 * unix socket). One thread at a time per handle: not thread-safe.
 * Events that arrive while waiting for a reply are queued for
 * hq_qmp_wait_event().
 */
#ifndef HALITE_QEMU_QMP_H
#define HALITE_QEMU_QMP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

struct hq_qmp;

/*
 * Connect to the QMP socket @path, retrying until @timeout_ms while it does
 * not exist or refuses, read the greeting and negotiate (qmp_capabilities).
 * 0, or -errno (-ETIMEDOUT, -ENOENT, -ECONNREFUSED: the last failure) with a
 * message in @err.
 */
int hq_qmp_connect(struct hq_qmp **qp, const char *path, int timeout_ms, char *err,
		   size_t errlen);
/* The process at the other end (SO_PEERCRED): QEMU. */
pid_t hq_qmp_peer_pid(const struct hq_qmp *q);
/* QEMU's version, from the greeting. */
void hq_qmp_version(const struct hq_qmp *q, int *major, int *minor, int *micro);
/*
 * Execute @cmd with @args (an object, taken over; NULL for none). *ret, if
 * given, gets the "return" value (the caller cJSON_Delete()s it). 0; -EIO
 * when QEMU answered with an error (hq_qmp_errmsg(): "CMD: CLASS: DESC");
 * -ETIMEDOUT after @timeout_ms (< 0: no limit); -ECONNRESET when QEMU went
 * away; -EPROTO on a reply that is not QMP.
 */
int hq_qmp_call(struct hq_qmp *q, const char *cmd, cJSON *args, cJSON **ret, int timeout_ms);
/* An HMP command through human-monitor-command; *out is malloc'd text. */
int hq_qmp_hmp(struct hq_qmp *q, const char *cmdline, char **out, int timeout_ms);
/*
 * Wait for the event @name (queued ones first, consumed in order); *data,
 * if given, gets its "data" member (may be NULL; caller deletes).
 */
int hq_qmp_wait_event(struct hq_qmp *q, const char *name, cJSON **data, int timeout_ms);
/* Whether QEMU has the command (query-commands, asked once). */
bool hq_qmp_has_command(struct hq_qmp *q, const char *cmd);
/* The last error, "" if none. */
const char *hq_qmp_errmsg(const struct hq_qmp *q);
void hq_qmp_close(struct hq_qmp *q);

#endif
