/* SPDX-License-Identifier: MIT */
/*
 * The restore's shared state: its error (the first message wins), the end
 * (the trace written, then the state that halite_restore_wait() sees).
 * The claims and counts of memory blocks are
 * inline in restore_int.h.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>

#include "restore_int.h"

void rs_errmsg_level(struct halite_restore *r, const char *msg, int level)
{
	bool first;

	pthread_mutex_lock(&r->st_lock);
	first = !r->errmsg[0];
	if (first)
		snprintf(r->errmsg, sizeof(r->errmsg), "%s", msg);
	pthread_mutex_unlock(&r->st_lock);
	/* Once failed, every thread's next install fails too: one error is news. */
	halite_logf(&r->log, first ? level : HALITE_LOG_DEBUG, "%s", msg);
}

void rs_errmsg(struct halite_restore *r, const char *msg)
{
	rs_errmsg_level(r, msg, HALITE_LOG_ERROR);
}

int rs_fail(struct halite_restore *r, int err, const char *fmt, ...)
{
	char msg[sizeof(r->errmsg)];
	va_list ap;

	va_start(ap, fmt);
	halite_vformat_error(msg, sizeof(msg), err, fmt, ap);
	va_end(ap);
	rs_errmsg(r, msg);
	return err < 0 ? err : -err;
}

void rs_set_failed(struct halite_restore *r, int err)
{
	atomic_store(&r->failed, true);
	atomic_store(&r->src.failed, true); /* it reads nothing more */
	rs_end(r, err);
}

/*
 * Done (@err 0) or failed: the trace is written before the state changes, so
 * that a caller woken by halite_restore_wait() finds it complete.
 */
void rs_end(struct halite_restore *r, int err)
{
	struct halite_restore_stats st;
	int ret;

	pthread_mutex_lock(&r->st_lock);
	if (r->ending || r->state != S_RUNNING) {
		pthread_mutex_unlock(&r->st_lock);
		return;
	}
	r->ending = true;
	r->done_ns = halite_now_ns();
	pthread_mutex_unlock(&r->st_lock);
	if (r->obs)
		r->obs->stop(r, !err);
	if (r->o.trace_path) {
		rs_fill_stats(r, &st);
		st.done = !err;
		st.error = err;
		ret = rs_write_trace(r, &st);
		if (ret)
			halite_logf(&r->log, HALITE_LOG_WARN, "restore trace %s: %s",
				    r->o.trace_path, halite_strerror(ret));
	}
	pthread_mutex_lock(&r->st_lock);
	r->state = err ? S_FAILED : S_DONE;
	r->error = err;
	pthread_cond_broadcast(&r->st_cond);
	pthread_mutex_unlock(&r->st_lock);
	src_stop(&r->src);
	if (!err)
		halite_logf(&r->log, HALITE_LOG_INFO, "restore of %s done in %.1f ms", r->path,
			    (double)(r->done_ns - r->ready_at) / 1e6);
}
