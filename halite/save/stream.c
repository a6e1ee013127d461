/* SPDX-License-Identifier: MIT */
/*
 * Per-vCPU streams into the file: claimed blocks queued in the order they
 * were claimed, encoded by the compression pool, and retired by the writer
 * thread into each stream's locality blocks; then the file is finished.
 *
 * The compression pool encodes queued blocks from the shadow. The writer
 * thread retires queued blocks strictly in queue order (a reorder
 * point after the parallel pool), so each stream's locality blocks hold its
 * blocks in the order the guest touched them, then finishes the file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "save_int.h"

/*
 * Items come from a free list filled at create; malloc only when the writer
 * has fallen more than ITEMS_PREALLOC blocks behind.
 */
struct item *save_item_new(struct halite_save *s, uint64_t mb, uint32_t stream, bool touched)
{
	struct item *it;

	pthread_mutex_lock(&s->q_lock);
	it = s->free_items;
	if (it) {
		s->free_items = it->next;
		s->nfree--;
	}
	pthread_mutex_unlock(&s->q_lock);
	if (!it)
		it = malloc(item_size(s));
	if (!it)
		return NULL;
	*it = (struct item){ .mb = mb, .stream = stream, .s = s,
			     .kind = touched ? ITEM_DATA : ITEM_UNTOUCHED, .ready = !touched };
	return it;
}

static void item_free(struct halite_save *s, struct item *it)
{
	if (!it)
		return;
	pthread_mutex_lock(&s->q_lock);
	if (s->nfree < ITEMS_PREALLOC) {
		it->next = s->free_items;
		s->free_items = it;
		s->nfree++;
		it = NULL;
	}
	pthread_mutex_unlock(&s->q_lock);
	free(it);
}

/* A SAVED block's snapshot bytes, once the walk cannot read them any more. */
void save_release_block(struct halite_save *s, uint64_t mb)
{
	const struct sregion *r = region_of_mb(s, mb);

	if (r->kind == HALITE_MEM_COPY)
		return;
	madvise(r->shadow + (mb - r->first_mb) * s->mb_size, s->mb_size, MADV_DONTNEED);
}

static void compress_task(void *arg);

/* After the wake: allocation is fine from here on. */
int save_enqueue(struct halite_save *s, struct item *it)
{
	bool touched = it->kind == ITEM_DATA;

	pthread_mutex_lock(&s->q_lock);
	if (s->q_tail)
		s->q_tail->next = it;
	else
		s->q_head = it;
	s->q_tail = it;
	if (it->ready)
		pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
	if (touched && halite_pool_submit(s->pool, compress_task, it))
		return -ENOMEM; /* the item stays queued, never ready: the save fails */
	return 0;
}

static void compress_task(void *arg)
{
	struct item *it = arg;
	struct halite_save *s = it->s;
	const struct sregion *r = region_of_mb(s, it->mb);
	const uint8_t *src = r->shadow + (it->mb - r->first_mb) * s->mb_size;
	int n;

	if (halite_all_zero(src, s->mb_size)) {
		it->kind = ITEM_ZERO;
	} else {
		n = halite_compress(s->codec, s->o.level, src, s->mb_size, it->buf,
				    s->mb_size - 1);
		if (n > 0) {
			it->len = (uint32_t)n;
			it->compressed = true;
		} else {
			memcpy(it->buf, src, s->mb_size);
			it->len = s->mb_size;
			it->compressed = false;
		}
	}
	pthread_mutex_lock(&s->q_lock);
	it->ready = true;
	if (s->q_head == it)
		pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
}

static int retire(struct halite_save *s, struct item *it)
{
	int ret;

	/* Claimed once, queued once: a block retires from READY, exactly once. */
	ret = SAVE_CHECK(s, it->mb < s->mb_total && atomic_load(&s->claim[it->mb]) == CLAIM_READY,
			 "memory block %llu retired in claim state %d",
			 (unsigned long long)it->mb,
			 it->mb < s->mb_total ? atomic_load(&s->claim[it->mb]) : -1);
	if (ret)
		return ret;
	switch (it->kind) {
	case ITEM_UNTOUCHED:
		atomic_fetch_add(&s->n_untouched, 1);
		break;
	case ITEM_ZERO:
		ret = halite_writer_put_zero(s->w, it->mb);
		atomic_fetch_add(&s->n_zero, 1);
		break;
	default:
		ret = halite_writer_put_encoded(s->w, it->stream, it->mb, it->buf, it->len,
						it->compressed);
		atomic_fetch_add(&s->n_stored, 1);
		atomic_fetch_add(&s->raw_bytes, s->mb_size);
		atomic_fetch_add(&s->stored_bytes, it->len);
		break;
	}
	if (ret)
		return sfail(s, ret, "saving memory block %llu: %s", (unsigned long long)it->mb,
			     halite_writer_errmsg(s->w));
	atomic_fetch_add(&s->n_saved, 1);
	/* Pairs with save_bg_main()'s walk_done then SAVED scan: one of us releases. */
	atomic_store(&s->claim[it->mb], CLAIM_SAVED);
	if (it->kind == ITEM_DATA && atomic_load(&s->walk_done))
		save_release_block(s, it->mb);
	return 0;
}

static int finish_file(struct halite_save *s)
{
	struct halite_save_stats st;
	int ret = 0;

	halite_save_stats(s, &st);
	pthread_mutex_lock(&s->roots_lock);
	for (uint32_t i = 0; i < s->nroots && !ret; i++)
		ret = halite_writer_add_root(s->w, &s->roots[i]);
	pthread_mutex_unlock(&s->roots_lock);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "arm_ns", st.arm_ns);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "faults", st.faults);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "faults_vcpu", st.faults_vcpu);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "faults_other", st.faults_other);
	for (uint32_t i = 0; i < s->o.nvcpus && !ret; i++) {
		char key[32];

		snprintf(key, sizeof(key), "faults_vcpu%u", i);
		ret = halite_writer_set_stat(s->w, key, atomic_load(&s->n_faults_by_vcpu[i]));
	}
	if (!ret)
		ret = halite_writer_set_stat(s->w, "mb_background", st.mb_background);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "fault_p50_ns", st.fault_p50_ns);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "fault_p99_ns", st.fault_p99_ns);
	if (!ret)
		ret = halite_writer_set_stat(s->w, "duration_ns", halite_now_ns() - s->arm_start_ns);
	if (!ret)
		ret = halite_writer_finish(s->w);
	/* The file is named once: most of the writer's sentences name it ("PATH: writing ..."). */
	if (ret && strstr(halite_writer_errmsg(s->w), s->path))
		return sfail(s, ret, "%s", halite_writer_errmsg(s->w));
	if (ret)
		return sfail(s, ret, "finishing %s: %s", s->path, halite_writer_errmsg(s->w));
	{
		struct stat sb;

		if (!stat(s->path, &sb))
			atomic_store(&s->file_bytes, (uint64_t)sb.st_size);
	}
	return 0;
}

void *save_writer_main(void *arg)
{
	struct halite_save *s = arg;
	int ret = 0;

	while (atomic_load(&s->n_saved) < s->mb_total) {
		struct item *it;

		pthread_mutex_lock(&s->q_lock);
		while (!atomic_load(&s->stopping) && !(s->q_head && s->q_head->ready))
			pthread_cond_wait(&s->q_cond, &s->q_lock);
		if (atomic_load(&s->stopping)) {
			pthread_mutex_unlock(&s->q_lock);
			return NULL;
		}
		it = s->q_head;
		s->q_head = it->next;
		if (!s->q_head)
			s->q_tail = NULL;
		pthread_mutex_unlock(&s->q_lock);
		ret = retire(s, it);
		item_free(s, it);
		if (ret) {
			save_set_failed(s, ret);
			return NULL;
		}
	}
	ret = finish_file(s);
	pthread_mutex_lock(&s->st_lock);
	if (ret && s->state == S_RUNNING) {
		s->state = S_FAILED;
		s->error = ret;
	} else if (!ret && s->state == S_RUNNING) {
		s->state = S_DONE;
	}
	s->done_ns = halite_now_ns();
	pthread_cond_broadcast(&s->st_cond);
	pthread_mutex_unlock(&s->st_lock);
	if (ret)
		save_set_failed(s, ret);
	atomic_store(&s->stopping, true);
	return NULL;
}
