/* SPDX-License-Identifier: MIT */
/*
 * The copy-on-access lazy save engine (include/halite/save.h): its
 * lifecycle, from create and arm (threads started) to wait, cancel, the
 * teardown that gives the guest all its memory back, and free.
 *
 * At the snapshot instant (arm.c) guest memory becomes the engine's: each
 * first access traps, and the fault path (fault.c) copies the block aside,
 * gives it back and queues it in the faulting vCPU's stream; a background
 * thread (background.c) saves the rest in the guest's virtual order, then
 * physical; a compression pool and one writer (stream.c) pack each stream
 * into its locality blocks. Each block is claimed, and saved, exactly once;
 * a failed save gives the guest its memory back as it was.
 * docs/architecture.md tells the whole design; each file's first comment,
 * its part.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "export.h"
#include "opts.h"
#include "uffd.h"
#include "writer_test.h"

#include "save_int.h"

HALITE_EXPORT int halite_save_create(struct halite_save **sp, const char *path,
				     const struct halite_save_region *regions, uint32_t nregions,
				     const struct halite_save_opts *opts)
{
	HALITE_OPTS(halite_writer_opts, wo);
	struct halite_region *wr = NULL;
	struct halite_save *s;
	struct item *it;
	uint64_t missing = 0;
	int ret;

	if (!sp || !path || !regions || !nregions)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->uffd = s->stop_fd = s->pagemap_fd = s->owner_pagemap_fd = -1;
	pthread_mutex_init(&s->q_lock, NULL);
	pthread_cond_init(&s->q_cond, NULL);
	pthread_mutex_init(&s->st_lock, NULL);
	halite_cond_init_mono(&s->st_cond);
	pthread_mutex_init(&s->roots_lock, NULL);
	halite_hist_init(&s->fault_hist);
	ret = halite_opts_copy(&s->o, sizeof(s->o), opts);
	if (ret || (s->o.flags & ~HALITE_SAVE_FLAGS_ALL) || (s->o.nvcpus && !s->o.vcpu_tids)) {
		ret = -EINVAL;
		goto err;
	}
	s->log = (struct halite_logger){ s->o.log, s->o.log_ctx, s->o.log_level };
	s->defer_window = HALITE_SAVE_DEFER_WINDOW;
	if (!s->o.bg_idle_us)
		s->o.bg_idle_us = 2000;
	if (!s->o.bg_min_rate)
		s->o.bg_min_rate = 64ull << 20;
	if (s->o.nvcpus) {
		pid_t *t = malloc(s->o.nvcpus * sizeof(*t));

		if (!t) {
			ret = -ENOMEM;
			goto err;
		}
		memcpy(t, s->o.vcpu_tids, s->o.nvcpus * sizeof(*t));
		s->o.vcpu_tids = t;
	}
	s->path = strdup(path);
	s->regions = calloc(nregions, sizeof(*s->regions));
	wr = calloc(nregions, sizeof(*wr));
	if (!s->path || !s->regions || !wr) {
		ret = -ENOMEM;
		goto err;
	}
	for (uint32_t i = 0; i < nregions; i++)
		s->regions[i].fd = -1; /* so that an early failure closes nothing else */
	s->nregions = nregions;
	for (uint32_t i = 0; i < nregions; i++) {
		wr[i] = (struct halite_region){ regions[i].name, regions[i].gpa, regions[i].length };
		s->regions[i].name = strdup(regions[i].name ? regions[i].name : "");
		s->regions[i].gpa = regions[i].gpa;
		s->regions[i].length = regions[i].length;
		s->regions[i].host = regions[i].host;
		s->regions[i].kind = regions[i].kind;
		s->regions[i].fd = -1;
		if (!s->regions[i].name) {
			ret = -ENOMEM;
			goto err;
		}
		if (regions[i].kind == HALITE_MEM_SHARED) {
			s->has_shared = true;
			s->regions[i].fd_off = regions[i].fd_offset;
			s->regions[i].fd = fcntl(regions[i].fd, F_DUPFD_CLOEXEC, 0);
			if (s->regions[i].fd < 0) {
				ret = sfail(s, -errno, "region '%s': fd %d", regions[i].name,
					    regions[i].fd);
				goto err;
			}
		} else if (regions[i].kind == HALITE_MEM_COPY) {
			if (!regions[i].host) {
				ret = sfail(s, -EINVAL, "region '%s': a copy at address 0",
					    regions[i].name);
				goto err;
			}
		} else if (regions[i].kind != HALITE_MEM_ANON) {
			ret = sfail(s, -EINVAL, "region '%s': unknown memory kind", regions[i].name);
			goto err;
		} else if (s->o.owner_pid) {
			s->ext_anon = true;
		}
	}
	s->copy_in = s->has_shared || s->ext_anon;
	if (s->o.owner_pid && (s->o.owner_uffd < 0 || (s->has_shared && !s->o.drop_ptes) ||
			       (s->ext_anon && (!s->o.remap || !s->o.unmap)))) {
		ret = sfail(s, -EINVAL, "another process's memory needs owner_uffd, drop_ptes "
			    "for shared memory, remap and unmap for private memory");
		goto err;
	}
	if (s->ext_anon) {
		char pm[64];

		snprintf(pm, sizeof(pm), "/proc/%d/pagemap", (int)s->o.owner_pid);
		s->owner_pagemap_fd = open(pm, O_RDONLY | O_CLOEXEC);
		if (s->owner_pagemap_fd < 0) {
			ret = sfail(s, -errno, "%s", pm);
			goto err;
		}
	}
	wo.codec = s->o.codec;
	wo.level = s->o.level;
	wo.mb_pages = s->o.mb_pages;
	wo.lb_size = s->o.lb_size;
	wo.vcpu_count = s->o.nvcpus;
	wo.flags = ((s->o.flags & HALITE_SAVE_NO_SYNC) ? HALITE_WRITER_NO_SYNC : 0) |
		   ((s->o.flags & HALITE_SAVE_DIRECT) ? HALITE_WRITER_DIRECT : 0);
	wo.log = s->o.log;
	wo.log_ctx = s->o.log_ctx;
	wo.log_level = s->o.log_level;
	wo.io_backend = s->o.io_backend;
	wo.queue_depth = s->o.queue_depth;
	ret = halite_writer_create(&s->w, path, wr, nregions, &wo);
	if (ret)
		goto err;
	s->mb_size = halite_writer_mb_size(s->w);
	s->codec = s->o.codec ? s->o.codec : HALITE_CODEC_LZ4;
	s->mb_total = halite_writer_mb_count(s->w);
	for (uint32_t i = 0; i < nregions; i++) {
		struct sregion *r = &s->regions[i];

		/* Blocks are given back whole: regions must hold whole blocks. */
		if (r->length % s->mb_size || r->host % 4096) {
			ret = sfail(s, -EINVAL, "region '%s': length %llu not a multiple of the "
				    "memory-block size %u, or host address not page aligned",
				    r->name, (unsigned long long)r->length, s->mb_size);
			goto err;
		}
		r->first_mb = i ? s->regions[i - 1].first_mb + s->regions[i - 1].nmb : 0;
		r->nmb = r->length / s->mb_size;
		if (r->kind == HALITE_MEM_SHARED) {
			ret = save_map_view(s, r);
		} else if (r->kind == HALITE_MEM_COPY) {
			r->shadow = (uint8_t *)(uintptr_t)r->host;
		} else if (s->o.owner_pid) {
			/* Claimed blocks are copied here from the owner's pages moved aside. */
			void *sh = mmap(NULL, r->length, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

			if (sh == MAP_FAILED)
				ret = sfail(s, -errno, "region '%s': a shadow of %llu bytes", r->name,
					    (unsigned long long)r->length);
			else
				r->shadow = sh;
		}
		if (ret)
			goto err;
	}
	if (s->mb_size / 4096 > SAVE_PAGES_MAX) {
		ret = sfail(s, -EINVAL, "memory blocks of more than %u pages", SAVE_PAGES_MAX);
		goto err;
	}
	s->claim = calloc(s->mb_total, 1);
	s->given = calloc(s->mb_total / 64 + 1, sizeof(*s->given));
	s->n_faults_by_vcpu = calloc(s->o.nvcpus ? s->o.nvcpus : 1, sizeof(*s->n_faults_by_vcpu));
	if (!s->claim || !s->given || !s->n_faults_by_vcpu) {
		ret = -ENOMEM;
		goto err;
	}
	ret = save_open_uffd(s, &missing);
	if (ret) {
		char names[128];

		ret = sfail(s, ret, "userfaultfd%s%s", missing ? " lacks " : "",
			    missing ? halite_uffd_feature_names(missing, names, sizeof(names)) : "");
		goto err;
	}
	s->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s->pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	s->max_page = HALITE_MAX(s->max_page, 4096);
	s->huge_claimed = calloc(s->max_page / s->mb_size + 1, sizeof(bool));
	if (s->stop_fd < 0 || s->pagemap_fd < 0 || !s->huge_claimed) {
		ret = sfail(s, -errno, "eventfd or /proc/self/pagemap");
		goto err;
	}
	ret = save_make_gmem(s);
	if (ret)
		goto err;
	for (uint32_t i = 0; i < ITEMS_PREALLOC; i++) {
		it = malloc(item_size(s));
		if (!it) {
			ret = -ENOMEM;
			goto err;
		}
		it->next = s->free_items;
		s->free_items = it;
		s->nfree++;
	}
	ret = halite_pool_create(&s->pool, s->o.workers, "halite-save");
	if (ret)
		goto err;
	free(wr);
	*sp = s;
	return 0;
err:
	free(wr);
	halite_save_free(s);
	return ret;
}

HALITE_EXPORT int halite_save_add_root(struct halite_save *s, const struct halite_root *root)
{
	int ret = 0;

	if (root->mode != HALITE_PAGING_4LEVEL && root->mode != HALITE_PAGING_5LEVEL)
		return -EINVAL;
	if (root->vcpu >= s->o.nvcpus && root->vcpu != HALITE_VCPU_UNKNOWN)
		return -EINVAL;
	pthread_mutex_lock(&s->roots_lock);
	for (uint32_t i = 0; i < s->nroots; i++)
		if (s->roots[i].cr3 == root->cr3 && s->roots[i].vcpu == root->vcpu)
			goto out; /* seen before: sampling repeats itself */
	if (s->nroots == s->roots_cap) {
		uint32_t cap = s->roots_cap ? 2 * s->roots_cap : 16;
		void *p = realloc(s->roots, cap * sizeof(*s->roots));

		if (!p) {
			ret = -ENOMEM;
			goto out;
		}
		s->roots = p;
		s->roots_cap = cap;
	}
	s->roots[s->nroots++] = *root;
out:
	pthread_mutex_unlock(&s->roots_lock);
	return ret;
}

HALITE_EXPORT int halite_save_set_device_state(struct halite_save *s, const void *data,
					       uint64_t len)
{
	if (s->state != S_CREATED)
		return -HALITE_E_STATE;
	return halite_writer_set_device_state(s->w, data, len);
}

HALITE_EXPORT int halite_save_set_meta(struct halite_save *s, const char *key, const void *value,
				       uint32_t len)
{
	if (s->state != S_CREATED)
		return -HALITE_E_STATE;
	return halite_writer_set_meta(s->w, key, value, len);
}

HALITE_EXPORT int halite_save_arm(struct halite_save *s)
{
	int ret = 0;
	uint32_t i;

	if (s->state != S_CREATED)
		return -HALITE_E_STATE;
	s->arm_start_ns = halite_now_ns();
	/*
	 * The fault thread first: dropping the owner's page-table entries of a
	 * registered range raises a REMOVE event, and the madvise waits until
	 * someone reads it.
	 */
	ret = pthread_create(&s->fault_thr, NULL, save_fault_main, s);
	if (ret)
		return sfail(s, -ret, "starting the fault thread");
	for (i = 0; i < s->nregions && !ret; i++)
		ret = save_arm_region(s, &s->regions[i]);
	if (!ret) {
		atomic_store(&s->last_fault_ns, halite_now_ns());
		s->state = S_RUNNING;
		ret = -pthread_create(&s->writer_thr, NULL, save_writer_main, s);
		if (ret) {
			s->state = S_CREATED;
			sfail(s, ret, "starting threads");
		}
	}
	atomic_store(&s->arm_over, true);
	if (ret) {
		/* Nothing was given to the guest yet: the pages go straight back. */
		save_disarm_regions(s, i);
		eventfd_write(s->stop_fd, 2);
		pthread_join(s->fault_thr, NULL);
		return ret;
	}
	s->threads_started = true;
	/* No background thread to save the copies: they are saved here (tests). */
	if ((s->o.flags & HALITE_SAVE_NO_BACKGROUND) && (ret = save_copies(s))) {
		save_set_failed(s, ret);
		return halite_save_wait(s, -1);
	}
	if (!(s->o.flags & HALITE_SAVE_NO_BACKGROUND)) {
		ret = pthread_create(&s->bg_thr, NULL, save_bg_main, s);
		if (ret) {
			save_set_failed(s, sfail(s, -ret, "starting the background thread"));
			return halite_save_wait(s, -1);
		}
		s->bg_started = true;
	}
	/*
	 * All of it, thread starts included: the guest stands still until this
	 * returns. Under st_lock: the threads may already read stats.
	 */
	pthread_mutex_lock(&s->st_lock);
	s->arm_ns = halite_now_ns() - s->arm_start_ns;
	pthread_mutex_unlock(&s->st_lock);
	return 0;
}

/*
 * Another process's private memory, at the end: block @mb's snapshot bytes
 * into our shadow, from the pages moved aside, unless someone has (claimed
 * it). 0 or -errno.
 */
static int ensure_local(struct halite_save *s, const struct sregion *r, uint64_t mb)
{
	int t;

	if (!r->aside)
		return 0;
	if (!claim_block(s, mb)) {
		wait_ready(s, mb);
		return 0;
	}
	t = save_block_touched(s, r, mb);
	return t < 0 ? t : save_copy_claimed(s, r, mb, 1, t);
}

/*
 * The end, success or failure: make every block the guest's again, then drop
 * the registration and the shadows. On failure the file is left incomplete.
 */
static int teardown(struct halite_save *s)
{
	int ret = 0, e;

	if (!s->threads_started)
		return 0;
	atomic_store(&s->stopping, true);
	pthread_mutex_lock(&s->q_lock);
	pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->q_lock);
	if (s->bg_started)
		pthread_join(s->bg_thr, NULL);
	s->bg_started = false;
	pthread_join(s->writer_thr, NULL);
	/*
	 * Every block that has snapshot bytes in the shadow and is not yet the
	 * guest's goes back now, claimed or not: after a failure this is what
	 * leaves the guest's memory exactly as without the save. The fault
	 * thread keeps serving meanwhile.
	 */
	for (uint32_t i = 0; i < s->nregions; i++) {
		struct sregion *r = &s->regions[i];

		/* Shared memory never left the page cache: nothing to give back. */
		for (uint64_t mb = r->first_mb; r->kind == HALITE_MEM_ANON &&
						mb < r->first_mb + r->nmb && r->shadow; mb++) {
			int t = given_back(s, mb) ? 0 : ensure_local(s, r, mb);
			int g;

			if (!t && !given_back(s, mb))
				t = save_block_touched(s, r, mb);
			g = t > 0 ? save_give_back(s, r, mb, 0) : t;

			if (g && !ret)
				ret = sfail(s, g, "giving memory block %llu back at teardown",
					    (unsigned long long)mb);
		}
	}
	/* Where the memory is now (moves included); unregistering wakes its waiters. */
	e = halite_gmem_unregister(s->gm);
	if (e && !ret)
		ret = sfail(s, e, "UFFDIO_UNREGISTER");
	for (uint32_t i = 0; i < s->nregions; i++)
		s->regions[i].registered = false;
	save_allow_discards(s);
	eventfd_write(s->stop_fd, 2);
	pthread_join(s->fault_thr, NULL);
	/* Every block is the guest's again: the owner's pages moved aside can go. */
	for (uint32_t i = 0; i < s->nregions; i++) {
		struct sregion *r = &s->regions[i];

		if (r->aside && !ret) {
			e = s->o.unmap(s->o.drop_ctx, r->aside, r->length);
			if (e)
				ret = sfail(s, e, "region '%s': unmapping the pages moved aside in "
					    "process %d", r->name, (int)s->o.owner_pid);
			else
				r->aside = 0;
		}
	}
	/* Only now has the last task been queued: tasks read the shadows. */
	halite_pool_wait(s->pool);
	for (uint32_t i = 0; i < s->nregions; i++) {
		if (s->regions[i].shadow && s->regions[i].kind != HALITE_MEM_COPY)
			munmap(s->regions[i].shadow, s->regions[i].length);
		s->regions[i].shadow = NULL;
	}
	s->threads_started = false;
	return ret;
}

HALITE_EXPORT int halite_save_wait(struct halite_save *s, int timeout_ms)
{
	struct timespec dl;
	int ret = 0, state;

	if (timeout_ms >= 0)
		halite_deadline(&dl, (uint64_t)timeout_ms * 1000000);
	pthread_mutex_lock(&s->st_lock);
	if (s->state == S_CREATED) {
		pthread_mutex_unlock(&s->st_lock);
		return -HALITE_E_STATE;
	}
	while (s->state == S_RUNNING && ret != ETIMEDOUT)
		ret = timeout_ms < 0 ? pthread_cond_wait(&s->st_cond, &s->st_lock)
				     : pthread_cond_timedwait(&s->st_cond, &s->st_lock, &dl);
	state = s->state;
	pthread_mutex_unlock(&s->st_lock);
	if (state == S_RUNNING)
		return -ETIMEDOUT;
	ret = teardown(s);
	if (state == S_FAILED)
		return s->error;
	return ret;
}

HALITE_EXPORT int halite_save_cancel(struct halite_save *s)
{
	if (s->state == S_CREATED)
		return -HALITE_E_STATE;
	save_set_failed(s, sfail(s, -ECANCELED, "save cancelled"));
	return halite_save_wait(s, -1);
}

HALITE_EXPORT void halite_save_free(struct halite_save *s)
{
	struct item *it;

	if (!s)
		return;
	if (s->threads_started) {
		if (s->state == S_RUNNING)
			save_set_failed(s, sfail(s, -ECANCELED, "save freed while running"));
		teardown(s);
	}
	halite_pool_free(s->pool);
	while ((it = s->q_head)) {
		s->q_head = it->next;
		free(it);
	}
	while ((it = s->free_items)) {
		s->free_items = it->next;
		free(it);
	}
	if (s->w)
		halite_writer_free(s->w, s->state != S_DONE &&
					 !(s->o.flags & HALITE_SAVE_KEEP_INCOMPLETE));
	if (s->regions)
		save_allow_discards(s);
	for (uint32_t i = 0; s->regions && i < s->nregions; i++) {
		struct sregion *r = &s->regions[i];

		free(r->had_data);
		if (r->view)
			munmap(r->view, r->length);
		if (r->shadow && r->kind != HALITE_MEM_COPY)
			munmap(r->shadow, r->length);
		if (r->fd >= 0)
			close(r->fd);
		free(r->name);
	}
	halite_gmem_free(s->gm);
	free(s->huge_claimed);
	if (s->uffd >= 0)
		close(s->uffd);
	if (s->stop_fd >= 0)
		close(s->stop_fd);
	if (s->pagemap_fd >= 0)
		close(s->pagemap_fd);
	if (s->owner_pagemap_fd >= 0)
		close(s->owner_pagemap_fd);
	free((void *)s->o.vcpu_tids);
	free(s->regions);
	free((void *)s->claim);
	free((void *)s->given);
	free((void *)s->n_faults_by_vcpu);
	free(s->roots);
	free(s->path);
	pthread_mutex_destroy(&s->q_lock);
	pthread_cond_destroy(&s->q_cond);
	pthread_mutex_destroy(&s->st_lock);
	pthread_cond_destroy(&s->st_cond);
	pthread_mutex_destroy(&s->roots_lock);
	free(s);
}

void halite_save_test_fail_writes(struct halite_save *s, uint64_t after, int err)
{
	halite_writer_test_fail_writes(s->w, after, err);
}

void halite_save_test_fail_check(struct halite_save *s, uint64_t after)
{
	atomic_store(&s->test_check_after, after + 1);
}

void halite_save_test_defer_window(struct halite_save *s, uint32_t window)
{
	s->defer_window = window;
}

void halite_save_test_hold_deferred(struct halite_save *s, bool hold)
{
	atomic_store(&s->test_hold_deferred, hold);
}

bool halite_save_test_deferred_held(struct halite_save *s)
{
	return atomic_load(&s->deferred_held);
}

void halite_save_test_no_discard_refusal(struct halite_save *s)
{
	s->test_no_refusal = true;
}
