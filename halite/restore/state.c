/* SPDX-License-Identifier: MIT */
/*
 * The restore's end, through its session (guest_session.h): a failure
 * stops the source too, and the end writes the trace before the state
 * that halite_restore_wait() sees changes. The claims and counts of memory
 * blocks are inline in restore_int.h.
 */
#define _GNU_SOURCE
#include <stdio.h>

#include "restore_int.h"

static struct halite_restore *of_gs(struct gsession *gs)
{
	return (struct halite_restore *)((char *)gs - offsetof(struct halite_restore, gs));
}

void rs_errmsg(struct halite_restore *r, const char *msg)
{
	gs_errmsg_level(&r->gs, msg, HALITE_LOG_ERROR);
}

void rs_set_failed(struct halite_restore *r, int err)
{
	atomic_store(&r->src.failed, true); /* it reads nothing more */
	rs_end(r, err);
}

/*
 * The session ends (also when reading its userfaultfd failed): the source
 * stops, learning stops, and the trace is written before the state
 * changes, so that a woken waiter finds it complete.
 */
void rs_ending(struct gsession *gs, int err)
{
	struct halite_restore *r = of_gs(gs);
	struct halite_restore_stats st;
	int ret;

	if (err)
		atomic_store(&r->src.failed, true);
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
	src_stop(&r->src);
}

/* Done (@err 0) or failed, once. */
void rs_end(struct halite_restore *r, int err)
{
	if (!gs_end(&r->gs, err))
		return;
	if (!err)
		halite_logf(&r->log, HALITE_LOG_INFO, "restore of %s done in %.1f ms", r->path,
			    (double)(r->gs.done_ns - r->gs.running_ns) / 1e6);
}
