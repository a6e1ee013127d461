/* SPDX-License-Identifier: MIT */
/*
 * The template's hot set (the blocks clones touched first, saved as a
 * trace and loaded again), a relayouted snapshot's hot prefix, and the
 * prefetch order they make: hot LBs first, then file order.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "endian_util.h"
#include "relayout_meta.h"
#include "template_src.h"
#include "zalloc.h"

/* Add a learned block (first time wins): 1, 0 if it was, -ENOMEM. */
static int hot_add_locked(struct halite_template *t, const struct learn_touch *lt)
{
	if (t->hot_bit[lt->mb])
		return 0;
	if (t->hot_n == t->hot_cap) {
		uint64_t cap = t->hot_cap ? t->hot_cap * 2 : 1024;
		struct learn_touch *h = realloc(t->hot, cap * sizeof(*h));

		if (!h)
			return -ENOMEM;
		t->hot = h;
		t->hot_cap = cap;
	}
	t->hot_bit[lt->mb] = 1;
	t->hot[t->hot_n++] = *lt;
	return 1;
}

void tpl_hot_note(struct halite_template *t, uint64_t mb, uint32_t vcpu, uint64_t now,
		  uint64_t start_ns)
{
	struct learn_touch lt = { .mb = mb, .vcpu = vcpu, .kind = HALITE_MB_STORED };

	pthread_mutex_lock(&t->src.lk);
	if (!t->hot_bit[mb]) {
		if (!t->hot_base_ns)
			t->hot_base_ns = start_ns;
		lt.t_ns = t->hot_t_off + (now > t->hot_base_ns ? now - t->hot_base_ns : 0);
		/* Sessions' faults are noted in lock order; t_ns never goes back. */
		if (t->hot_n && lt.t_ns < t->hot[t->hot_n - 1].t_ns)
			lt.t_ns = t->hot[t->hot_n - 1].t_ns;
		(void)hot_add_locked(t, &lt);
	}
	pthread_mutex_unlock(&t->src.lk);
}

/* Blocks in the hot set: learned, and the prefix's not learned. Under t->mu. */
uint64_t tpl_hot_count_locked(const struct halite_template *t, uint64_t *prefix)
{
	uint64_t n = 0;

	for (uint64_t i = 0; i < t->pre_n; i++)
		n += !t->hot_bit[t->pre[i]];
	if (prefix)
		*prefix = n;
	return t->hot_n + n;
}

int tpl_hot_list(struct halite_template *t, uint64_t **mbs, uint64_t *count)
{
	uint64_t *copy, n, k = 0;

	pthread_mutex_lock(&t->src.lk);
	n = tpl_hot_count_locked(t, NULL);
	copy = malloc((n ? n : 1) * sizeof(*copy));
	if (copy) {
		for (uint64_t i = 0; i < t->hot_n; i++)
			copy[k++] = t->hot[i].mb;
		for (uint64_t i = 0; i < t->pre_n; i++)
			if (!t->hot_bit[t->pre[i]])
				copy[k++] = t->pre[i];
		*count = k;
		*mbs = copy;
	}
	pthread_mutex_unlock(&t->src.lk);
	return copy ? 0 : -ENOMEM;
}

/* The format before the trace (see the top): 0, or -EINVAL with @why set. */
static int hot_load_old(struct halite_template *t, int fd, char *why, size_t whylen)
{
	uint8_t *buf = NULL;
	struct stat st;
	uint64_t n;
	int ret = -EINVAL;

	if (fstat(fd, &st) || st.st_size < 40 || (st.st_size - 40) % 8 ||
	    (uint64_t)(st.st_size - 40) / 8 > t->fi->mb_count) {
		snprintf(why, whylen, "an old-format hot set of the wrong size");
		return -EINVAL;
	}
	buf = malloc((size_t)st.st_size);
	if (!buf || pread(fd, buf, (size_t)st.st_size, 0) != st.st_size) {
		snprintf(why, whylen, "reading: %s", buf ? strerror(errno) : "out of memory");
		goto out;
	}
	n = halite_get_le64(buf + 24);
	if (memcmp(buf + 8, t->fi->uuid, 16)) {
		snprintf(why, whylen, "an old-format hot set of another snapshot (uuid)");
		goto out;
	}
	if (n != (uint64_t)(st.st_size - 40) / 8 ||
	    XXH3_64bits(buf, (size_t)st.st_size - 8) != halite_get_le64(buf + st.st_size - 8)) {
		snprintf(why, whylen, "an old-format hot set that is damaged (count or checksum)");
		goto out;
	}
	for (uint64_t i = 0; i < n; i++) {
		struct learn_touch lt = { .mb = halite_get_le64(buf + 32 + 8 * i),
					  .kind = HALITE_MB_STORED };
		struct halite_mb_loc loc;

		if (halite_reader_mb_lookup(t->rd, lt.mb, &loc)) {
			snprintf(why, whylen, "looking up its block %llu: %s", ULL(lt.mb),
				 halite_reader_errmsg(t->rd));
			goto out;
		}
		if (loc.state != HALITE_MB_STORED) {
			snprintf(why, whylen, "an old-format hot set naming block %llu, which the "
				 "snapshot does not store", ULL(lt.mb));
			goto out;
		}
		if (hot_add_locked(t, &lt) < 0) {
			snprintf(why, whylen, "out of memory");
			goto out;
		}
	}
	ret = 0;
out:
	free(buf);
	return ret;
}

static int on_touch(void *ctx, const struct learn_touch *lt)
{
	struct halite_template *t = ctx;

	t->hot_t_off = lt->t_ns;
	/* Zero and never-touched blocks need no read: not hot (a restore's trace has them). */
	if (lt->kind != HALITE_MB_STORED)
		return 0;
	return hot_add_locked(t, lt) < 0 ? -ENOMEM : 0;
}

/* Read the hot set file, if any; a bad one is ignored with a warning saying why. */
void tpl_hot_load(struct halite_template *t)
{
	char magic[8], why[200] = "";
	FILE *f;
	int ret;

	if (!t->hot_path)
		return;
	f = fopen(t->hot_path, "re");
	if (!f) {
		if (errno != ENOENT)
			halite_logf(&t->log, HALITE_LOG_WARN, "hot set %s: %s (ignored)", t->hot_path,
				    strerror(errno));
		return;
	}
	if (fread(magic, 1, 8, f) == 8 && !memcmp(magic, HOT_MAGIC, 8)) {
		ret = hot_load_old(t, fileno(f), why, sizeof(why));
	} else {
		rewind(f);
		ret = trace_read_touches(f, t->rd, on_touch, t, why, sizeof(why));
		if (ret && !why[0])
			snprintf(why, sizeof(why), "%s", strerror(-ret));
	}
	fclose(f);
	if (!ret) {
		halite_logf(&t->log, HALITE_LOG_INFO, "hot set %s: %llu blocks", t->hot_path,
			    ULL(t->hot_n));
		return;
	}
	halite_logf(&t->log, HALITE_LOG_WARN, "hot set %s ignored: %s", t->hot_path, why);
	for (uint64_t i = 0; i < t->hot_n; i++)
		t->hot_bit[t->hot[i].mb] = 0;
	t->hot_n = 0;
	t->hot_t_off = 0;
}

/* A relayouted snapshot's hot prefix: its stored blocks join the hot set after the learned. */
int tpl_hot_prefix(struct halite_template *t)
{
	struct hlt_relayout rel;
	uint64_t n = 0;

	if (hlt_relayout_read(t->rd, &rel)) {
		halite_logf(&t->log, HALITE_LOG_WARN, "template: metadata %s is not 'hot-lbs=K' "
			    "with K at most %llu (the file's locality blocks): no hot prefix",
			    HLT_RELAYOUT_META, ULL(t->fi->lb_count));
		return 0;
	}
	for (uint64_t lb = 0; lb < rel.hot_lbs; lb++) {
		uint32_t m;
		const uint64_t *mbs;

		/* Only a hint: an LB whose list fails is left out (its sessions fail on use). */
		if (!halite_reader_lb_members(t->rd, lb, &mbs, &m))
			n += m;
		else
			halite_logf(&t->log, HALITE_LOG_WARN, "template: hot prefix without locality "
				    "block %llu: %s", ULL(lb), halite_reader_errmsg(t->rd));
	}
	if (!n)
		return 0;
	t->pre = malloc(n * sizeof(*t->pre));
	if (!t->pre)
		return -ENOMEM;
	/* Each stored block is in one LB's member list, once (the reader checks): no repeats. */
	for (uint64_t lb = 0; lb < rel.hot_lbs; lb++) {
		uint32_t m;
		const uint64_t *mbs;

		/* Within what the first pass counted, whatever the reader says now. */
		if (halite_reader_lb_members(t->rd, lb, &mbs, &m) || m > n - t->pre_n)
			continue;
		memcpy(t->pre + t->pre_n, mbs, m * sizeof(*mbs));
		t->pre_n += m;
	}
	halite_logf(&t->log, HALITE_LOG_INFO, "template: relayouted snapshot, hot prefix of %llu "
		    "LBs, %llu blocks", ULL(rel.hot_lbs), ULL(t->pre_n));
	return 0;
}

int halite_template_hotset_save(struct halite_template *t)
{
	struct trace_out o;
	int ret;

	if (!t || !t->hot_path)
		return -EINVAL;
	ret = trace_out_begin(&o, t->hot_path, 2, t->fi->uuid);
	if (ret)
		return ret;
	/* No stat or lb lines: a template is no one restore (docs/restore-trace.md). */
	pthread_mutex_lock(&t->src.lk);
	trace_write_learn(o.f, t->o.hot_window_ms, false, t->hot, t->hot_n);
	pthread_mutex_unlock(&t->src.lk);
	return trace_out_end(&o, 0);
}

int tpl_build_porder(struct halite_template *t)
{
	uint64_t lbn = t->fi->lb_count, n = 0;
	uint8_t *seen = halite_zalloc(lbn);

	uint64_t *hot = NULL, nh = 0;

	if (tpl_hot_list(t, &hot, &nh)) {
		halite_zfree(seen);
		return -ENOMEM;
	}
	t->porder = malloc((nh ? nh : 1) * sizeof(*t->porder));
	if (!seen || !t->porder) {
		halite_zfree(seen);
		free(hot);
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < nh; i++) {
		struct halite_mb_loc loc;

		if (!halite_reader_mb_lookup(t->rd, hot[i], &loc) && !seen[loc.lb]) {
			seen[loc.lb] = 1;
			t->porder[n++] = loc.lb;
		}
	}
	t->nhot = n;
	halite_zfree(seen);
	free(hot);
	return 0;
}
