/* SPDX-License-Identifier: MIT */
/*
 * A source's prefetcher (source.h): every LB nobody has read, its "first"
 * list (a relayouted file's hot prefix, a template's hot set) and then file
 * order, queue_depth reads in flight, held back while faults come and
 * while its consumer says so (ops.hold).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <halite/errors.h>

#include "source.h"
#include "stats.h"

#define ULL(x) ((unsigned long long)(x))

/* The prefetcher naps this long when held back with nothing in flight (save.c's bg nap). */
#define PREFETCH_NAP_US 200u

struct pf_slot {
	uint64_t lb;
	uint8_t *buf;
	unsigned reads;
	bool first;
};

/* The prefetch order's @i-th LB: the first list, then every LB in file order. */
static uint64_t pf_at(const struct src *s, uint64_t i)
{
	if (i >= s->nfirst)
		return i - s->nfirst;
	return s->first ? s->first[i] : i;
}

/*
 * Hold back? When the consumer says so (*@nap_us its nap); the first list
 * when it is unthrottled, never otherwise; else while faults come (one
 * within prefetch_idle_us), unless behind prefetch_min_rate since @start.
 */
static bool pf_hold(struct src *s, uint64_t start, uint64_t issued, bool first,
		    uint32_t *nap_us)
{
	uint32_t nap = s->ops->hold ? s->ops->hold(s->ctx) : 0;

	if (nap) {
		*nap_us = nap;
		return true;
	}
	*nap_us = PREFETCH_NAP_US;
	if (first && s->o.first_unthrottled)
		return false;
	return !src_prefetch_may(halite_now_ns(), atomic_load(&s->last_fault_ns),
				 s->o.prefetch_idle_us, start, s->o.prefetch_min_rate, issued);
}

/* The LB at @cursor if nobody has read it, now READING (the cursor moved on); else UINT64_MAX. */
static uint64_t pf_take(struct src *s, uint64_t *cursor)
{
	uint64_t lb = pf_at(s, (*cursor)++);
	bool mine = false;

	pthread_mutex_lock(&s->lk);
	if (atomic_load(&s->st[lb]) == LB_IDLE) {
		atomic_store(&s->st[lb], LB_READING);
		mine = true;
	}
	pthread_mutex_unlock(&s->lk);
	return mine ? lb : UINT64_MAX;
}

/*
 * Submit @sl's read: 0, < 0 when the prefetcher cannot go on, or 1 when
 * this LB cannot be read at all (its index entries fail: a 1.1 file's
 * damaged chunk): it is FAILED and its consumer told, as for an LB whose
 * every read failed, and the prefetcher goes on with the next (a
 * template's other LBs are good; a restore stops on its failure).
 */
static int pf_submit(struct src *s, struct pf_slot *sl, unsigned tag)
{
	struct halite_lb_info li;
	const uint64_t *mbs;
	char msg[512];
	uint32_t n;
	int ret;

	/* Its index entries first (a 1.1 file's chunks load here, off the fault path). */
	ret = halite_reader_lb_members(s->rd, sl->lb, &mbs, &n);
	if (!ret)
		ret = halite_reader_lb_info(s->rd, sl->lb, &li);
	if (ret) {
		snprintf(msg, sizeof(msg), "locality block %llu: %s", ULL(sl->lb),
			 halite_reader_errmsg(s->rd));
		src_lb_fail(s, sl->lb, ret, msg);
		return 1;
	}
	ret = halite_io_submit_read(s->io, sl->buf, s->lb_size, li.offset, tag);
	if (ret) {
		snprintf(msg, sizeof(msg), "locality block %llu at offset %llu: submitting a read",
			 ULL(sl->lb), ULL(li.offset));
		src_error(s, ret, msg);
	}
	return ret;
}

/* A read came back: land it, read it again, or fail. True when the slot is free again. */
static bool pf_complete(struct src *s, struct pf_slot *sl, unsigned tag, int64_t res,
			uint8_t *tmp)
{
	int ret;

	if (res == (int64_t)s->lb_size) {
		atomic_fetch_add(&s->n_bytes, s->lb_size);
		ret = halite_reader_verify_lb(s->rd, sl->lb, sl->buf);
	} else {
		ret = res < 0 ? (int)res : -HALITE_E_TRUNCATED;
	}
	if (!ret) {
		/* Counted before it lands, so a caller that sees the consumer done sees it. */
		if (sl->first)
			atomic_fetch_add(&s->n_first, 1);
		src_land(s, sl->lb, sl->buf, SRC_PREFETCH, tmp);
		sl->buf = NULL;
		return true;
	}
	if (sl->reads <= s->o.read_retries && !atomic_load(&s->failed) && !src_read_final(ret)) {
		src_lb_retrying(s, sl->lb, ret, sl->reads);
		sl->reads++;
		ret = pf_submit(s, sl, tag);
		if (!ret)
			return false;
		if (ret > 0) { /* failed and told already */
			halite_reader_free_lb(sl->buf);
			sl->buf = NULL;
			return true;
		}
	}
	halite_reader_free_lb(sl->buf);
	sl->buf = NULL;
	src_lb_failed(s, sl->lb, ret, sl->reads);
	return true;
}

void *src_prefetch_main(void *arg)
{
	struct src *s = arg;
	unsigned qd = s->o.queue_depth, nfree = qd;
	struct pf_slot *slots = calloc(qd, sizeof(*slots));
	unsigned *freel = calloc(qd, sizeof(*freel));
	struct halite_io_done *done = calloc(qd, sizeof(*done));
	uint8_t *tmp = halite_io_alloc(s->mb_size);
	uint64_t cursor = 0, end = s->nfirst + s->lb_total, issued = 0, start = halite_now_ns();

	pthread_setname_np(pthread_self(), "halite-prefetch");
	if (!slots || !freel || !done || !tmp) {
		src_error(s, -ENOMEM, "prefetcher buffers");
		goto out;
	}
	for (unsigned i = 0; i < qd; i++)
		freel[i] = qd - 1 - i;
	while (!atomic_load(&s->stopping) && !atomic_load(&s->failed)) {
		unsigned inflight = halite_io_inflight(s->io);
		bool more, first, hold;
		uint32_t nap_us = 0;
		struct pf_slot *sl;
		uint64_t lb;
		unsigned tag;
		int n;

		/*
		 * Past what was read already first: whether the next read is
		 * a first one (perhaps unthrottled) is the next LB's to say,
		 * not the one a fault took.
		 */
		while (cursor < end && atomic_load(&s->st[pf_at(s, cursor)]) != LB_IDLE)
			cursor++;
		more = cursor < end;
		first = cursor < s->nfirst;
		hold = !more || !nfree || pf_hold(s, start, issued, first, &nap_us);

		if (!more && !inflight)
			break;
		if (inflight) {
			/*
			 * Collect what has landed (its waiters are waiting);
			 * block for it only when there is nothing to submit.
			 */
			n = halite_io_reap(s->io, done, qd, hold ? 1 : 0);
			if (n < 0) {
				src_error(s, n, "prefetch reads");
				break;
			}
			for (int i = 0; i < n; i++) {
				tag = (unsigned)done[i].tag;
				if (pf_complete(s, &slots[tag], tag, done[i].res, tmp))
					freel[nfree++] = tag;
			}
			if (hold)
				continue;
		} else if (hold) {
			struct timespec ts = { 0, (long)(nap_us ? nap_us : PREFETCH_NAP_US) * 1000 };

			nanosleep(&ts, NULL);
			continue;
		}
		lb = pf_take(s, &cursor);
		if (lb == UINT64_MAX)
			continue;
		tag = freel[--nfree];
		sl = &slots[tag];
		*sl = (struct pf_slot){ lb, halite_reader_alloc_lb(s->rd), 1, first };
		if (!sl->buf) {
			char msg[64];

			snprintf(msg, sizeof(msg), "locality block %llu: read buffer", ULL(lb));
			src_error(s, -ENOMEM, msg);
			break;
		}
		n = pf_submit(s, sl, tag);
		if (n) {
			halite_reader_free_lb(sl->buf);
			sl->buf = NULL;
			if (n < 0)
				break;
			freel[nfree++] = tag; /* that LB failed; the next one */
			continue;
		}
		/* The minimum rate is owed from the end of an unthrottled first list on. */
		if (first && s->o.first_unthrottled)
			start = halite_now_ns();
		else
			issued += s->lb_size;
	}
	/* Stopped (failed, or freed): the kernel may still write into the buffers. */
	while (halite_io_inflight(s->io))
		if (halite_io_reap(s->io, done, qd, 1) < 0)
			break;
out:
	/* A buffer a read may still target is left to leak, never freed under it. */
	for (unsigned i = 0; slots && i < qd && !halite_io_inflight(s->io); i++)
		halite_reader_free_lb(slots[i].buf);
	free(slots);
	free(freel);
	free(done);
	halite_io_free(tmp);
	/*
	 * Done early (every LB read), the thread waits for the source's end
	 * rather than ending unjoined: a process that exits without freeing
	 * its source (halite-cloned leaves its templates to the next daemon)
	 * would otherwise leave a finished thread nobody joined, a leak to
	 * ThreadSanitizer. The readers wait so too.
	 */
	pthread_mutex_lock(&s->lk);
	while (!atomic_load(&s->stopping))
		pthread_cond_wait(&s->pf_cond, &s->lk);
	pthread_mutex_unlock(&s->lk);
	return NULL;
}
