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
/*
 * Connect again to the same socket: for a connection that is lost
 * (hq_qmp_usable() false). QEMU serves one client per socket and takes the
 * next once the old one is closed, so the old one is closed first. One
 * attempt (-ENOENT, -ECONNREFUSED at once), then the greeting and
 * negotiation within @timeout_ms. Request ids go on from where they were;
 * queued events stay. 0, or -errno with hq_qmp_errmsg().
 */
int hq_qmp_reconnect(struct hq_qmp *q, int timeout_ms);
/*
 * False once the connection cannot be trusted any more: QEMU closed it, a
 * send failed, or a reply was too long to read. Calls on it then fail at
 * once with -ECONNRESET until hq_qmp_reconnect(). A call that timed out
 * leaves it usable: its late reply is told apart by its id and dropped.
 */
bool hq_qmp_usable(const struct hq_qmp *q);
/*
 * Polled while a call or a wait blocks on QEMU, every HQ_QMP_POLL_MS: a
 * non-zero return (< 0, -errno or -HALITE_E_*) ends the wait at once with
 * that value, and a call not yet sent is not sent. The connection stays
 * usable (a late reply is dropped by its id). NULL @fn: none.
 */
#define HQ_QMP_POLL_MS 5
typedef int (*hq_qmp_abort_fn)(void *ctx);
void hq_qmp_set_abort(struct hq_qmp *q, hq_qmp_abort_fn fn, void *ctx);
/* Whether the last call or wait was ended by the abort function. */
bool hq_qmp_aborted(const struct hq_qmp *q);
/* The process at the other end (SO_PEERCRED): QEMU. */
pid_t hq_qmp_peer_pid(const struct hq_qmp *q);
/*
 * The process listening on the QMP socket @path, found without a word of
 * QMP (SO_PEERCRED of a connection it has not accepted): for a QEMU whose
 * main loop is blocked. The pid, or -errno.
 */
pid_t hq_qmp_listener_pid(const char *path);
/* QEMU's version, from the greeting. */
void hq_qmp_version(const struct hq_qmp *q, int *major, int *minor, int *micro);
/*
 * Execute @cmd with @args (an object, taken over; NULL for none). *ret, if
 * given, gets the "return" value (the caller cJSON_Delete()s it). 0; -EIO
 * when QEMU answered with an error (hq_qmp_errmsg(): "CMD: CLASS: DESC");
 * -ETIMEDOUT after @timeout_ms (< 0: no limit); -ECONNRESET when QEMU went
 * away (or the connection was lost before); -EPROTO on a reply that is not
 * QMP; the abort function's value when it ended the wait.
 */
int hq_qmp_call(struct hq_qmp *q, const char *cmd, cJSON *args, cJSON **ret, int timeout_ms);
/*
 * Send @cmd and do not wait for its reply, which a later call drops (its id
 * is not the one awaited). For test fault points: a reply lost. 0 or -errno.
 */
int hq_qmp_send(struct hq_qmp *q, const char *cmd);
/* An HMP command through human-monitor-command; *out is malloc'd text. */
int hq_qmp_hmp(struct hq_qmp *q, const char *cmdline, char **out, int timeout_ms);
/*
 * Wait for the event @name (queued ones first, consumed in order); *data,
 * if given, gets its "data" member (may be NULL; caller deletes).
 */
int hq_qmp_wait_event(struct hq_qmp *q, const char *name, cJSON **data, int timeout_ms);
/* Whether QEMU has the command (query-commands, asked once). */
bool hq_qmp_has_command(struct hq_qmp *q, const char *cmd);
/*
 * QEMU's own message (the error reply's desc) when the last call failed
 * because QEMU answered with an error; "" otherwise.
 */
const char *hq_qmp_qemu_error(const struct hq_qmp *q);
/* The last error, "" if none. */
const char *hq_qmp_errmsg(const struct hq_qmp *q);
void hq_qmp_close(struct hq_qmp *q);

#endif
