/* SPDX-License-Identifier: MIT */
/*
 * The template's error: the first message wins, and a block whose map
 * entry cannot be read (a damaged index chunk) is the template's error.
 * Below every other file of the template source.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>

#include "template_src.h"

int tpl_fail(struct halite_template *t, int err, const char *fmt, ...)
{
	va_list ap;

	if (!t->errmsg[0]) {
		va_start(ap, fmt);
		halite_vformat_error(t->errmsg, sizeof(t->errmsg), err, fmt, ap);
		va_end(ap);
		halite_logf(&t->log, HALITE_LOG_ERROR, "%s", t->errmsg);
	}
	return err;
}

/*
 * A failure the template cannot serve past (an LB, or a lookup in a damaged
 * index chunk): the first one becomes the template's error and errmsg.
 * Takes t->src.lk.
 */
void tpl_error(struct halite_template *t, int err, const char *msg)
{
	pthread_mutex_lock(&t->src.lk);
	if (!t->error)
		t->error = err;
	tpl_fail(t, err, "%s", msg);
	pthread_cond_broadcast(&t->state_cv);
	pthread_mutex_unlock(&t->src.lk);
}

/*
 * Where block @mb is. A format 1.1 file's lookup can fail after open (its
 * index chunk damaged): that is the template's error, with the reader's
 * message naming the chunk, and never a zero block (docs/failure-model.md).
 */
int tpl_mb_lookup(struct halite_template *t, uint64_t mb, struct halite_mb_loc *loc)
{
	int ret = halite_reader_mb_lookup(t->rd, mb, loc);

	if (ret) {
		char msg[512];

		snprintf(msg, sizeof(msg), "memory block %llu: %s", ULL(mb),
			 halite_reader_errmsg(t->rd));
		tpl_error(t, ret, msg);
	}
	return ret;
}
