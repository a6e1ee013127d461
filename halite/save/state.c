/* SPDX-License-Identifier: MIT */
/*
 * What the save's threads tell each other and the caller: the first failure
 * (its message, and the state that winds everything down) and the
 * statistics.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>

#include "export.h"

#include "save_int.h"

__attribute__((format(printf, 3, 4)))
int sfail(struct halite_save *s, int err, const char *fmt, ...)
{
	char msg[sizeof(s->errmsg)];
	va_list ap;

	va_start(ap, fmt);
	halite_vformat_error(msg, sizeof(msg), err, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&s->st_lock);
	if (!s->errmsg[0])
		memcpy(s->errmsg, msg, sizeof(msg));
	pthread_mutex_unlock(&s->st_lock);
	halite_logf(&s->log, HALITE_LOG_ERROR, "%s", msg);
	return err < 0 ? err : -err;
}

/* The first error wins; everything winds down from there. */
void save_set_failed(struct halite_save *s, int err)
{
	pthread_mutex_lock(&s->st_lock);
	if (s->state == S_RUNNING) {
		s->state = S_FAILED;
		s->error = err;
	}
	pthread_cond_broadcast(&s->st_cond);
	pthread_mutex_unlock(&s->st_lock);
	atomic_store(&s->stopping, true);
	pthread_mutex_lock(&s->q_lock);
	pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
	eventfd_write(s->stop_fd, 1);
}

HALITE_EXPORT void halite_save_stats(struct halite_save *s, struct halite_save_stats *st)
{
	pthread_mutex_lock(&s->st_lock);
	*st = (struct halite_save_stats){
		.arm_ns = s->arm_ns,
		.duration_ns = s->done_ns ? s->done_ns - s->arm_start_ns
			       : s->arm_start_ns ? halite_now_ns() - s->arm_start_ns : 0,
		.mb_total = s->mb_total,
		.done = s->state == S_DONE,
		.error = s->state == S_FAILED ? s->error : 0,
	};
	pthread_mutex_unlock(&s->st_lock);
	st->mb_saved = atomic_load(&s->n_saved);
	st->mb_stored = atomic_load(&s->n_stored);
	st->mb_zero = atomic_load(&s->n_zero);
	st->mb_untouched = atomic_load(&s->n_untouched);
	st->faults = atomic_load(&s->n_faults);
	st->faults_vcpu = atomic_load(&s->n_faults_vcpu);
	st->faults_other = atomic_load(&s->n_faults_other);
	st->mb_background = atomic_load(&s->n_bg);
	st->raw_bytes = atomic_load(&s->raw_bytes);
	st->stored_bytes = atomic_load(&s->stored_bytes);
	st->file_bytes = atomic_load(&s->file_bytes);
	/* Quantiles of a histogram other threads add to are approximate until done. */
	st->fault_p50_ns = halite_hist_quantile(&s->fault_hist, 0.5);
	st->fault_p99_ns = halite_hist_quantile(&s->fault_hist, 0.99);
	st->fault_max_ns = halite_hist_quantile(&s->fault_hist, 1.0);
	st->fault_realtime = atomic_load(&s->fault_rt);
}

HALITE_EXPORT const char *halite_save_errmsg(const struct halite_save *s)
{
	return s->errmsg;
}
